"""The typed schema: what every key of the harness's configs may hold (types, allowed values,
ranges), declared next to the key, as MaxText's ``types.py`` does.

The dataclasses are Hydra structured configs, one per config group
(:class:`TrainerConfig`, :class:`TaskConfig` with :class:`ArchConfig`,
:class:`ModelConfig`) and one per entry point (:class:`TrainConfig` for
``lra-train`` and ``lra-data``, :class:`BenchConfig`, :class:`EvalConfig`,
:class:`SmokeConfig`, :class:`ReportConfig`), registered in Hydra's ConfigStore
as ``lra_schema_<name>`` (:func:`register`). Free-form parts stay mappings:
``task.source`` (differs per task), ``model.attention_options`` and
``model.arch_overrides``; ``model.attention`` is a name, a list of names or a
``{lower, upper, lower_fraction}`` mapping (:class:`LayerSplit`).

A field's constraints ride in its annotation, ``Annotated[<type>, <constraint>...]``
(OmegaConf reads the plain type and ignores the rest):

- a ``Literal[...]`` alias (:data:`Schedule`, :data:`Precision`, ...): the allowed values;
  code that branches on them takes its tuple from here (``typing.get_args(Schedule)``);
- :class:`Range`: bounds of a number (``PositiveInt``, ``Fraction``, ``DropoutRate``, ...);
- :class:`MinItems`: the shortest list allowed.

Relations between keys of one mapping (``decay_steps`` after ``warmup_steps``, ``grad_accum``
dividing ``batch_size``) are the functions of :data:`RELATIONS`. One generic validator
(:mod:`lra.config.schema`) checks all of it; nothing here imports JAX.

Defaults live in the YAML only: a field the shipped configs always define has no default here
(``MISSING``: a config must give it). A default remains only on a key some shipped
composition leaves out (``task.generator``, ``task.source``, the logger sections); it is
what the code does when the key is absent. tests/test_typed_config.py holds both rules.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from omegaconf import MISSING

# --- constraints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``ge``/``gt`` below, ``le``/``lt`` above (None = unbounded)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def holds(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def words(self) -> str:
        """``>= 1``, ``in (0, 1)``, ``in [0, 1)``, ..."""
        low = (f"[{self.ge}", self.ge) if self.ge is not None else (f"({self.gt}", self.gt)
        high = (f"{self.le}]", self.le) if self.le is not None else (f"{self.lt})", self.lt)
        if low[1] is not None and high[1] is not None:
            return f"in {low[0]}, {high[0]}"
        if low[1] is not None:
            return (">= " if self.ge is not None else "> ") + str(low[1])
        return ("<= " if self.le is not None else "< ") + str(high[1])


@dataclass(frozen=True)
class MinItems:
    """A list of at least ``count`` items."""

    count: int


def allowed(literal) -> tuple:
    """The values of a ``Literal[...]`` alias, in declaration order."""
    return typing.get_args(literal)


# --- named types ---------------------------------------------------------------------------

PositiveInt = Annotated[int, Range(ge=1)]
NonNegativeInt = Annotated[int, Range(ge=0)]
PositiveFloat = Annotated[float, Range(gt=0)]
NonNegativeFloat = Annotated[float, Range(ge=0)]
Fraction = Annotated[float, Range(gt=0, lt=1)]  # strictly between 0 and 1
DropoutRate = Annotated[float, Range(ge=0, lt=1)]
Beta = Annotated[float, Range(ge=0, lt=1)]  # Adam's moment decay rates

Schedule = Literal["rsqrt", "cosine", "constant"]  # lra.train.optim
Precision = Literal["fp32", "bf16"]  # bf16: bf16 compute, fp32 parameters
DropoutGenerator = Literal["hash", "rbg", "threefry"]  # lra.train.dropout_rng
# lra.models.encoder.REMAT_POLICIES; false/true: the older spellings of none/block
RematPolicy = Literal["none", "block", "attention", "dots", "dots_no_batch", False, True]
Selection = Literal["best_val", "last"]  # which checkpoint is tested
ResumeMode = Literal["auto", "never", "must"]  # lra.run.folder
ValSource = Literal["official", "train", "test"]  # lra.data.tasks (per task: a subset)
Pooling = Literal["cls", "mean", "last"]  # lra.models.encoder
Positions = Literal["sinusoidal", "learned"]  # lra.models.encoder
Norm = Literal["layer", "batch"]  # lra.models.norms
NormPosition = Literal["pre", "post"]  # lra.models.norms
Momentum = Annotated[float, Range(ge=0, lt=1)]  # a BatchNorm's running statistics (Flax's)
DistributedMode = Literal["auto", True, False]
CpuCollectives = Literal["gloo", "mpi"]
Split = Literal["train", "val", "test"]
SmokeBudget = Literal["smoke", "default"]  # lra.measure.smoke
ReportTasks = Literal["auto", "official", "tiny"]
Protocol = Literal["lra_official", "transnormer", "authors"]  # configs/protocol/<name>.yaml
PretrainObjective = Literal["none", "masked", "causal"]  # lra.train.objective
TuneSampler = Literal["tpe", "random", "grid"]  # lra.tune.study
TunePruner = Literal["none", "median", "hyperband"]  # lra.tune.study
PixelTarget = Literal["classify", "l1"]  # lra.train.objective: image-like tasks
InitKind = Literal["masked", "causal"]  # lra.train.pretrain: the encoder's init
Stage = Literal["pretrain"]  # lra.train.pretrain: stage 1's config
ReportFigure = Literal["auto", True, False]  # lra.report.main: auto = when it can
SoftmaxPath = Literal["plain", "chunked", "fused"]  # models/attention/softmax.py, forced paths


# --- the groups ----------------------------------------------------------------------------


@dataclass
class MeshConfig:
    """``trainer.mesh``: the device mesh; only data parallelism (lra.train.parallel)."""

    data: int = MISSING  # -1 = every device of every process, N = the first N devices


@dataclass
class ParamGroupConfig:
    """``trainer.param_groups.<group>``: a parameter group's own AdamW (lra.train.optim)."""

    # One of the two: the group's own rate, or a factor of trainer.learning_rate (LRU's
    # "LR factor"); the schedule's shape is trainer.*'s either way.
    learning_rate: PositiveFloat | None = None
    lr_factor: PositiveFloat | None = None
    weight_decay: NonNegativeFloat = MISSING


