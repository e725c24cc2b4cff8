"""A sweep's cells: the jobs ``lra-train -m <overrides>`` would run, grouped by everything but
the seed.

Hydra's basic sweeper expands a multirun from the experiment's ``hydra.sweeper.params`` followed
by the command line (a command-line value wins for the same key) into the product of every
swept key's values. :func:`sweep_jobs` does the same with Hydra's own parser and product
(``BasicSweeper.split_arguments``), so ``lra-plan`` plans exactly the jobs ``lra-train -m``
runs: lists (``model=a,b``), ranges (``seed=range(3)``), experiment files (``experiment=figure1``)
and any other group or key. :func:`group_cells` then merges the jobs that differ only in
``seed``: the seed changes no shape, step or setting, so it does not change the cost; a cell
counts its seeds and is measured once.
"""

from dataclasses import dataclass, field

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lra.config.compose import compose_config
from lra.errors import ConfigError


def _parsed(overrides: list[str]):
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception as err:  # Hydra's grammar errors (OverrideParseException and others)
        raise ConfigError(f"cannot read the sweep's overrides {overrides}: {err}") from err


def experiment_params(overrides: list[str]) -> list[str]:
    """The ``hydra.sweeper.params`` of the config the command's fixed overrides compose
    (an experiment file's sweep), as ``key=values`` strings."""
    fixed = [
        o.input_line
        for o in _parsed(overrides)
        if not o.is_sweep_override() and not o.get_key_element().startswith("hydra/")
    ]  # a launcher (hydra/launcher=slurm) changes how jobs run, not which
    cfg = compose_config("config", fixed, return_hydra_config=True)
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    return [f"{key}={value}" for key, value in params.items()]


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of every job ``lra-train -m <overrides>`` runs, in Hydra's order, less
    Hydra's own settings (``hydra/launcher=slurm``, ``hydra.sweep.dir=...``: how the jobs are
    launched, not what they run)."""
    parsed = _parsed([*experiment_params(overrides), *overrides])
    try:
        (batch,) = BasicSweeper.split_arguments(parsed, None)
    except Exception as err:  # e.g. an interval sweep, which the basic sweeper cannot expand
        raise ConfigError(f"cannot expand the sweep {overrides}: {err}") from err
    return [[o for o in job if not _key(o).startswith("hydra")] for job in batch]


#: Keys that say where a run reads and writes or how it shows progress, not what it costs:
#: left out of a cell's name (kept in its overrides).
LOCATION_KEYS = ("results_dir", "data_dir", "trainer.progress", "num_workers")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


@dataclass
class Cell:
    """One sweep cell: the overrides less ``seed``, and the seeds the sweep runs it with."""

    overrides: list[str]
    seeds: list[int | str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The overrides that make the cell, less where it reads and writes
        (``model=transformer task=text``)."""
        shown = [o for o in self.overrides if _key(o) not in LOCATION_KEYS]
        return " ".join(shown) or "(defaults)"


def group_cells(jobs: list[list[str]]) -> list[Cell]:
    """Jobs that differ only in ``seed`` as one cell each, in the order of their first job."""
    cells: dict[tuple[str, ...], Cell] = {}
    for job in jobs:
        kept = [o for o in job if _key(o) != "seed"]
        seeds = [o.split("=", 1)[1] for o in job if _key(o) == "seed"]
        seed = seeds[-1] if seeds else "default"
        cell = cells.setdefault(tuple(kept), Cell(kept))
        cell.seeds.append(int(seed) if seed.lstrip("-").isdigit() else seed)
    return list(cells.values())
