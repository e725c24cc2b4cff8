"""The harness's Hydra configs (package data): model/, task/, trainer/, protocol*/, logger/,
hydra/, experiment/. Composed through :mod:`lra.config.compose`."""
