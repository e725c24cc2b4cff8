"""Typed configs: what every key of the harness's configs may hold, checked before any work.

The dataclasses below are Hydra structured configs, one per config group
(:class:`TrainerConfig`, :class:`TaskConfig` with :class:`ArchConfig`,
:class:`ModelConfig`) and one per entry point (:class:`TrainConfig` for
``lra-train`` and ``lra-data``, :class:`BenchConfig`, :class:`EvalConfig`,
:class:`SmokeConfig`), registered in Hydra's ConfigStore
as ``lra_schema_<name>`` (:func:`register`). Free-form parts stay mappings:
``task.source`` (differs per task), ``model.attention_options`` and
``model.arch_overrides``; ``model.attention`` is a name, a list of names or a
``{lower, upper, lower_fraction}`` mapping (:class:`LayerSplit`).

A config breaks the schema when it has a key the schema does not know
(``+trainer.num_step=5``, ``trainer.num_step=5``, ``+foo=1``, a typo in a task
or model file), a value of the wrong type (``trainer.learning_rate=abc``,
``trainer.num_steps=1.5``, ``seed=x``), or no value for a required key. The
entry points then print exactly one line and exit with status 2, like every
other user error of the harness (``lra.cli._report_errors``)::

    error: trainer.num_step: unknown key (did you mean num_steps?); allowed keys: b1, b2, ...
    error: trainer.learning_rate: expected a float, got 'abc'

How, and why this way. The schema is *not* in the configs' defaults lists.
Composing with it there would make Hydra reject these mistakes itself, but with
its own multi-line message and exit status 1, and it would change the config
every run sees (``trainer.learning_rate=1`` would become ``1.0``, defaults would
be added), so the resolved config, and with it every run's identity hash and
run folder, would change. Instead the schema only *checks*:

1. :func:`check_command_line`, called by each console script before its Hydra
   app (before JAX starts, before data loads, before Hydra makes an output
   folder), composes the config exactly as Hydra is about to (Hydra's own
   argument parser, search path with ``--config-dir``, config loader and
   overrides) and checks it with :func:`find_problem`. Overrides Hydra itself
   refuses because the key does not exist (``trainer.num_step=5`` without
   ``+``) are looked up in the schema, so they give the same line. For ``-m``
   every value of every swept parameter (command line and
   ``hydra.sweeper.params``, e.g. ``experiment=figure1``) is composed and
   checked at least once (the i-th job checked takes the i-th value of each
   parameter), so a sweep stops before its first job, not in its tenth. Any
   other composition error (an unknown group option, a bad override grammar)
   is left to Hydra, which reports it as it always has. ``--help``,
   ``--hydra-help``, ``--info`` and shell completion are not checked;
   ``--cfg`` is.
2. :func:`validate`, called inside each app on the config the job actually
   got, is the backstop for anything step 1 could not see (a job of a sweeper
   whose values cannot be listed, a primary config of the user's own). In a
   sweep its error is that job's ``failed`` row (:mod:`lra.run.sweep`).

The config passed to the app is Hydra's, unchanged: checking never converts or
adds a value. Scalars are checked with OmegaConf's own value nodes, so what
passes is exactly what a structured config would accept (``'7'`` is an
integer, ``1`` a float, ``yes`` a boolean); interpolations (``${...}``) are
not resolved and not checked. Nothing here imports JAX.

``lra-report`` is checked the same way (:class:`ReportConfig`, from
``lra.report.main.report_main``).

A new config key goes into its config file *and* into its dataclass here:
tests/test_typed_config.py composes every model x task (x protocol, trainer and
logger preset) and fails until the two agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from omegaconf import (
    MISSING,
    BooleanNode,
    DictConfig,
    FloatNode,
    IntegerNode,
    ListConfig,
    OmegaConf,
    StringNode,
    ValidationError,
)

from lra.config.compose import CONFIG_DIR
from lra.errors import ConfigError


class SchemaError(ConfigError):
    """A config breaks the schema: an unknown key, a wrong type or a missing value."""


# --- the groups ---------------------------------------------------------------------------


@dataclass
class TrainerConfig:
    """``trainer.*``: configs/trainer/default.yaml; task and protocol files override it."""

    batch_size: int = MISSING
    learning_rate: float = MISSING
    schedule: str = MISSING  # rsqrt | cosine | constant (checked by lra.train.optim)
    warmup_steps: int = MISSING
    num_steps: int = MISSING
    decay_steps: int | None = None  # cosine only: its horizon (None = num_steps)
    weight_decay: float = MISSING
    b1: float = MISSING
    b2: float = MISSING
    eps: float = MISSING
    grad_clip: float = MISSING
    precision: str = MISSING  # fp32 | bf16
    dropout_rng: str = "hash"  # hash | rbg | threefry (checked by lra.train.dropout_rng)
    eval_every: int = MISSING
    eval_batches: int | None = None
    log_every: int = MISSING
    selection: str = MISSING  # best_val | last (checked by the training loop)
    progress: bool = MISSING
    mesh: dict[str, int] = field(default_factory=lambda: {"data": -1})  # axes: lra.train.parallel
    grad_accum: int = 1
    remat: bool = False
    preflight: bool = True
    memory_limit_gb: float | None = None
    checkpoint_every: int = MISSING
    checkpoint_minutes: float = MISSING
    keep_checkpoints: int = MISSING
    resume: str = MISSING  # auto | never | must
    skip_done: bool = MISSING


@dataclass
class ArchConfig:
    """``task.arch.*``: the encoder's shape, passed to lra.models.build_classifier."""

    num_layers: int = MISSING
    dim: int = MISSING
    qkv_dim: int | None = MISSING
    num_heads: int = MISSING
    mlp_dim: int = MISSING
    dropout: float = MISSING
    attention_dropout: float = MISSING
    pooling: str = MISSING  # cls | mean
    positions: str = MISSING  # sinusoidal | learned


