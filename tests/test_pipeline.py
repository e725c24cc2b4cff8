import itertools

import numpy as np
import pytest

from lra.data.pipeline import eval_batches, prefetch, train_batches
from lra.data.split import Split
from lra.errors import DataError


def make_split(n=10, length=6):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 16, size=(n, length)).astype(np.uint8)
    lengths = rng.integers(1, length + 1, size=n).astype(np.int32)
    return Split(inputs=(tokens,), lengths=(lengths,), labels=np.arange(n, dtype=np.int32))


def labels_of(batches, count):
    return [b["labels"].tolist() for b in itertools.islice(batches, count)]


def test_train_batches_are_seeded_and_cover_each_epoch_once():
    split = make_split(10)
    first = labels_of(train_batches(split, 3, seed=7), 6)
    assert first == labels_of(train_batches(split, 3, seed=7), 6)
    assert first != labels_of(train_batches(split, 3, seed=8), 6)
    epoch0, epoch1 = sum(first[:3], []), sum(first[3:], [])
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9  # 3 batches of 3, 1 dropped
    assert epoch0 != epoch1


def test_train_batches_dtypes_and_start_step():
    split = make_split(10)
    batch = next(train_batches(split, 4, seed=0))
    assert batch["tokens"][0].dtype == np.int32 and batch["tokens"][0].shape == (4, 6)
    assert batch["weights"].tolist() == [1, 1, 1, 1]
    full = labels_of(train_batches(split, 3, seed=1), 7)
    assert labels_of(train_batches(split, 3, seed=1, start_step=4), 3) == full[4:7]


def test_shards_partition_the_global_batch():
    split = make_split(12)
    whole = labels_of(train_batches(split, 4, seed=3), 5)
    parts = [
        labels_of(train_batches(split, 4, seed=3, shard_index=i, shard_count=2), 5) for i in (0, 1)
    ]
    assert [a + b for a, b in zip(*parts, strict=True)] == whole
    with pytest.raises(DataError, match="divisible"):
        next(train_batches(split, 3, seed=0, shard_count=2))


def test_eval_batches_cover_every_example_once_with_filler_weights():
    split = make_split(10)
    batches = list(eval_batches(split, 4))
    assert len(batches) == 3
    labels = np.concatenate([b["labels"] for b in batches])
    weights = np.concatenate([b["weights"] for b in batches])
    assert labels[weights == 1].tolist() == list(range(10))
    assert weights.tolist() == [1] * 10 + [0, 0]
    assert len(list(eval_batches(split, 4, max_batches=2))) == 2


def test_too_small_training_split_is_a_clear_error():
    with pytest.raises(DataError, match="trainer.batch_size"):
        next(train_batches(make_split(3), 4, seed=0))


def test_prefetch_yields_in_order_and_reraises():
    split = make_split(8)
    direct = [b["labels"].tolist() for b in eval_batches(split, 2)]
    fetched = [np.asarray(b["labels"]).tolist() for b in prefetch(eval_batches(split, 2))]
    assert fetched == direct

    def broken():
        yield next(eval_batches(split, 2))
        raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError, match="disk went away"):
        list(prefetch(broken()))
