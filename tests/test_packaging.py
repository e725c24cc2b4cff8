"""The package installs as one import package, ``lra``, with its networks (``models/`` ->
``lra.models``) and its Hydra YAML (``configs/`` -> ``lra.configs``) inside it.

``.ci/run`` builds the wheel, installs it (not editable) into a fresh virtualenv and runs
``lra-data``, ``lra-train``, ``lra-report`` and ``lint-imports`` from an empty folder; these
tests hold the pieces of that which can be checked without building: the package list names
every package folder, the package data covers every config file, and the configs are found
through the package.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

import lra.configs
import lra.models
from lra.config.compose import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _packages_on_disk() -> set[str]:
    """Every folder with an ``__init__.py`` or a YAML file, by the import name it installs under.

    A folder of YAML alone is a namespace package to Python; setuptools ships it only when
    ``packages`` names it (and warns at build time about each one it does not name).
    """
    roots = {"lra": ROOT / "lra", **{k: ROOT / v for k, v in SETUPTOOLS["package-dir"].items()}}
    found = set()
    for name, folder in roots.items():
        for marker in [*folder.rglob("__init__.py"), *folder.rglob("*.yaml")]:
            if "__pycache__" in marker.parts:
                continue
            rel = marker.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    return found


def test_package_list_names_every_package_folder():
    assert set(SETUPTOOLS["packages"]) == _packages_on_disk()


def test_nothing_but_lra_is_installed_at_the_top_level():
    assert {p.split(".")[0] for p in SETUPTOOLS["packages"]} == {"lra"}
    assert SETUPTOOLS["package-dir"] == {"lra.models": "models", "lra.configs": "configs"}


def test_package_data_covers_every_config_file():
    files = [
        p for p in (ROOT / "configs").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    not_yaml = [p for p in files if p.suffix != ".yaml" and p.name != "__init__.py"]
    assert not not_yaml, f"config files the wheel would leave out: {not_yaml}"
    assert SETUPTOOLS["package-data"] == {"*": ["*.yaml"]}


def test_published_results_are_package_data():
    assert "lra.report.published_data" in SETUPTOOLS["packages"]
    assert list((ROOT / "lra" / "report" / "published_data").glob("*.yaml"))


def test_configs_and_models_are_found_through_the_package():
    assert Path(CONFIG_DIR) == Path(lra.configs.__file__).parent
    assert (Path(CONFIG_DIR) / "config.yaml").is_file()
    assert Path(lra.models.__file__).parent == ROOT / "models" or "site-packages" in str(
        lra.models.__file__
    )


def test_no_top_level_models_package_outside_the_checkout(tmp_path):
    code = "import importlib.util, sys; print(importlib.util.find_spec('models'))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_console_scripts_compose_their_config_from_any_folder(tmp_path):
    """``lra-train --cfg job`` (composes config.yaml with its groups) from an empty folder."""
    lra_train = Path(sys.executable).parent / "lra-train"
    out = subprocess.run(
        [str(lra_train), "--cfg", "job", "model=performer", "task=text_tiny"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "name: performer" in out.stdout and "name: text_tiny" in out.stdout
