"""What the backend measures, one way everywhere: compiled memory and FLOPs, device peak,
timing windows, machine load, the compilation cache."""
