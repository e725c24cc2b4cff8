"""An ``lra-tune`` study: its storage, its name, its sampler and pruner, and its budget.

Storage (``tune.storage``): by default Optuna's journal file
``<results_dir>/tune/<study>.journal`` (:class:`optuna.storages.JournalStorage` over a
:class:`~optuna.storages.journal.JournalFileBackend`: one machine, or SLURM jobs on a shared file
system, no server); a path names another journal file; a URL (``sqlite:///...``,
``postgresql://...``) is an :class:`optuna.storages.RDBStorage`.

Name (``tune.study``): by default ``<model>-<task>-<protocol>-<hash>``, the hash of the run
identity less the searched keys and the seed (:func:`lra.config.identity.result_config`), the
search space's hash, the budget, the sampler, the pruner and the sampler's seed: model x task x
protocol x search space x budget name one study.

Budget: ``tune.n_trials`` trials in all, whatever the number of workers. A worker asks Optuna
for a trial, claims it (an ``fcntl`` lock on ``<study>.claims/<number>.lock`` beside the
journal, held while it trains, dropped by the kernel however the worker dies), then checks the
trial's place among the trials that count (:func:`counted`): beyond ``n_trials`` it is told
``FAIL`` with the user attribute ``over_budget`` and never trained, and counts nowhere. A trial
whose worker died stays ``RUNNING`` with a free claim (:func:`orphans`): the next worker takes it
over and resumes its run folder, so nothing is trained twice and the budget is kept.
"""

import fcntl
import hashlib
import json
import os
import socket
from pathlib import Path

from omegaconf import OmegaConf

from lra.config.identity import result_config
from lra.errors import ConfigError
from lra.run.lock import try_flock

#: User attributes of a trial: the values it trains with, its run folder, who claimed it.
OVERRIDES, RUN_DIR, WORKER, OVER_BUDGET = "overrides", "run_dir", "worker", "over_budget"


def optuna():
    """Optuna, or one line naming the extra that installs it."""
    try:
        import optuna as module
    except ImportError:
        raise ConfigError(
            "lra-tune needs Optuna: pip install 'lra-harness[tune]' (or pip install optuna)"
        ) from None
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def tune_dir(cfg) -> Path:
    return Path(str(cfg.results_dir)).expanduser() / "tune"


def _drop(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.get(part) if isinstance(tree, dict) else None
        if tree is None:
            return
    if isinstance(tree, dict):
        tree.pop(leaf, None)


def study_name(cfg, base: dict, space, space_digest: str) -> str:
    """``tune.study``, or ``<model>-<task>-<protocol>-<hash>`` of what the study compares."""
    if cfg.tune.study:
        return str(cfg.tune.study)
    identity = result_config(base)
    for key in space.searched_keys:
        _drop(identity, key)
    tune = cfg.tune
    payload = {
        "identity": identity,
        "search": space_digest,
        "n_trials": int(tune.n_trials),
        "sampler": str(tune.sampler),
        "pruner": str(tune.pruner),
        **pruning_settings(tune),
        "seed": int(tune.seed),
        "trial_seed": base["seed"],
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode())
    protocol = base.get("protocol") or "lra_official"
    return f"{base['model']['name']}-{base['task']['name']}-{protocol}-{digest.hexdigest()[:10]}"


def storage_spec(cfg, name: str) -> str:
    """What ``tune.storage`` names: a URL, or the journal file's path."""
    if cfg.tune.storage:
        spec = str(cfg.tune.storage)
        return spec if "://" in spec else str(Path(spec).expanduser().resolve())
    return str((tune_dir(cfg) / f"{name}.journal").resolve())


def open_storage(spec: str):
    """The Optuna storage of ``spec``, or one line saying why it cannot be opened."""
    optuna_ = optuna()
    try:
        if "://" in spec:
            return optuna_.storages.RDBStorage(spec)
        path = Path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        return optuna_.storages.JournalStorage(JournalFileBackend(str(path)))
    except ImportError as err:  # a database URL whose driver is not installed
        raise ConfigError(
            f"tune.storage={spec}: cannot open it: {err}; install the database's driver "
            "(e.g. pip install 'psycopg[binary]' for postgresql://)"
        ) from None
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's and the OS's errors alike
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"tune.storage={spec}: cannot open it ({type(err).__name__}: {first}); give a "
            "writable journal file path or a database URL Optuna accepts "
            "(sqlite:///path.db, postgresql://user@host/db)"
        ) from None