@dataclass
class TrainerConfig:
    """``trainer.*``: configs/trainer/default.yaml; task and protocol files override it."""

    batch_size: PositiveInt = MISSING
    learning_rate: PositiveFloat = MISSING
    schedule: Annotated[str, Schedule] = MISSING
    warmup_steps: NonNegativeInt = MISSING
    num_steps: PositiveInt = MISSING
    decay_steps: PositiveInt | None = MISSING  # cosine only: its horizon (None = num_steps)
    weight_decay: NonNegativeFloat = MISSING
    # None = one group; else {group: ParamGroupConfig}, group one of lra.train.optim.GROUP_NAMES
    # (ssm | ssm_a | ssm_b | ssm_dt | ssm_d): the SSM parameters' own lr and decay (issue 27)
    param_groups: dict[str, ParamGroupConfig] | None = MISSING
    b1: Beta = MISSING
    b2: Beta = MISSING
    eps: NonNegativeFloat = MISSING
    grad_clip: NonNegativeFloat = MISSING  # 0 = off
    precision: Annotated[str, Precision] = MISSING
    dropout_rng: Annotated[str, DropoutGenerator] = MISSING
    eval_every: PositiveInt = MISSING
    eval_batches: PositiveInt | None = MISSING
    log_every: PositiveInt = MISSING
    selection: Annotated[str, Selection] = MISSING
    # false: validation only, the test split never opened (lra-tune's trials: a record of kind
    # "trial" without test fields)
    evaluate_test: bool = MISSING
    progress: bool = MISSING
    mesh: MeshConfig = MISSING
    grad_accum: PositiveInt = MISSING
    remat: Annotated[Any, RematPolicy] = MISSING
    preflight: bool = MISSING
    memory_limit_gb: PositiveFloat | None = MISSING
    checkpoint_every: NonNegativeInt = MISSING  # 0 = only by time and at the end
    checkpoint_minutes: NonNegativeFloat = MISSING  # 0 = off
    keep_checkpoints: PositiveInt = MISSING
    resume: Annotated[str, ResumeMode] = MISSING
    skip_done: bool = MISSING


