"""Building the classifier from configs, and the pure train and eval steps.

The train state is plain data, ``TrainState(params, opt_state, step)``; the
model's structure (an NNX graph definition) stays outside it, so
``train_step(state, batch, key) -> (state, metrics)`` is a pure function that
is jitted once with the state donated. Dropout keys are
``fold_in(key, step)``, so a run is a function of its seed.

Dropout keys use ``trainer.dropout_rng`` (:mod:`lra.train.dropout_rng`; default "hash", a
counter-based hash far cheaper than JAX's generators on CPU), and a run stays a function
of its seed. Parameter initialisation uses JAX's default generator.

Batches are the dicts of :mod:`lra.data.pipeline`: ``tokens`` and ``lengths``
are tuples (two entries for the dual-encoder Retrieval task), ``labels`` is
``int32[B]`` and ``weights`` is ``float32[B]`` (0 for filler rows).
"""

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from omegaconf import OmegaConf

import lra.models
from lra.device import measure
from lra.errors import ConfigError
from lra.train import dropout_rng
from lra.train.optim import make_optimizer

PRECISIONS = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array


def model_kwargs(cfg) -> dict:
    """Classifier arguments: the task's architecture, then the model's overrides."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    arch = OmegaConf.to_container(cfg.task.arch, resolve=True)
    arch.update(model.get("arch_overrides") or {})
    return dict(
        arch,
        vocab_size=cfg.task.vocab_size,
        num_classes=cfg.task.num_classes,
        max_len=cfg.task.max_length,
        attention=model["attention"],
        attention_options=model.get("attention_options") or {},
        dual=bool(cfg.task.get("dual", False)),
        remat=bool(cfg.trainer.get("remat", False)),
    )


def attention_sources(cfg) -> dict[str, str]:
    """Mechanism name -> where its class comes from (``module:Class``, plus the package and
    version for an entry point), for every mechanism the model's layers use."""
    kwargs = model_kwargs(cfg)
    schedule = lra.models.resolve_schedule(kwargs["attention"], int(kwargs["num_layers"]))
    return {name: lra.models.registry.source(name) for name in sorted(set(schedule))}


def layers_description(cfg) -> dict:
    """``layer_mechanisms`` (the mechanism of each layer, lowest first) and ``schedule_warning``
    (set when a lower/upper schedule lost a part at this depth), as records carry them."""
    kwargs = model_kwargs(cfg)
    return lra.models.describe_layers(kwargs["attention"], int(kwargs["num_layers"]))


def softmax_implementations(cfg) -> dict | None:
    """How the softmax layers run on this backend, ``{"train": ..., "eval": ...}``
    (``cudnn``, ``fused``, ``chunked`` or ``plain``; see lra.models.attention.softmax), or None
    when the model has no softmax layer."""
    from lra.models.attention.softmax import choose_implementation

    kwargs = model_kwargs(cfg)
    if "softmax" not in lra.models.resolve_schedule(kwargs["attention"], int(kwargs["num_layers"])):
        return None
    options = (kwargs["attention_options"] or {}).get("softmax") or {}
    qkv_dim = kwargs.get("qkv_dim") or kwargs["dim"]

    def chosen(dropout_active: bool) -> str:
        return choose_implementation(
            options.get("implementation", "auto"),
            platform=jax.default_backend(),
            dtype=PRECISIONS[cfg.trainer.precision],
            head_dim=int(qkv_dim) // int(kwargs["num_heads"]),
            dropout_active=dropout_active,
            max_len=int(kwargs["max_len"]) + int(kwargs.get("pooling") == "cls"),  # + the CLS
        )

    return {"train": chosen(float(kwargs.get("attention_dropout", 0)) > 0), "eval": chosen(False)}


