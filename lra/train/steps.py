"""The pure train and eval steps.

The train state is plain data, ``TrainState(params, opt_state, step)``; the
model's structure (an NNX graph definition) stays outside it, so
``train_step(state, batch, key) -> (state, metrics)`` is a pure function that
is jitted once with the state donated (:mod:`lra.train.compile` compiles it ahead
of time). Dropout keys are ``fold_in(key, step)``, so a run is a function of its seed; a
micro-batch's key draws its rows of the whole batch's masks
(:func:`lra.train.dropout_rng.batch_rows`), so ``grad_accum`` changes memory, not masks.

``params`` is the model's ``nnx.Param`` and ``nnx.BatchStat`` variables
(:func:`lra.train.model.split_model`): a masked BatchNorm's running statistics
(lra.models.masked_batch_norm) live beside the weights, so checkpoints, the best-validation
copy and the pretraining hand-off carry them. They get no gradient and take no optimizer
update: the train step sets them to the values its forward pass computed (under
``grad_accum`` the mean of the micro-batches'), in float32 whatever the precision.

Batches are the dicts of :mod:`lra.data.pipeline`: ``tokens`` and ``lengths``
are tuples (two entries for the dual-encoder Retrieval task) of ``int32[B, L]`` and
``int32[B]``, ``labels`` is ``int32[B]`` and ``weights`` is ``float32[B]`` (0 for filler
rows). Logits are ``float32[B, num_classes]``.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lra.config.schema import check_value
from lra.train.dropout_rng import batch_rows

PRECISIONS = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array


def cast_floats(tree, dtype):
    """Cast the floating-point leaves of ``tree`` to ``dtype``."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def _forward(graphdef, params, rest, batch, *, deterministic, rngs, dtype):
    """``(logits float32[...], batch_stats)``: the model's output and its BatchNorm running
    statistics after the call (an empty State for a model without BatchNorm)."""
    weights, stats = nnx.split_state(params, nnx.Param, ...)
    # copy=True: fresh variables in this trace, so a BatchNorm may write its statistics
    model = nnx.merge(graphdef, cast_floats(weights, dtype), stats, rest, copy=True)
    args = [a for pair in zip(batch["tokens"], batch["lengths"], strict=True) for a in pair]
    logits = model(*args, deterministic=deterministic, rngs=rngs)
    return logits.astype(jnp.float32), nnx.state(model, nnx.BatchStat)


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


def _summed_and_stacked(fn, xs):
    """``fn(x) -> (sums, rows)`` over the leading axis of ``xs`` in a ``lax.scan``: the sums
    added up, the rows stacked on a new leading axis."""
    first = jax.tree.map(lambda x: x[0], xs)
    sums_shape = jax.eval_shape(fn, first)[0]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)

    def add(totals, x):
        sums, rows = fn(x)
        return jax.tree.map(jnp.add, totals, sums), rows

    return jax.lax.scan(add, zeros, xs)