@dataclass
class ArchConfig:
    """``task.arch.*``: the encoder's shape, passed to lra.models.build_classifier."""

    num_layers: PositiveInt = MISSING
    dim: PositiveInt = MISSING
    qkv_dim: PositiveInt | None = MISSING
    num_heads: PositiveInt = MISSING
    mlp_dim: PositiveInt = MISSING
    dropout: DropoutRate = MISSING
    attention_dropout: DropoutRate = MISSING
    pooling: Annotated[str, Pooling] = MISSING
    positions: Annotated[str, Positions] = MISSING
    # LayerNorm or masked BatchNorm, before each sublayer (and after the last block) or after
    # each residual sum (lra.models.norms); the task files give the LRA encoder's.
    norm: Annotated[str, Norm] = MISSING
    norm_position: Annotated[str, NormPosition] = MISSING
    norm_momentum: Momentum = MISSING  # norm=batch: running = m * running + (1 - m) * batch


@dataclass
class ListOpsGenerator:
    """``task.generator.*``: the ListOps generator's parameters (lra/data/listops.py, which
    also checks that the depth and arity reach past ``min_length``)."""

    num_train: NonNegativeInt = MISSING
    num_val: NonNegativeInt = MISSING
    num_test: NonNegativeInt = MISSING
    min_length: NonNegativeInt = MISSING
    max_length: PositiveInt = MISSING
    max_depth: PositiveInt = MISSING
    max_args: Annotated[int, Range(ge=2)] = MISSING
    seed: NonNegativeInt = MISSING


@dataclass
class TaskConfig:
    """``task.*``: one file of configs/task/ (``@package _global_``: it also sets trainer.*)."""

    name: str = MISSING
    dataset: str = MISSING  # listops | text | retrieval | image | pathfinder (lra.data.tasks)
    data_subdir: str = MISSING
    max_length: PositiveInt = MISSING
    vocab_size: PositiveInt = MISSING
    num_classes: Annotated[int, Range(ge=2)] = MISSING
    dual: bool = MISSING  # two inputs per example (retrieval)
    # Where the validation split comes from (lra.data.tasks says which a task allows).
    val_source: Annotated[str, ValSource] = MISSING
    val_fraction: Fraction | None = MISSING  # the held-out share of train (val_source=train)
    generator: ListOpsGenerator | None = None  # ListOps only
    source: dict[str, Any] | None = None  # free-form: each dataset reads its own keys
    arch: ArchConfig = field(default_factory=ArchConfig)


@dataclass
class LayerSplit:
    """``model.attention`` as a two-part schedule: the lowest ``int(num_layers *
    lower_fraction)`` layers use ``lower``, the rest ``upper``."""

    lower: str = MISSING
    upper: str = MISSING
    lower_fraction: Annotated[float, Range(ge=0, le=1)] = MISSING


@dataclass
class ModelConfig:
    """``model.*``: one file of configs/model/ (or of a ``--config-dir`` of your own)."""

    name: str = MISSING
    # A mechanism name (or import path) for every layer, a list of names (one per layer) or
    # a LayerSplit mapping. Any for OmegaConf; the validator checks the three forms.
    attention: Any = field(default=MISSING, metadata={"one_of": (str, list[str], LayerSplit)})
    attention_options: dict[str, Any] = MISSING  # mechanism -> options
    arch_overrides: dict[str, Any] = MISSING  # task.arch keys to change


# --- top level: configs/config.yaml and configs/logger/ ------------------------------------


@dataclass
class PretrainConfig:
    """``pretrain.*``: configs/pretrain/ (lra.train.pretrain; Amos et al. 2024)."""

    objective: Annotated[str, PretrainObjective] = MISSING
    num_steps: PositiveInt = MISSING
    mask_ratio: Fraction | None = MISSING  # None = the task family's (lra.train.objective)
    learning_rate: PositiveFloat = MISSING
    schedule: Annotated[str, Schedule] = MISSING
    warmup_steps: NonNegativeInt = MISSING
    pixel_target: Annotated[str, PixelTarget] = MISSING


@dataclass
class InitConfig:
    """``init.*``: set by lra.train.pretrain on a fine-tuning stage's config (never in YAML):
    the encoder starts from the selected checkpoint of the pretraining run ``pretrain_run``."""

    kind: Annotated[str, InitKind] = MISSING
    pretrain_run: str = MISSING  # the pretraining run's key (a folder of results_dir)


@dataclass
class DistributedConfig:
    """``distributed.*``: jax.distributed start-up (lra.train.parallel.initialize_distributed)."""

    enabled: Annotated[Any, DistributedMode] = MISSING
    coordinator_address: str | None = MISSING
    num_processes: PositiveInt | None = MISSING
    process_id: NonNegativeInt | None = MISSING
    local_device_ids: list[int] | None = MISSING
    cpu_collectives: Annotated[str, CpuCollectives] = MISSING