def make_sampler(cfg, space, offset: int):
    """The sampler of one trial: seeded with ``tune.seed + offset`` (the trial's number), so a
    random search suggests the same values however many workers share it. The grid sampler keeps
    ``tune.seed``: its seed shuffles the grid, and trial k takes the k-th point of that order."""
    optuna_ = optuna()
    seed = int(cfg.tune.seed) + offset
    kind = str(cfg.tune.sampler)
    if kind == "tpe":
        return optuna_.samplers.TPESampler(seed=seed)
    if kind == "random":
        return optuna_.samplers.RandomSampler(seed=seed)
    from lra.tune.search import grid

    class AskAndTellGrid(optuna_.samplers.GridSampler):
        """Optuna's grid sampler less its ``study.stop()`` once the grid is spent, which raises
        outside ``study.optimize`` (at the last point's ``tell``): the budget ends the search."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskAndTellGrid(grid(space), seed=int(cfg.tune.seed))


def make_pruner(cfg, num_steps: int, eval_every: int):
    optuna_ = optuna()
    kind = str(cfg.tune.pruner)
    if kind == "none":
        return optuna_.pruners.NopPruner()
    warmup = round(float(cfg.tune.prune_warmup) * num_steps)  # steps before any pruning
    if kind == "median":
        # Below the median of the finished trials at the same step, once there are enough.
        return optuna_.pruners.MedianPruner(
            n_startup_trials=int(cfg.tune.prune_startup_trials), n_warmup_steps=warmup
        )
    return optuna_.pruners.HyperbandPruner(
        min_resource=max(eval_every, warmup), max_resource=num_steps, reduction_factor=3
    )


def load(cfg, storage, name: str, space, base: dict):
    """The study ``name`` in ``storage`` (created with its settings as user attributes); one
    line if an existing study of that name disagrees. Its trials are read from the storage at
    every look, so one object serves a worker's whole life; :func:`reseed` after each ask."""
    optuna_ = optuna()
    trainer = base["trainer"]
    study = optuna_.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        load_if_exists=True,
        sampler=make_sampler(cfg, space, 0),
        pruner=make_pruner(cfg, int(trainer["num_steps"]), int(trainer["eval_every"])),
    )
    settings = study_settings(cfg, space)
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", settings)
    elif stored != settings:
        differs = sorted(k for k in settings if stored.get(k) != settings[k])
        raise ConfigError(
            f"tune.study={name}: the study in its storage was made with other settings "
            f"({', '.join(differs)}: {[stored.get(k) for k in differs]}); name another study "
            "with tune.study=..., or leave tune.study unset"
        )
    return study


def reseed(study, cfg, space, number: int) -> None:
    """Give ``study`` the sampler of trial ``number``'s values (:func:`make_sampler` at offset
    ``number``), between its ask and its suggestions: trial numbers are unique, so two workers
    asking at the same moment draw with two seeds."""
    study.sampler = make_sampler(cfg, space, number)


def pruning_settings(tune) -> dict:
    """The pruner's settings (none when ``tune.pruner=none``), in the study's name and settings."""
    if str(tune.pruner) == "none":
        return {}
    out = {"prune_warmup": float(tune.prune_warmup)}
    if str(tune.pruner) == "median":
        out["prune_startup_trials"] = int(tune.prune_startup_trials)
    return out


def study_settings(cfg, space) -> dict:
    from lra.tune.search import space_hash

    tune = OmegaConf.to_container(cfg.tune, resolve=True)
    return {
        "n_trials": int(tune["n_trials"]),
        "sampler": tune["sampler"],
        "pruner": tune["pruner"],
        **pruning_settings(cfg.tune),
        "seed": int(tune["seed"]),
        "search_hash": space_hash(space),
    }


def counted(study) -> list:
    """The trials that spend the budget, by number: every trial but the over-budget ones."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(OVER_BUDGET)]


def counts(study) -> dict:
    """``completed``, ``pruned``, ``failed`` and ``running`` trials of the budget."""
    states = [t.state.name for t in counted(study)]
    return {
        "completed": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "failed": states.count("FAIL"),
        "running": states.count("RUNNING") + states.count("WAITING"),
    }


def within_budget(study, number: int, n_trials: int) -> bool:
    """Whether trial ``number`` is one of the first ``n_trials`` trials that count."""
    numbers = sorted(t.number for t in counted(study))
    return number in numbers[:n_trials]


class Claim:
    """``<claims>/<number>.lock``: held by the worker that trains trial ``number``."""

    def __init__(self, folder: Path, number: int):
        self.path = Path(folder) / f"{number}.lock"
        self._fd: int | None = None

    def take(self) -> bool:
        """Take the claim if nobody holds it (non-blocking)."""
        self._fd = try_flock(self.path)
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def orphans(study, claims: Path) -> list:
    """``RUNNING`` trials a worker claimed and whose claim is free: their worker is gone."""
    found = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name != "RUNNING" or WORKER not in trial.user_attrs:
            continue
        probe = Claim(claims, trial.number)
        if probe.take():
            probe.release()
            found.append(trial)
    return found


def best(study):
    """The best completed trial, or None."""
    done = [t for t in counted(study) if t.state.name == "COMPLETE" and t.value is not None]
    return max(done, key=lambda t: (t.value, -t.number)) if done else None


def best_so_far(study) -> list[dict]:
    """``[{"trial", "value", "best"}]`` in trial order: the equal-budget curve of the study."""
    out, top = [], None
    for trial in sorted(counted(study), key=lambda t: t.number):
        value = trial.value if trial.state.name == "COMPLETE" else None
        if value is not None and (top is None or value > top):
            top = value
        out.append({"trial": trial.number, "state": trial.state.name, "value": value, "best": top})
    return out
