"""Building the classifier from configs, and the pure train and eval steps.

The train state is plain data, ``TrainState(params, opt_state, step)``; the
model's structure (an NNX graph definition) stays outside it, so
``train_step(state, batch, key) -> (state, metrics)`` is a pure function that
is jitted once with the state donated. Dropout keys are
``fold_in(key, step)``, so a run is a function of its seed.

Dropout keys use JAX's "rbg" generator: it compiles far faster than the default
threefry on CPU (seconds per train step), and a run stays a function of its seed
on a given backend. Parameter initialisation uses the default generator.

Batches are the dicts of :mod:`lra.data.pipeline`: ``tokens`` and ``lengths``
are tuples (two entries for the dual-encoder Retrieval task), ``labels`` is
``int32[B]`` and ``weights`` is ``float32[B]`` (0 for filler rows).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from omegaconf import OmegaConf

import models
from lra.errors import ConfigError
from lra.optim import make_optimizer

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
    )


def attention_sources(cfg) -> dict[str, str]:
    """Mechanism name -> where its class comes from (``module:Class``, plus the package and
    version for an entry point), for every mechanism the model's layers use."""
    kwargs = model_kwargs(cfg)
    schedule = models.resolve_schedule(kwargs["attention"], int(kwargs["num_layers"]))
    return {name: models.registry.source(name) for name in sorted(set(schedule))}


def build_model(cfg, rngs: nnx.Rngs) -> nnx.Module:
    """The classifier for ``cfg.model`` on ``cfg.task``; config mistakes become ConfigError."""
    try:
        return models.build_classifier(**model_kwargs(cfg), rngs=rngs)
    except (models.RegistryError, TypeError, ValueError) as err:
        raise ConfigError(f"cannot build model {cfg.model.name!r}: {err}") from err


def count_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def cast_floats(tree, dtype):
    """Cast the floating-point leaves of ``tree`` to ``dtype``."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def _forward(graphdef, params, rest, batch, *, deterministic, rngs, dtype):
    model = nnx.merge(graphdef, cast_floats(params, dtype), rest)
    args = [a for pair in zip(batch["tokens"], batch["lengths"], strict=True) for a in pair]
    logits = model(*args, deterministic=deterministic, rngs=rngs)
    return logits.astype(jnp.float32)


def _weighted_metrics(logits, batch):
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
    weights = batch["weights"]
    return jnp.sum(losses * weights), jnp.sum(correct * weights), jnp.sum(weights)


def make_steps(graphdef, rest, tx: optax.GradientTransformation, precision: str):
    """``(train_step, eval_step)`` for a model structure, optimizer and precision."""
    if precision not in PRECISIONS:
        raise ConfigError(
            f"unknown trainer.precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    dtype = PRECISIONS[precision]

    def train_step(state: TrainState, batch, key):
        dropout_key = jax.random.fold_in(key, state.step)

        def loss_fn(params):
            rngs = nnx.Rngs(dropout=dropout_key)  # created inside the traced function
            logits = _forward(
                graphdef, params, rest, batch, deterministic=False, rngs=rngs, dtype=dtype
            )
            loss_sum, correct, count = _weighted_metrics(logits, batch)
            return loss_sum / count, correct / count

        (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, opt_state, state.step + 1), metrics

    def eval_step(params, batch):
        logits = _forward(graphdef, params, rest, batch, deterministic=True, rngs=None, dtype=dtype)
        loss_sum, correct, count = _weighted_metrics(logits, batch)
        return {"loss_sum": loss_sum, "correct": correct, "count": count}

    return train_step, eval_step


class Compiled(NamedTuple):
    """A freshly initialised train state and its ahead-of-time compiled steps."""

    state: TrainState
    train_step: Any  # (state, batch, key) -> (state, metrics); donates state; None if not asked
    eval_step: Any  # (params, batch) -> {"loss_sum", "correct", "count"}
    dropout_key: jax.Array
    num_params: int


def compile_steps(cfg, example_batch: dict, *, train: bool = True) -> Compiled:
    """Build the model of ``cfg`` (seeded by ``cfg.seed``), init the optimizer, compile.

    Compiling here, before any timed work, keeps compilation out of every speed
    measurement and gives the compiled memory analysis and FLOPs up front.
    ``train=False`` compiles the eval step only (``train_step`` is None).
    """
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(int(cfg.seed))))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(cfg.trainer)
    train_step, eval_step = make_steps(graphdef, rest, tx, cfg.trainer.precision)
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    dropout_key = jax.random.key(int(cfg.seed), impl="rbg")
    evaluate = jax.jit(eval_step).lower(state.params, example_batch).compile()
    if train:
        lowered = jax.jit(train_step, donate_argnums=0).lower(state, example_batch, dropout_key)
        train_step = lowered.compile()
    else:
        train_step = None
    return Compiled(state, train_step, evaluate, dropout_key, count_params(params))