@dataclass
class WandbConfig:
    """``logger.wandb.*`` (configs/logger/wandb.yaml)."""

    project: str | None = MISSING
    entity: str | None = MISSING
    group: str | None = MISSING
    name: str | None = MISSING
    tags: list[str] = MISSING


@dataclass
class TensorboardConfig:
    """``logger.tensorboard.*`` (configs/logger/tensorboard.yaml)."""

    flush_secs: PositiveFloat = MISSING


@dataclass
class LoggerConfig:
    """``logger.*``: one entry per chosen logger (``logger=[wandb,tensorboard]``); a logger
    not chosen is absent. Its keys are the logger names (lra.track.BACKENDS)."""

    wandb: WandbConfig | None = None
    tensorboard: TensorboardConfig | None = None


@dataclass
class CompileCacheConfig:
    """``compile_cache.*``: JAX's persistent compilation cache (lra/device/compile_cache.py)."""

    enabled: bool = MISSING
    dir: str | None = MISSING
    min_compile_seconds: NonNegativeFloat | None = MISSING


@dataclass
class TrainConfig:
    """``lra-train`` and ``lra-data``: configs/config.yaml."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    protocol: Annotated[str, Protocol] | None = MISSING  # configs/protocol/
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = MISSING
    data_dir: str | None = MISSING
    results_dir: str = MISSING
    num_workers: PositiveInt | None = MISSING
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    rebuild: bool = MISSING
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    # Set by lra.train.pretrain on the configs of its stages only (no shipped YAML has them):
    init: InitConfig | None = None  # the fine-tuning stage's pretrained encoder
    stage: Annotated[str, Stage] | None = None  # "pretrain": the pretraining stage's config


@dataclass
class BenchSettings:
    """``bench.*`` of configs/bench.yaml."""

    warmup_steps: NonNegativeInt = MISSING
    windows: PositiveInt = MISSING
    steps_per_window: PositiveInt = MISSING
    isolate: bool = MISSING
    # each model with softmax layers also measured with these implementations forced
    # (lra.measure.bench.with_softmax_paths); null = only as configured
    softmax_paths: list[Annotated[str, SoftmaxPath]] | None = MISSING


@dataclass
class BenchConfig:
    """``lra-bench``: configs/bench.yaml."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    protocol: str | None = MISSING
    seed: int = MISSING
    results_dir: str = MISSING
    lengths: Annotated[list[PositiveInt], MinItems(1)] = MISSING
    batch_size: PositiveInt = MISSING
    models: list[str] | None = MISSING  # round-robin over these models (lra.measure.bench)
    rounds: PositiveInt = MISSING
    bench: BenchSettings = field(default_factory=BenchSettings)
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)


@dataclass
class EvalConfig:
    """``lra-eval``: configs/eval.yaml."""

    run: str = MISSING
    split: Annotated[str, Split] = MISSING
    checkpoint: str = MISSING  # selected | last | a kept step (lra.train.evaluate)
    data_dir: str | None = MISSING


@dataclass
class SmokeConfig:
    """``lra-smoke``: configs/smoke.yaml."""

    models: list[str] | None = MISSING
    tasks: list[str] | None = MISSING
    steps: PositiveInt = MISSING
    learn_steps: NonNegativeInt = MISSING
    budget: Annotated[str, SmokeBudget] = MISSING  # lra.measure.smoke
    pretrain_rows: Annotated[str, PretrainObjective] = MISSING  # self-pretraining rows: objective
    seed: int = MISSING
    data_dir: str | None = MISSING
    results_dir: str = MISSING
    table: str = MISSING
    overrides: list[str] = MISSING


@dataclass
class ReportConfig:
    """``lra-report``: configs/report.yaml."""

    results_dir: Any = MISSING  # a folder or a list of folders
    out_dir: str = MISSING
    tasks: Annotated[str, ReportTasks] = MISSING
    models: list[str] | None = MISSING
    settings: list[str] | None = MISSING
    protocols: Any = MISSING  # a name or a list of names
    since: str | None = MISSING
    until: str | None = MISSING
    figure: Annotated[Any, ReportFigure] = MISSING
    figure_length: PositiveInt = MISSING
    show_published: bool = MISSING  # published points (hollow) in Figure 1, lra.report.compare
    curves: bool = MISSING
    reference: str | None = MISSING  # a row label of the leaderboard; null = the Transformer
    resolve_points: PositiveFloat = MISSING
    bootstrap_resamples: PositiveInt = MISSING
    plan: str | None = MISSING  # an lra-plan plan.json (or its folder), lra.report.plan_check


