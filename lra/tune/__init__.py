"""``lra-tune`` (issue 39): each model's hyperparameters searched with the same budget, on the
validation split only, in an Optuna study shared by parallel workers and SLURM jobs; then the
best setting trained with final seeds that test once. :mod:`lra.tune.main` is the command."""