def _unstack_micro_batches(x):
    """The inverse of :func:`_micro_batches` for one array: ``[K, B/K, ...] -> [B, ...]``
    with row ``k + K * j`` taken from micro-batch ``k``, row ``j``."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


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
    graphdef,
    rest,
    tx: optax.GradientTransformation,
    precision: str,
    grad_accum: int = 1,
    objective=None,
):
    """``(train_step, eval_step)`` for a model structure, optimizer and precision.

    With ``grad_accum = K > 1`` the train step runs the batch as K micro-batches
    in a ``lax.scan`` and sums their gradients: the update of the whole batch at
    about 1/K of the activation memory. Micro-batch k draws rows k, k + K, ... of
    the whole batch's dropout masks (:func:`lra.train.dropout_rng.batch_rows`), so
    with the ``hash`` generator the losses are the full batch's up to float rounding
    (with ``rbg``/``threefry`` the masks differ, as another seed's would). The eval
    step sums its metrics over the same K micro-batches.

    ``objective`` (a :class:`lra.train.objective.Pretraining`, or None for classification)
    turns the whole batch into inputs and per-position targets before it is cut into
    micro-batches (masks keyed by the step), and sums the loss over the positions it counts.
    """
    check_value("trainer.precision", precision)
    dtype = PRECISIONS[precision]
    weighted_metrics = _weighted_metrics if objective is None else objective.metrics

    def loss_sums(params, batch, dropout_key):
        rngs = nnx.Rngs(dropout=dropout_key)  # created inside the traced function
        logits, stats = _forward(
            graphdef, params, rest, batch, deterministic=False, rngs=rngs, dtype=dtype
        )
        loss_sum, correct, count = weighted_metrics(logits, batch)
        return loss_sum, (correct, count, stats)

    sums_and_grads = jax.value_and_grad(loss_sums, has_aux=True)

    def batch_gradients(params, batch, dropout_key):
        """Summed loss, correct count, weight count, new BatchNorm statistics and summed
        gradients of the batch."""
        if grad_accum == 1:
            (loss_sum, (correct, count, stats)), grads = sums_and_grads(params, batch, dropout_key)
            return loss_sum, correct, count, stats, grads

        def micro_sums(micro):
            index, micro_batch = micro
            key = batch_rows(dropout_key, index, grad_accum)  # rows index + K * b
            return sums_and_grads(params, micro_batch, key)

        micro = (jnp.arange(grad_accum), _micro_batches(batch, grad_accum))
        (loss_sum, (correct, count, stats)), grads = _summed_over(micro_sums, micro)
        stats = jax.tree.map(lambda total: total / grad_accum, stats)  # the micro-batches' mean
        return loss_sum, correct, count, stats, grads

    def train_step(state: TrainState, batch, key):
        dropout_key = jax.random.fold_in(key, state.step)
        if objective is not None:
            batch = objective.prepare(batch, objective.key(state.step))
        loss_sum, correct, count, stats, grad_sums = batch_gradients(
            state.params, batch, dropout_key
        )
        if objective is not None:  # a batch may, rarely, mask no position
            count = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g / count, grad_sums)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if jax.tree.leaves(stats):  # a BatchNorm's statistics: the forward pass's, no update
            params = nnx.merge_state(params, stats)
        metrics = {
            "loss": loss_sum / count,
            "accuracy": correct / count,
            "grad_norm": optax.tree.norm(grads),
        }
        return TrainState(params, opt_state, state.step + 1), metrics

    def eval_outputs(params, batch):
        """``(sums, rows)``: the batch's summed metrics, and a classifier's per-row logits
        and predicted class (empty for a pretraining objective, whose logits are per token)."""
        logits, _ = _forward(
            graphdef, params, rest, batch, deterministic=True, rngs=None, dtype=dtype
        )
        loss_sum, correct, count = weighted_metrics(logits, batch)
        sums = {"loss_sum": loss_sum, "correct": correct, "count": count}
        if objective is not None:
            return sums, {}
        return sums, {"logits": logits, "pred": jnp.argmax(logits, -1).astype(jnp.int32)}

    def eval_step(params, batch):
        """Summed loss, correct count and weight count of ``batch``, and for a classifier
        ``logits float32[B, C]`` and ``pred int32[B]`` per row (the argmax the correct count
        uses, so accuracy from the rows equals the sums'). In ``grad_accum`` micro-batches (a
        ``lax.scan``) like the train step, so that a batch which only fits in training as
        micro-batches is evaluated in as little memory; the rows come back in batch order."""
        if objective is not None:
            batch = objective.prepare(batch, objective.key())
        rows = jax.tree.leaves(batch)[0].shape[0]
        if grad_accum == 1 or rows % grad_accum:
            sums, per_row = eval_outputs(params, batch)
            return {**sums, **per_row}
        sums, per_row = _summed_and_stacked(
            lambda micro: eval_outputs(params, micro), _micro_batches(batch, grad_accum)
        )
        return {**sums, **jax.tree.map(_unstack_micro_batches, per_row)}

    return train_step, eval_step
