"""lra-report: records in, leaderboard, efficiency tables, Figure 1 and curves out. Reads JSON
only: nothing here imports JAX."""
