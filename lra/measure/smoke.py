"""``lra-smoke``: every chosen model on every chosen tiny task for a few steps, as a table.

The check a harness user's CI runs (and ours does): each (model, task) trains ``steps`` steps
through :func:`lra.train.loop.train_and_evaluate` (a fresh run folder under ``results_dir``) and
must keep a finite training loss; on ``listops_tiny`` the model trains ``learn_steps`` steps
instead and its test accuracy must beat the majority class. Model and task names are found on
Hydra's search path, so a model YAML in a user's ``--config-dir`` takes part like a built-in.
With ``pretrain_rows=masked`` (the default; or ``causal``) each task also gets one self-pretraining
row, ``<first model>+spt``: both stages of :mod:`lra.train.pretrain` at ``steps`` steps each
(a finite loss is its check); ``pretrain_rows=none`` leaves these rows out.

``budget=default`` trains each pair at the default job's budget instead (the trainer's own
steps, warm-up and evaluation; an interrupted run resumes and a finished one is reported
done, so rerunning the command finishes a sweep) and tabulates what compares models: test and
validation accuracy, the majority class, train steps/s and parameters, best first::

    lra-smoke budget=default 'tasks=[listops_tiny]' results_dir=results/cpu-tiny/listops_tiny_models
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from hydra import compose
from hydra.core.global_hydra import GlobalHydra

from lra.atomic import write_atomic
from lra.data.tasks import prepare_task, resolve_data_dir
from lra.errors import ConfigError, LRAError
from lra.record import store
from lra.train.loop import train_and_evaluate

log = logging.getLogger("lra.measure.smoke")

LEARN_TASK = "listops_tiny"


@dataclass
class Row:
    model: str
    task: str
    steps: int
    loss: float | None = None
    accuracy: float | None = None
    majority: float | None = None
    seconds: float = 0.0
    error: str | None = None
    checks_learning: bool = False
    val_accuracy: float | None = None
    steps_per_sec: float | None = None
    params: int | None = None

    @property
    def problem(self) -> str | None:
        """Why this row fails, or None."""
        if self.error:
            return self.error
        if self.loss is None or not math.isfinite(self.loss):
            return f"training loss {self.loss}"
        if self.checks_learning and not self.accuracy > self.majority:
            return f"test accuracy {self.accuracy:.4f} <= majority class {self.majority:.4f}"
        return None

    def cells(self) -> list[str]:
        def number(v):
            return "-" if v is None else f"{v:.4f}"

        verdict = "ok" if self.problem is None else f"FAIL: {self.problem}"
        if self.problem is None and self.checks_learning:
            verdict = "ok (beats majority)"
        return [
            self.model,
            self.task,
            str(self.steps),
            number(self.loss),
            number(self.accuracy),
            number(self.majority),
            f"{self.seconds:.0f}",
            verdict,
        ]

    def budget_cells(self) -> list[str]:
        """The cells of the ``budget=default`` table."""

        def number(v, form=".4f"):
            return "-" if v is None else format(v, form)

        verdict = self.cells()[-1]
        return [
            self.model,
            self.task,
            str(self.steps),
            number(self.accuracy),
            number(self.val_accuracy),
            number(self.majority),
            number(self.steps_per_sec, ".1f"),
            number(self.params, ","),
            verdict,
        ]


def table(rows: list[Row]) -> str:
    head = ["model", "task", "steps", "last train loss", "test acc", "majority", "s", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def budget_table(rows: list[Row]) -> str:
    """The ``budget=default`` table: per task, best test accuracy first."""
    head = ["model", "task", "steps", "test accuracy", "val accuracy", "majority class"]
    head += ["train steps/s", "params", "check"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 3) + "---|"]
    ranked = sorted(rows, key=lambda r: (r.task, -(r.accuracy if r.accuracy is not None else -1)))
    lines += ["| " + " | ".join(r.budget_cells()) + " |" for r in ranked]
    return (
        "Each model at the default job's budget: tiny-task numbers, a check that each model "
        "learns, not LRA scores.\n\n" + "\n".join(lines) + "\n"
    )


def _options(group: str) -> list[str]:
    return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def _choose(given, group: str, default: list[str], what: str) -> list[str]:
    known = _options(group)
    chosen = list(default if given is None else ([given] if isinstance(given, str) else given))
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise ConfigError(
            f"lra-smoke: unknown {what} {unknown or chosen}; available: {', '.join(known)} "
            "(a config of your own: add its folder with --config-dir)"
        )
    return chosen


def _train_config(cfg, model: str, task: str, steps: int | None, spt: str | None = None):
    """The run's config: ``steps`` steps from scratch, or (None) the default job's budget;
    with ``spt`` (masked or causal) self-pretrained first, on the same budget."""
    overrides = [f"pretrain={spt}"] if spt else []
    if spt and steps is not None:
        overrides += [f"pretrain.num_steps={steps}", f"pretrain.warmup_steps={max(1, steps // 10)}"]
    overrides += [
        f"model={model}",
        f"task={task}",
        f"seed={cfg.seed}",
        f"results_dir={cfg.results_dir}",
        "trainer.progress=false",
    ]
    if steps is not None:
        overrides += [
            f"trainer.num_steps={steps}",
            f"trainer.warmup_steps={max(1, steps // 10)}",
            f"trainer.eval_every={steps}",
            f"trainer.log_every={steps}",
            "trainer.resume=never",
            "trainer.skip_done=false",
        ]
    overrides += list(cfg.overrides)
    if cfg.data_dir is not None:
        overrides.append(f"data_dir={cfg.data_dir}")
    return compose(config_name="config", overrides=overrides)


def _run(cfg, model: str, task: str, spt: str | None = None) -> Row:
    full = cfg.budget == "default"
    learns = task == LEARN_TASK and (full or int(cfg.learn_steps) > 0) and not spt
    steps = None if full else int(cfg.learn_steps) if learns else int(cfg.steps)
    name = model if not spt else f"{model}+spt" if spt == "masked" else f"{model}+spt-{spt}"
    row = Row(name, task, steps or 0, checks_learning=learns)
    start = time.perf_counter()
    try:
        train_cfg = _train_config(cfg, model, task, steps, spt)
        row.steps = int(train_cfg.trainer.num_steps)
        record = train_and_evaluate(train_cfg)
        row.loss = record["history"][-1]["train_loss"] if record["history"] else None
        row.accuracy = record["test_accuracy"]
        row.majority = record["test_majority_rate"]
        row.val_accuracy = record["val_accuracy"]
        row.steps_per_sec = record["train_steps_per_sec"]
        row.params = record["num_params"]
    except Exception as err:  # one broken model is a row, not the end of the smoke run
        if not isinstance(err, LRAError):
            log.exception(f"{model} on {task} raised")
        row.error = f"{type(err).__name__}: {err}".splitlines()[0][:200]
    row.seconds = time.perf_counter() - start
    log.info(f"{model} on {task}: {row.cells()[-1]}")
    return row


def run_smoke(cfg) -> list[Row]:
    """Train every chosen (model, task) pair; write and return the table's rows."""
    if int(cfg.steps) < 1 or int(cfg.learn_steps) < 0:
        raise ConfigError(
            f"lra-smoke: steps must be >= 1 and learn_steps >= 0, got {cfg.steps}, "
            f"{cfg.learn_steps}"
        )
    model_names = _choose(cfg.models, "model", _options("model"), "model(s)")
    tiny = [t for t in _options("task") if t.endswith("_tiny")]
    task_names = _choose(cfg.tasks, "task", tiny, "task(s)")
    data_dir = resolve_data_dir(cfg.data_dir)
    for task in task_names:  # a no-op for data that is ready
        task_cfg = compose(config_name="config", overrides=[f"task={task}", *cfg.overrides]).task
        prepare_task(task_cfg, data_dir)
    rows = [_run(cfg, model, task) for task in task_names for model in model_names]
    if cfg.pretrain_rows != "none":  # one self-pretraining row per task: the first model's
        rows += [_run(cfg, model_names[0], task, cfg.pretrain_rows) for task in task_names]
    text = budget_table(rows) if cfg.budget == "default" else table(rows)
    store.ensure_writable(cfg.results_dir)
    write_atomic(cfg.table, text)
    print(text, flush=True)
    failed = sum(r.problem is not None for r in rows)
    print(f"{len(rows) - failed} of {len(rows)} passed; table in {cfg.table}", flush=True)
    return rows
