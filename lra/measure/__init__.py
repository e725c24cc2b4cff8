"""Measuring models beyond one run: lra-bench, the attention contract check, lra-smoke."""
