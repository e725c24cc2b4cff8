"""Evaluating parameters on a split: the loop the trainer's validation, its test and
``lra-eval`` share, so they give the same numbers for the same parameters and batches.
"""

import jax
import numpy as np

from lra.data.pipeline import eval_batches, prefetch


def evaluate(
    eval_step,
    params,
    split,
    batch_size: int,
    max_batches=None,
    timer=None,
    topology=None,
    keep_rows: bool = False,
) -> dict:
    """Accuracy and mean loss of ``params`` on ``split`` (all of it unless ``max_batches``).

    ``eval_step(params, batch) -> {"loss_sum", "correct", "count", "logits", "pred"}``
    (scalars summed over the batch's real rows, and per-row ``float32[B, C]`` logits and
    ``int32[B]`` predicted classes); ``timer`` (a :class:`lra.device.measure.WindowTimer`)
    times the pass as one window. With a ``topology`` each process reads its rows of every
    batch and the step's sums cover the whole global batch, so every process gets the
    same totals.

    ``keep_rows`` adds ``"rows"``: the per-example predictions of the examples evaluated
    (``index`` into the split, ``label``, ``pred``, ``logits``; filler rows dropped), the
    whole global batch's on every process, for :mod:`lra.record.predictions`.
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
        out = eval_step(params, batch)
        if not keep_rows:
            out = {k: out[k] for k in totals}
        outs.append(out)
        steps += 1
    if topology is not None and keep_rows:
        outs = [{**o, **topology.gather({k: o[k] for k in ("logits", "pred")})} for o in outs]
    outs = jax.device_get(outs)
    if timer is not None:
        timer.stop(steps)
    for out in outs:
        for k in totals:
            totals[k] += float(out[k])
    result = {
        "accuracy": totals["correct"] / totals["count"],
        "loss": totals["loss_sum"] / totals["count"],
    }
    if keep_rows:
        result["rows"] = _rows(split, outs, int(totals["count"]))
    return result


def _rows(split, outs: list[dict], count: int) -> dict:
    """The evaluated examples' predictions in split order, the filler rows of the last
    batch (weight 0) dropped: the first ``count`` rows of the batches, which
    :func:`lra.data.pipeline.eval_batches` takes in order."""
    logits = np.concatenate([np.asarray(o["logits"]) for o in outs])[:count]
    pred = np.concatenate([np.asarray(o["pred"]) for o in outs])[:count]
    index = np.arange(count)
    return {
        "index": index,
        "label": np.asarray(split.labels)[index],
        "pred": pred,
        "logits": logits,
    }


def majority_rate(labels: np.ndarray) -> float:
    """Accuracy of always predicting the most common label (the floor a model must beat)."""
    return float(np.bincount(labels).max() / len(labels))