@dataclass
class ListOpsGenerator:
    """``task.generator.*``: the ListOps generator's parameters (lra/data/listops.py)."""

    num_train: int = MISSING
    num_val: int = MISSING
    num_test: int = MISSING
    min_length: int = MISSING
    max_length: int = MISSING
    max_depth: int = MISSING
    max_args: int = MISSING
    seed: int = MISSING


@dataclass
class TaskConfig:
    """``task.*``: one file of configs/task/ (``@package _global_``: it also sets trainer.*)."""

    name: str = MISSING
    dataset: str = MISSING  # listops | text | retrieval | image | pathfinder
    data_subdir: str = MISSING
    max_length: int = MISSING
    vocab_size: int = MISSING
    num_classes: int = MISSING
    dual: bool = False
    # Where the validation split comes from: official | train | test (lra.data.tasks).
    val_source: str = "official"
    val_fraction: float | None = None  # the held-out share of train (val_source=train)
    generator: ListOpsGenerator | None = None  # ListOps only
    source: dict[str, Any] | None = None  # free-form: each dataset reads its own keys
    arch: ArchConfig = field(default_factory=ArchConfig)


@dataclass
class LayerSplit:
    """``model.attention`` as a two-part schedule: the lowest ``int(num_layers *
    lower_fraction)`` layers use ``lower``, the rest ``upper``."""

    lower: str = MISSING
    upper: str = MISSING
    lower_fraction: float = 0.5


@dataclass
class ModelConfig:
    """``model.*``: one file of configs/model/ (or of a ``--config-dir`` of your own)."""

    name: str = MISSING
    # A mechanism name (or import path) for every layer, a list of names (one per layer) or
    # a LayerSplit mapping. Any for OmegaConf; find_problem checks the three forms.
    attention: Any = field(default=MISSING, metadata={"one_of": (str, list[str], LayerSplit)})
    attention_options: dict[str, Any] = field(default_factory=dict)  # mechanism -> options
    arch_overrides: dict[str, Any] = field(default_factory=dict)  # task.arch keys to change


# --- top level: configs/config.yaml and configs/logger/ ---------------------------------


@dataclass
class DistributedConfig:
    """``distributed.*``: jax.distributed start-up (lra.train.parallel.initialize_distributed)."""

    enabled: Any = "auto"  # auto | true | false
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: list[int] | None = None
    cpu_collectives: str = "gloo"  # gloo | mpi


@dataclass
class WandbConfig:
    """``logger.wandb.*`` (configs/logger/wandb.yaml)."""

    project: str | None = "lra"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TensorboardConfig:
    """``logger.tensorboard.*`` (configs/logger/tensorboard.yaml)."""

    flush_secs: float = 30


@dataclass
class LoggerConfig:
    """``logger.*``: one entry per chosen logger (``logger=[wandb,tensorboard]``)."""

    wandb: WandbConfig | None = None
    tensorboard: TensorboardConfig | None = None


@dataclass
class CompileCacheConfig:
    """``compile_cache.*``: JAX's persistent compilation cache (lra/compile_cache.py)."""

    enabled: bool = True
    dir: str | None = None
    min_compile_seconds: float | None = None


