"""Where the harness's Hydra configs live, and composing one outside a running app.

The YAML tree is package data (``lra.configs``, from ``configs/`` in the checkout), so an
editable checkout, ``pip install .`` and a wheel all find it through the package.
"""

from importlib.resources import files

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

#: The Hydra config folder every entry point composes from.
CONFIG_DIR = str(files("lra.configs"))


def compose_config(config_name: str, overrides: list[str], return_hydra_config: bool = False):
    """Hydra's composed ``config_name`` with ``overrides``, inside a running app (its search
    path, e.g. ``--config-dir``) or, outside one, from the harness's configs; with
    ``return_hydra_config``, the ``hydra`` node too (an experiment's ``hydra.sweeper.params``)."""
    options = {"return_hydra_config": return_hydra_config}
    if GlobalHydra.instance().is_initialized():
        return compose(config_name=config_name, overrides=overrides, **options)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, **options)
