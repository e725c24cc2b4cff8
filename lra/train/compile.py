"""Ahead-of-time compilation of the steps, and their FLOPs.

:func:`compile_steps` builds the model of a config (seeded by ``cfg.seed``), initialises
the optimizer and compiles the train and eval steps of :mod:`lra.train.steps` from
shapes (:func:`abstract_batch`) or arrays, before any timed work: compilation is never
timed and the compiled memory analysis and FLOPs are known before step 1.
:func:`compile_train_variant` does the same for a ``grad_accum``/``remat`` variant (the
pre-flight's search); :func:`train_step_flops` counts a train step's FLOPs.

Dropout keys use ``trainer.dropout_rng`` (:mod:`lra.train.dropout_rng`; default "hash", a
counter-based hash far cheaper than JAX's generators on CPU), and a run stays a function
of its seed. Parameter initialisation uses JAX's default generator.
"""

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from omegaconf import OmegaConf

from lra.device import measure
from lra.train import dropout_rng
from lra.train.describe import softmax_implementations
from lra.train.model import (
    build_model,
    count_params,
    plain_softmax_kwargs,
    pretraining,
    split_model,
)
from lra.train.optim import make_optimizer
from lra.train.steps import TrainState, make_steps


def abstract_batch(task_cfg, batch_size: int, sharding=None) -> dict:
    """The shapes and dtypes of a global batch of ``task_cfg`` (no data needed)."""
    num_inputs = 2 if task_cfg.dual else 1
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
    model = build_model(cfg, nnx.Rngs(params=0), plain_softmax_kwargs(cfg))
    graphdef, _, rest = split_model(model)
    grad_accum = int(cfg.trainer.grad_accum)
    step, _ = make_steps(
        graphdef,
        rest,
        make_optimizer(cfg.trainer),
        cfg.trainer.precision,
        grad_accum,
        pretraining(cfg),
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
    graphdef, params, rest = split_model(model)
    tx = make_optimizer(cfg.trainer)
    grad_accum = int(cfg.trainer.grad_accum)
    train_step, eval_step = make_steps(
        graphdef, rest, tx, cfg.trainer.precision, grad_accum, pretraining(cfg)
    )
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    dropout_key = dropout_rng.dropout_key(cfg.seed, cfg.trainer.dropout_rng)
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