@dataclass
class TrainConfig:
    """``lra-train`` and ``lra-data``: configs/config.yaml."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    protocol: str | None = None  # lra_official | transnormer (configs/protocol/)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    data_dir: str | None = None
    results_dir: str = "results/runs"
    num_workers: int | None = None
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    rebuild: bool = False
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)


@dataclass
class BenchSettings:
    """``bench.*`` of configs/bench.yaml."""

    warmup_steps: int = 2
    windows: int = 5
    steps_per_window: int = 5
    isolate: bool = True


@dataclass
class BenchConfig:
    """``lra-bench``: configs/bench.yaml."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    protocol: str | None = None
    seed: int = 0
    results_dir: str = "results/bench"
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 3072, 4096, 5120])
    batch_size: int = 20
    models: list[str] | None = None  # round-robin over these models (lra.measure.bench)
    rounds: int = 1
    bench: BenchSettings = field(default_factory=BenchSettings)
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)


@dataclass
class EvalConfig:
    """``lra-eval``: configs/eval.yaml."""

    run: str = MISSING
    split: str = "test"  # train | val | test
    checkpoint: str = "selected"  # selected | last | a kept step
    data_dir: str | None = None


@dataclass
class SmokeConfig:
    """``lra-smoke``: configs/smoke.yaml."""

    models: list[str] | None = None
    tasks: list[str] | None = None
    steps: int = 20
    learn_steps: int = 100
    seed: int = 0
    data_dir: str | None = None
    results_dir: str = "results/smoke"
    table: str = MISSING
    overrides: list[str] = field(default_factory=list)


@dataclass
class ReportConfig:
    """``lra-report``: configs/report.yaml."""

    results_dir: Any = field(default_factory=lambda: ["results/runs", "results/bench"])
    out_dir: str = "results"
    tasks: str = "auto"
    models: list[str] | None = None
    settings: list[str] | None = None
    protocols: Any = None  # a name or a list of names
    since: str | None = None
    until: str | None = None
    figure: bool = True
    figure_length: int = 2048
    reference_csv: str | None = None
    show_reference: bool = True
    curves: bool = True


#: Primary config name (configs/<name>.yaml) -> its schema.
SCHEMAS: dict[str, type] = {
    "config": TrainConfig,
    "bench": BenchConfig,
    "eval": EvalConfig,
    "smoke": SmokeConfig,
    "report": ReportConfig,
}
GROUP_SCHEMAS: dict[str, type] = {
    "trainer": TrainerConfig,
    "task": TaskConfig,
    "model": ModelConfig,
}