# --- relations between the keys of one mapping ----------------------------------------------
# Each takes the mapping's concrete values (a key whose value is missing or an interpolation
# is absent) and returns one line naming the keys, the values and the fix, or None.


def _decay_after_warmup(v: dict) -> str | None:
    decay, warmup = v.get("decay_steps"), v.get("warmup_steps")
    if decay is None or warmup is None or decay > warmup:
        return None
    return (
        f"trainer.decay_steps ({decay}) must exceed trainer.warmup_steps ({warmup}); "
        "null decays over trainer.num_steps"
    )


def _accum_divides_batch(v: dict) -> str | None:
    batch, accum = v.get("batch_size"), v.get("grad_accum")
    if batch is None or accum is None or accum < 1 or batch % accum == 0:
        return None
    lower = max(accum, batch - batch % accum)
    return (
        f"trainer.batch_size={batch} does not split into trainer.grad_accum={accum} "
        f"micro-batches; use a multiple of {accum} (e.g. {lower} or {lower + accum})"
    )


def _coordinator_with_ids(v: dict) -> str | None:
    if v.get("coordinator_address") is None:
        return None
    if v.get("num_processes") is not None and v.get("process_id") is not None:
        return None
    return (
        "distributed.coordinator_address is set but distributed.num_processes or "
        "distributed.process_id is not; give all three (or none, on SLURM or a TPU slice)"
    )


def _one_group_rate(v: dict) -> str | None:
    if (v.get("learning_rate") is None) != (v.get("lr_factor") is None):
        return None
    return "trainer.param_groups: each group gives learning_rate or lr_factor (one of the two)"


RELATIONS: dict[type, tuple[Callable[[dict], str | None], ...]] = {
    ParamGroupConfig: (_one_group_rate,),
    TrainerConfig: (_decay_after_warmup, _accum_divides_batch),
    DistributedConfig: (_coordinator_with_ids,),
}


@dataclass
class TuneConfig:
    """``tune.*`` of ``lra-tune``: configs/tune/default.yaml (lra.tune)."""

    search: str = MISSING  # auto | a YAML file of search keys
    n_trials: PositiveInt = MISSING
    sampler: Annotated[str, TuneSampler] = MISSING
    pruner: Annotated[str, TunePruner] = MISSING
    prune_startup_trials: NonNegativeInt = MISSING  # median: finished trials before it prunes
    prune_warmup: Annotated[float, Range(ge=0, lt=1)] = MISSING  # no pruning before this x steps
    seed: NonNegativeInt = MISSING
    storage: str | None = MISSING  # None = the journal file in results_dir/tune
    study: str | None = MISSING
    final_seeds: NonNegativeInt = MISSING
    worker: int = MISSING
    poll_seconds: PositiveFloat = MISSING


@dataclass
class TuneAppConfig(TrainConfig):
    """``lra-tune``: configs/tune.yaml (lra-train's config and the ``tune`` group)."""

    tune: TuneConfig = field(default_factory=TuneConfig)


#: Primary config name (configs/<name>.yaml) -> its schema.
SCHEMAS: dict[str, type] = {
    "config": TrainConfig,
    "bench": BenchConfig,
    "eval": EvalConfig,
    "smoke": SmokeConfig,
    "report": ReportConfig,
    "tune": TuneAppConfig,
}
GROUP_SCHEMAS: dict[str, type] = {
    "trainer": TrainerConfig,
    "task": TaskConfig,
    "model": ModelConfig,
}


def register() -> None:
    """Store the schemas in Hydra's ConfigStore as top-level configs ``lra_schema_<name>``
    (``lra_schema_config``, ``lra_schema_bench``, ..., ``lra_schema_trainer``): a primary
    config of your own can start from one (``defaults: [lra_schema_config, _self_]``) and
    must then give every key the shipped YAML gives. Not in a config group, so they add no
    option to ``model=``/``task=`` and no group to ``--help``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in {**SCHEMAS, **GROUP_SCHEMAS}.items():
        store.store(name=f"lra_schema_{name}", node=schema)


register()