def build_model(cfg, rngs: nnx.Rngs, kwargs: dict | None = None) -> nnx.Module:
    """The classifier for ``cfg.model`` on ``cfg.task`` (or for ``kwargs``, a
    :func:`model_kwargs` of it); config mistakes become ConfigError."""
    try:
        return lra.models.build_classifier(**(kwargs or model_kwargs(cfg)), rngs=rngs)
    except (lra.models.RegistryError, TypeError, ValueError) as err:
        raise ConfigError(f"cannot build model {cfg.model.name!r}: {err}") from err


def _plain_softmax_kwargs(cfg) -> dict:
    """:func:`model_kwargs` with every softmax layer on the plain path (the same parameters)."""
    kwargs = model_kwargs(cfg)
    options = {k: dict(v or {}) for k, v in (kwargs["attention_options"] or {}).items()}
    options.setdefault("softmax", {})["implementation"] = "plain"
    return {**kwargs, "attention_options": options}


def count_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def cast_floats(tree, dtype):
    """Cast the floating-point leaves of ``tree`` to ``dtype``."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def _forward(graphdef, params, rest, batch, *, deterministic, rngs, dtype):
    # copy=True: fresh variables in this trace, so nnx.remat may write its state back
    model = nnx.merge(graphdef, cast_floats(params, dtype), rest, copy=True)
    args = [a for pair in zip(batch["tokens"], batch["lengths"], strict=True) for a in pair]
    logits = model(*args, deterministic=deterministic, rngs=rngs)
    return logits.astype(jnp.float32)


def _weighted_metrics(logits, batch):
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
    weights = batch["weights"]
    return jnp.sum(losses * weights), jnp.sum(correct * weights), jnp.sum(weights)


def _summed_over(fn, xs):
    """The sum of ``fn(x)`` (a pytree) over the leading axis of ``xs``, in a ``lax.scan``."""
    first = jax.tree.map(lambda x: x[0], xs)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, first))

    def add(totals, x):
        return jax.tree.map(jnp.add, totals, fn(x)), None

    return jax.lax.scan(add, zeros, xs)[0]


def _micro_batches(batch, grad_accum: int):
    """``batch`` as ``grad_accum`` micro-batches stacked on a new leading axis.

    Micro-batch ``k`` takes rows ``k, k + K, k + 2K, ...``: each device's rows of
    a batch sharded over ``data`` stay on that device, so every micro-batch is
    spread over all devices.
    """

    def split(x):
        return x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def make_steps(
    graphdef, rest, tx: optax.GradientTransformation, precision: str, grad_accum: int = 1
):
    """``(train_step, eval_step)`` for a model structure, optimizer and precision.

    With ``grad_accum = K > 1`` the train step runs the batch as K micro-batches
    in a ``lax.scan`` and sums their gradients: the update of the whole batch at
    about 1/K of the activation memory. (Dropout masks are drawn per micro-batch,
    so with dropout the result differs from K = 1 as another seed would.) The eval
    step sums its metrics over the same K micro-batches.
    """
    if precision not in PRECISIONS:
        raise ConfigError(
            f"unknown trainer.precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    dtype = PRECISIONS[precision]

    def loss_sums(params, batch, dropout_key):
        rngs = nnx.Rngs(dropout=dropout_key)  # created inside the traced function
        logits = _forward(
            graphdef, params, rest, batch, deterministic=False, rngs=rngs, dtype=dtype
        )
        loss_sum, correct, count = _weighted_metrics(logits, batch)
        return loss_sum, (correct, count)

    sums_and_grads = jax.value_and_grad(loss_sums, has_aux=True)

    def batch_gradients(params, batch, dropout_key):
        """Summed loss, correct count, weight count and summed gradients of the batch."""
        if grad_accum == 1:
            (loss_sum, (correct, count)), grads = sums_and_grads(params, batch, dropout_key)
            return loss_sum, correct, count, grads

        def micro_sums(micro):
            index, micro_batch = micro
            key = jax.random.fold_in(dropout_key, index)
            return sums_and_grads(params, micro_batch, key)

        micro = (jnp.arange(grad_accum), _micro_batches(batch, grad_accum))
        (loss_sum, (correct, count)), grads = _summed_over(micro_sums, micro)
        return loss_sum, correct, count, grads

    def train_step(state: TrainState, batch, key):
        dropout_key = jax.random.fold_in(key, state.step)
        loss_sum, correct, count, grad_sums = batch_gradients(state.params, batch, dropout_key)
        grads = jax.tree.map(lambda g: g / count, grad_sums)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss_sum / count,
            "accuracy": correct / count,
            "grad_norm": optax.tree.norm(grads),
        }
        return TrainState(params, opt_state, state.step + 1), metrics

    def eval_sums(params, batch):
        logits = _forward(graphdef, params, rest, batch, deterministic=True, rngs=None, dtype=dtype)
        loss_sum, correct, count = _weighted_metrics(logits, batch)
        return {"loss_sum": loss_sum, "correct": correct, "count": count}

    def eval_step(params, batch):
        """Summed loss, correct count and weight count of ``batch``: in ``grad_accum``
        micro-batches (a ``lax.scan``) like the train step, so that a batch which only
        fits in training as micro-batches is evaluated in as little memory."""
        rows = jax.tree.leaves(batch)[0].shape[0]
        if grad_accum == 1 or rows % grad_accum:
            return eval_sums(params, batch)
        return _summed_over(
            lambda micro: eval_sums(params, micro), _micro_batches(batch, grad_accum)
        )

    return train_step, eval_step


def abstract_batch(task_cfg, batch_size: int, sharding=None) -> dict:
    """The shapes and dtypes of a global batch of ``task_cfg`` (no data needed)."""
    num_inputs = 2 if task_cfg.get("dual", False) else 1
    length = int(task_cfg.max_length)

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return {
        "tokens": tuple(spec((batch_size, length), jnp.int32) for _ in range(num_inputs)),
        "lengths": tuple(spec((batch_size,), jnp.int32) for _ in range(num_inputs)),
        "labels": spec((batch_size,), jnp.int32),
        "weights": spec((batch_size,), jnp.float32),
    }


def compile_train_variant(
    cfg,
    topology,
    *,
    grad_accum: int,
    remat: bool,
    count_flops: bool = False,
    evaluate: bool = False,
) -> "Compiled":
    """``cfg`` with ``trainer.grad_accum`` and ``trainer.remat`` set, its train step (and
    with ``evaluate`` its eval step) compiled from shapes for ``topology``'s global batch
    (no data, nothing runs)."""
    variant = OmegaConf.merge(cfg, {"trainer": {"grad_accum": grad_accum, "remat": remat}})
    example = abstract_batch(variant.task, topology.global_batch, topology.batch_sharding)
    return compile_steps(
        variant, example, topology=topology, evaluate=evaluate, count_flops=count_flops
    )


def train_step_flops(compiled_train, grad_accum: int) -> float | None:
    """FLOPs of one train step: XLA's cost analysis, with the micro-batch loop counted.

    XLA counts the body of a ``lax.scan`` once, so with ``grad_accum = K`` the
    analysis covers one micro-batch plus the update; scaling by K counts every
    micro-batch (and the optimizer update, a small share, K times).
    """
    flops = measure.compiled_flops(compiled_train)
    return None if flops is None else flops * int(grad_accum)


def _formula_flops(cfg, state, example_batch, dropout_key, jit_options) -> float | None:
    """:func:`train_step_flops` of the model with its softmax layers on the plain path.

    The chunked path loops over query blocks, whose body XLA's cost analysis counts
    once; the fused paths (cuDNN, ``jax.nn.dot_product_attention``) are calls whose count
    is the kernel's estimate, not the formula's (on an H200 the bf16 Figure-1 Transformer
    on cuDNN counted 307 GFLOP per step at length 1024 and the float32 plain path 237,
    where on a CPU bf16 adds 5 % to the plain count). The plain path computes the same
    formula in plain operations, so its count is the model's (a path's backward
    recomputation is not counted: it is overhead).
    """
    model = build_model(cfg, nnx.Rngs(params=0), _plain_softmax_kwargs(cfg))
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    grad_accum = int(cfg.trainer.get("grad_accum", 1))
    step, _ = make_steps(
        graphdef, rest, make_optimizer(cfg.trainer), cfg.trainer.precision, grad_accum
    )
    lowered = jax.jit(step, **jit_options).lower(state, example_batch, dropout_key)
    return train_step_flops(lowered.compile(), grad_accum)


class Compiled(NamedTuple):
    """A freshly initialised train state and its ahead-of-time compiled steps."""

    state: TrainState  # placed (replicated) on the mesh's devices
    train_step: Any  # (state, batch, key) -> (state, metrics); donates state; None if not asked
    eval_step: Any  # (params, batch) -> {"loss_sum", "correct", "count"}
    dropout_key: jax.Array
    num_params: int
    compile_seconds: dict  # {"train": s, "eval": s[, "flops": s]}: lowering + compiling
    flops_per_step: float | None  # of the train step (XLA's count; None if not compiled)


def compile_steps(
    cfg,
    example_batch: dict,
    *,
    train: bool = True,
    evaluate: bool = True,
    topology=None,
    count_flops: bool = True,
) -> Compiled:
    """Build the model of ``cfg`` (seeded by ``cfg.seed``), init the optimizer, compile.

    Compiling here, before any timed work, keeps compilation out of every speed
    measurement and gives the compiled memory analysis and FLOPs up front.
    ``example_batch`` may be arrays or :func:`abstract_batch` shapes. With a
    ``topology`` (:mod:`lra.train.parallel`) the state is replicated on its mesh and the
    batch split over its ``data`` axis; without, everything is on the default device.
    ``train=False`` or ``evaluate=False`` leaves that step out (None). With softmax
    layers on a chunked or fused path, counting the FLOPs compiles the plain formula too
    (``_formula_flops``); ``count_flops=False`` skips that (``flops_per_step`` is then
    XLA's count as it is).
    """
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(int(cfg.seed))))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(cfg.trainer)
    grad_accum = int(cfg.trainer.get("grad_accum", 1))
    if grad_accum < 1:
        raise ConfigError(f"trainer.grad_accum must be at least 1, got {grad_accum}")
    train_step, eval_step = make_steps(graphdef, rest, tx, cfg.trainer.precision, grad_accum)
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    dropout_key = dropout_rng.dropout_key(cfg.seed, cfg.trainer.get("dropout_rng", "hash"))
    jit_options = {}
    if topology is not None:
        state, dropout_key = topology.replicate((state, dropout_key))
        jit_options["out_shardings"] = topology.replicated
    seconds, evaluator = {}, None
    if evaluate:
        start = time.perf_counter()
        evaluator = jax.jit(eval_step, **jit_options).lower(state.params, example_batch).compile()
        seconds["eval"] = time.perf_counter() - start
    if train:
        start = time.perf_counter()
        lowered = jax.jit(train_step, donate_argnums=0, **jit_options).lower(
            state, example_batch, dropout_key
        )
        train_step = lowered.compile()
        seconds["train"] = time.perf_counter() - start
        flops = train_step_flops(train_step, grad_accum)
        path = (softmax_implementations(cfg) or {}).get("train", "plain")
        if count_flops and path != "plain":
            # XLA counts the chunked path's loop once, and a fused attention call by the
            # kernel's own estimate: count the plain formula instead.
            start = time.perf_counter()
            flops = _formula_flops(cfg, state, example_batch, dropout_key, jit_options)
            seconds["flops"] = time.perf_counter() - start
    else:
        train_step, flops = None, None
    return Compiled(state, train_step, evaluator, dropout_key, count_params(params), seconds, flops)