def register() -> None:
    """Store the schemas in Hydra's ConfigStore as top-level configs ``lra_schema_<name>``
    (``lra_schema_config``, ``lra_schema_bench``, ..., ``lra_schema_trainer``): a primary
    config of your own can start from one (``defaults: [lra_schema_config, _self_]``). Not
    in a config group, so they add no option to ``model=``/``task=`` and no group to
    ``--help``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in {**SCHEMAS, **GROUP_SCHEMAS}.items():
        store.store(name=f"lra_schema_{name}", node=schema)


# --- checking a composed config -----------------------------------------------------------

_SCALARS = {int: IntegerNode, float: FloatNode, bool: BooleanNode, str: StringNode}


def _optional(tp) -> tuple[Any, bool]:
    """(``X``, True) for ``X | None``, else (``tp``, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def describe(tp) -> str:
    """``tp`` in words: ``a float``, ``an integer or null``, ``a list of integers``."""
    tp, optional = _optional(tp)
    origin = typing.get_origin(tp)
    if tp is int:
        text = "an integer"
    elif tp is float:
        text = "a float"
    elif tp is bool:
        text = "a boolean (true or false)"
    elif tp is str:
        text = "a string"
    elif origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        text = "a list" if item is Any else "a list of " + _plural(describe(item))
    elif origin is dict or dataclasses.is_dataclass(tp):
        text = "a mapping"
    else:
        text = "any value"
    return text + " or null" if optional else text


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            text = text[len(article) :]
            break
    head, sep, tail = text.partition(" ")
    return head + "s" + sep + tail if not head.endswith("s") else text


def _shown(node) -> str:
    """A config value as the error line shows it: strings quoted, ``null`` for None."""
    if isinstance(node, (DictConfig, ListConfig)):
        return repr(OmegaConf.to_container(node, resolve=False))
    value = node._value()
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


def _fields(schema) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def _hints(schema) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is dataclasses.MISSING


def _unknown(path: str, key: str, allowed: list[str]) -> str:
    full = f"{path}.{key}" if path else key
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{full}: unknown key{hint}; allowed keys: {', '.join(sorted(allowed))}"


def _missing(path: str) -> str:
    return f"{path}: no value given; set it in its config file or on the command line ({path}=...)"


def _problem(node, tp, path: str, one_of=None) -> str | None:
    """The first thing wrong with ``node`` (a config node at ``path``) against type ``tp``."""
    if node._is_missing():
        return _missing(path)
    if node._is_interpolation():
        return None
    if one_of is not None:
        return _one_of_problem(node, one_of, path)
    declared = tp
    tp, optional = _optional(tp)
    if node._is_none():
        if optional or tp is Any:
            return None
        return f"{path}: expected {describe(tp)}, got null"
    if tp is Any:
        return None
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(node, DictConfig):
            return f"{path}: expected a mapping, got {_shown(node)}"
        return _mapping_problem(node, tp, path)
    if origin is dict:
        if not isinstance(node, DictConfig):
            return f"{path}: expected a mapping, got {_shown(node)}"
        _, value_type = typing.get_args(tp) or (str, Any)
        for key in node.keys():
            found = _problem(node._get_node(key), value_type, f"{path}.{key}")
            if found:
                return found
        return None
    if origin is list:
        if not isinstance(node, ListConfig):
            return f"{path}: expected {describe(tp)}, got {_shown(node)}"
        (item_type,) = typing.get_args(tp) or (Any,)
        for i in range(len(node)):
            found = _problem(node._get_node(i), item_type, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(node, (DictConfig, ListConfig)):
        return f"{path}: expected {describe(declared)}, got {_shown(node)}"
    try:
        _SCALARS[tp](value=node._value())
    except ValidationError:
        return f"{path}: expected {describe(declared)}, got {_shown(node)}"
    return None


def _one_of_problem(node, forms, path: str) -> str | None:
    """``node`` against the first of ``forms`` its shape fits (mapping, list or scalar)."""
    if node._is_none():
        wanted = " or ".join(describe(f) for f in forms)
        return f"{path}: expected {wanted}, got null"
    for form in forms:
        origin = typing.get_origin(form)
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(form):
            return _mapping_problem(node, form, path)
        if isinstance(node, ListConfig) and origin is list:
            return _problem(node, form, path)
        if not isinstance(node, (DictConfig, ListConfig)) and form in _SCALARS:
            return _problem(node, form, path)
    wanted = ", ".join(describe(f) for f in forms)
    return f"{path}: expected one of: {wanted}; got {_shown(node)}"


def _mapping_problem(node: DictConfig, schema, path: str, skip=()) -> str | None:
    fields, hints = _fields(schema), _hints(schema)
    for key in node.keys():
        if key in skip:
            continue
        if key not in fields:
            return _unknown(path, str(key), list(fields))
        f = fields[key]
        found = _problem(
            node._get_node(key), hints[key], f"{path}.{key}" if path else key,
            f.metadata.get("one_of"),
        )  # fmt: skip
        if found:
            return found
    for name, f in fields.items():
        if name not in node and _required(f):
            return _missing(f"{path}.{name}" if path else name)
    return None


def find_problem(cfg: DictConfig, schema: type) -> str | None:
    """What is wrong with the composed config ``cfg`` under ``schema`` (a dataclass), as one
    line without the ``error:`` prefix, or None if nothing is. A ``hydra`` key (the composed
    config before Hydra strips it) is not checked."""
    return _mapping_problem(cfg, schema, "", skip=("hydra",))


def schema_for(config_name: str | None) -> type | None:
    """The schema of a primary config name, None for a config of the user's own."""
    return SCHEMAS.get(os.path.splitext(config_name or "")[0])


def validate(cfg: DictConfig, config_name: str | None = None) -> None:
    """Raise :class:`SchemaError` if ``cfg`` breaks the schema of ``config_name`` (default:
    the running Hydra job's primary config). A config with no schema passes."""
    if config_name is None:
        from hydra.core.hydra_config import HydraConfig

        config_name = HydraConfig.get().job.config_name if HydraConfig.initialized() else None
    schema = schema_for(config_name)
    if schema is not None:
        problem = find_problem(cfg, schema)
        if problem:
            raise SchemaError(problem)


def key_problem(key: str, schema: type) -> str | None:
    """``<key>: unknown key; allowed keys: ...`` if the dotted ``key`` names nothing the
    schema allows (below a free-form mapping anything goes), else None."""
    tp, path = schema, ""
    for part in key.split("."):
        tp, _ = _optional(tp)
        if not dataclasses.is_dataclass(tp):
            return None  # a mapping, a list, Any or a scalar: not for this check to say
        fields = _fields(tp)
        if part not in fields:
            return _unknown(path, part, list(fields))
        tp = _hints(tp)[part]
        path = f"{path}.{part}" if path else part
    return None


# --- checking a command line before Hydra runs it ------------------------------------------


def _parse_args(argv: list[str]):
    """Hydra's own reading of ``argv``, or None where it would stop (Hydra then says why)."""
    from hydra._internal.utils import get_args_parser

    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return get_args_parser().parse_args(argv)
    except SystemExit:
        return None


def _override_problem(overrides: list[str], schema: type, groups: set[str]) -> str | None:
    """The unknown key among ``overrides`` that made composition fail, if one is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None
    for override in parsed:
        key = override.key_or_group
        if (
            override.is_hydra_override()
            or override.is_delete()
            or override.package is not None
            or "/" in key
            or key in groups
        ):
            continue
        found = key_problem(key, schema)
        if found:
            return found
    return None


def _sweep_jobs(master: DictConfig, overrides: list[str], parser) -> list[list[str]] | None:
    """Override lists of the sweep's jobs to check: every value of every swept key at least
    once (job i takes value i of each key, cycling), as Hydra's basic sweeper combines the
    command line with ``hydra.sweeper.params``. None if the values cannot be listed."""
    sweeper = master.hydra.get("sweeper") or {}
    params = []
    if str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    choices: dict[str, list[str]] = {}
    for override in parser.parse_overrides(params + list(overrides)):
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                return None
            choices[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    lists = [v for v in choices.values() if v]
    count = max((len(v) for v in lists), default=1)
    return [[v[i % len(v)] for v in lists] for i in range(count)]


def command_line_problem(config_name: str, argv: list[str]) -> str | None:
    """What is wrong with the config that ``argv`` (a console script's arguments) composes
    from ``configs/<config_name>.yaml``, as :func:`find_problem` says it, or None: nothing is,
    the command is not one that runs the app (``--help``, ``--info``, ...), or composing
    failed for a reason Hydra reports itself."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    args = _parse_args(argv)
    if args is None or args.help or args.hydra_help or args.info or args.shell_completion:
        return None
    if args.config_path is not None:
        return None  # another primary config folder: no schema of ours
    config_name = args.config_name or config_name
    schema = schema_for(config_name)
    if schema is None:
        return None
    search_path = create_config_search_path(CONFIG_DIR)
    if args.config_dir is not None:
        folder = os.path.abspath(args.config_dir)
        if not os.path.isdir(folder):
            return None
        search_path.prepend("command-line", f"file://{folder}", SearchPathQuery(provider="schema"))
    loader = ConfigLoaderImpl(config_search_path=search_path)
    app = Hydra(task_name="lra", config_loader=loader)
    overrides = list(args.overrides)
    parser = OverridesParser.create(config_loader=loader)
    parsed = parser.parse_overrides(overrides)
    groups = set(loader.list_groups(""))

    def compose(job_overrides: list[str], mode: RunMode) -> DictConfig | None:
        return app.compose_config(config_name, job_overrides, run_mode=mode)

    jobs = [overrides]
    if args.multirun or any(o.is_sweep_override() for o in parsed):
        try:
            master = compose(overrides, RunMode.MULTIRUN)
        except Exception:
            return _override_problem(overrides, schema, groups)
        jobs = _sweep_jobs(master, overrides, parser)
        if jobs is None:  # values of another sweeper: check what all jobs share
            return find_problem(master, schema)
    for job in jobs:
        try:
            cfg = compose(job, RunMode.RUN)
        except Exception:
            found = _override_problem(job, schema, groups)
            if found:
                return found
            return None
        found = find_problem(cfg, schema)
        if found:
            return found
    return None


def check_command_line(config_name: str, argv: list[str] | None = None) -> None:
    """Exit with status 2 and one ``error: ...`` line on stderr if the command line's config
    breaks the schema (see :func:`command_line_problem`). Anything unexpected while checking
    is ignored: Hydra then composes and reports as it always has, and :func:`validate` in the
    app still runs."""
    try:
        problem = command_line_problem(config_name, sys.argv[1:] if argv is None else argv)
    except Exception:
        return
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)


register()
