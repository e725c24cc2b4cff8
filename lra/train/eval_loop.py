"""Evaluating parameters on a split: the loop the trainer's validation, its test and
``lra-eval`` share, so they give the same numbers for the same parameters and batches.
"""

import jax
import numpy as np

from lra.data.pipeline import eval_batches, prefetch


def evaluate(
    eval_step, params, split, batch_size: int, max_batches=None, timer=None, topology=None
) -> dict:
    """Accuracy and mean loss of ``params`` on ``split`` (all of it unless ``max_batches``).

    ``eval_step(params, batch) -> {"loss_sum", "correct", "count"}`` (scalars, summed over
    the batch's real rows); ``timer`` (a :class:`lra.device.measure.WindowTimer`) times
    the pass as one window. With a ``topology`` each process reads its rows of every
    batch and the step's sums cover the whole global batch, so every process gets the
    same totals.
    """
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    outs, steps = [], 0
    shards, put = (
        ({}, jax.device_put) if topology is None else (topology.shard_args(), topology.put)
    )
    if timer is not None:
        timer.start()
    batches = eval_batches(split, batch_size, max_batches=max_batches, **shards)
    for batch in prefetch(batches, put=put):
        outs.append(eval_step(params, batch))
        steps += 1
    outs = jax.device_get(outs)
    if timer is not None:
        timer.stop(steps)
    for out in outs:
        for k in totals:
            totals[k] += float(out[k])
    return {
        "accuracy": totals["correct"] / totals["count"],
        "loss": totals["loss_sum"] / totals["count"],
    }


def majority_rate(labels: np.ndarray) -> float:
    """Accuracy of always predicting the most common label (the floor a model must beat)."""
    return float(np.bincount(labels).max() / len(labels))
