"""One batch pipeline for every task.

A batch is a dict of NumPy arrays (a pytree):

* ``tokens``: tuple of ``int32[B, L]`` (one entry, or two for Retrieval),
* ``lengths``: tuple of ``int32[B]``, the real length of each row,
* ``labels``: ``int32[B]``,
* ``weights``: ``float32[B]``, 1 for a real example and 0 for the filler rows
  that pad the last evaluation batch to the fixed batch size (so every batch has
  one shape and the step compiles once).

Training batches are drawn from a seeded permutation per epoch, so the same
seed gives the same data order; each process of a multi-host run takes its own
shard of every global batch. :func:`prefetch` moves batches to the device from
a background thread so the host work overlaps the device work.
"""

import queue
import threading
from collections.abc import Iterable, Iterator

import jax
import numpy as np

from lra.data.split import Split
from lra.errors import DataError


def _gather(split: Split, index: np.ndarray, weights: np.ndarray) -> dict:
    return {
        "tokens": tuple(np.asarray(t[index], dtype=np.int32) for t in split.inputs),
        "lengths": tuple(np.asarray(n[index], dtype=np.int32) for n in split.lengths),
        "labels": np.asarray(split.labels[index], dtype=np.int32),
        "weights": weights.astype(np.float32),
    }


def _check_shard(batch_size: int, shard_index: int, shard_count: int) -> int:
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if batch_size % shard_count:
        raise DataError(
            f"batch_size {batch_size} is not divisible by the {shard_count} processes; "
            "set trainer.batch_size to a multiple of the process count"
        )
    return batch_size // shard_count


def train_batches(
    split: Split,
    batch_size: int,
    seed: int,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    start_step: int = 0,
) -> Iterator[dict]:
    """Endless shuffled batches; epoch ``e`` uses the permutation of ``(seed, e)``.

    ``batch_size`` is the global batch; this process gets rows
    ``[shard_index * B/shard_count, (shard_index + 1) * B/shard_count)`` of each
    global batch. ``start_step`` skips ahead (for resumed runs) without drawing
    the skipped batches.
    """
    local = _check_shard(batch_size, shard_index, shard_count)
    n = len(split)
    if n < batch_size:
        raise DataError(
            f"the training split has {n} examples, fewer than trainer.batch_size={batch_size}; "
            "lower trainer.batch_size or prepare more data"
        )
    per_epoch = n // batch_size
    ones = np.ones(local, np.float32)
    step = start_step
    while True:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for b in range(offset, per_epoch):
            rows = order[b * batch_size : (b + 1) * batch_size]
            yield _gather(split, rows[shard_index * local : (shard_index + 1) * local], ones)
        step = (epoch + 1) * per_epoch


def eval_batches(
    split: Split,
    batch_size: int,
    *,
    max_batches: int | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
) -> Iterator[dict]:
    """Every example once, in order; the last batch is filled with weight-0 rows."""
    local = _check_shard(batch_size, shard_index, shard_count)
    n = len(split)
    num_batches = -(-n // batch_size)
    if max_batches is not None:
        num_batches = min(num_batches, max_batches)
    for b in range(num_batches):
        rows = np.arange(b * batch_size, (b + 1) * batch_size)
        rows = rows[shard_index * local : (shard_index + 1) * local]
        weights = (rows < n).astype(np.float32)
        yield _gather(split, np.minimum(rows, n - 1), weights)


def prefetch(batches: Iterable[dict], size: int = 2, put=jax.device_put) -> Iterator:
    """Put batches on the device from a background thread, ``size`` batches ahead.

    ``put`` places one batch (default: the default device; a run's
    :meth:`lra.train.parallel.Topology.put` splits it over the mesh).
    """
    buffer: queue.Queue = queue.Queue(maxsize=size)
    done = object()
    stop = threading.Event()

    def produce():
        try:
            for batch in batches:
                if stop.is_set():
                    return
                buffer.put(put(batch))
        except BaseException as err:  # handed to the consumer
            buffer.put(err)
            return
        buffer.put(done)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                buffer.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)
