"""Per-task data: generate or prepare, then load; one batch pipeline."""
