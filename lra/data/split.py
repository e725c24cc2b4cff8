"""The in-memory form of one data split, shared by every task, and the held-out validation split.

A split holds token arrays (one for single-input tasks, two for Retrieval),
their true lengths, and integer labels. Padding is described by the lengths
alone: a token id of 0 may be a real token (a black pixel), so nothing
downstream infers padding from token values.

A loaded split also says where its rows come from: ``origin`` names the stored
split (``train``, ``val`` or ``test`` of the prepared store) and ``rows`` the
row of that stored split behind each example, so that two splits can be shown
to share no example (``(origin, row)`` pairs are the examples' identities).

:func:`hold_out` carves a validation split out of a training split for tasks
whose data has no validation split of its own (LRA Text / IMDB): a permutation
seeded by :data:`VAL_SPLIT_SEED`, fixed and independent of the run seed, so
every seed of every model is selected on the same examples; rows identical to a
held-out row go with it, so train and val share no example.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

#: Seed of the permutation that picks the held-out validation rows (``task.val_source=train``).
#: Fixed on purpose: not the run seed, so all runs of a task select on the same examples.
VAL_SPLIT_SEED = 0


@dataclass(frozen=True)
class Split:
    """One split of a task.

    Attributes:
        inputs: tuple of integer arrays, each ``[N, L]`` (``L`` = the task's
            maximum length; positions at or past the length are padding).
        lengths: tuple of ``int32[N]`` arrays, one per input: the number of
            real tokens in each row.
        labels: ``int32[N]`` class ids.
        origin: the stored split these rows were read from (``"train"``,
            ``"val"``, ``"test"``), or None when unknown.
        rows: ``int64[N]``, the row of ``origin`` behind each example, or None.
    """

    inputs: tuple[np.ndarray, ...]
    lengths: tuple[np.ndarray, ...]
    labels: np.ndarray
    origin: str | None = None
    rows: np.ndarray | None = None

    def __post_init__(self):
        if len(self.inputs) != len(self.lengths):
            raise ValueError("Split needs one lengths array per inputs array")
        n = len(self.labels)
        for tokens, lengths in zip(self.inputs, self.lengths, strict=True):
            if tokens.ndim != 2 or tokens.shape[0] != n or lengths.shape != (n,):
                raise ValueError(
                    f"Split arrays disagree: labels {self.labels.shape}, "
                    f"tokens {tokens.shape}, lengths {lengths.shape}"
                )
        if self.rows is not None and np.shape(self.rows) != (n,):
            raise ValueError(f"Split rows {np.shape(self.rows)} disagree with labels {(n,)}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def max_length(self) -> int:
        return self.inputs[0].shape[1]

    def with_origin(self, origin: str) -> "Split":
        """This split, marked as rows ``0..N-1`` of the stored split ``origin`` (no copy)."""
        return Split(self.inputs, self.lengths, self.labels, origin, np.arange(len(self)))

    def take(self, index: np.ndarray) -> "Split":
        """The rows ``index`` of this split, copied into memory; origin and rows follow."""
        index = np.asarray(index, np.int64)
        return Split(
            inputs=tuple(np.ascontiguousarray(t[index]) for t in self.inputs),
            lengths=tuple(np.asarray(n[index], np.int32) for n in self.lengths),
            labels=np.asarray(self.labels[index], np.int32),
            origin=self.origin,
            rows=None if self.rows is None else np.asarray(self.rows)[index],
        )


def num_held_out(num: int, fraction: float) -> int:
    """How many of ``num`` training rows the permutation of :func:`hold_out` puts in validation."""
    return int(round(num * fraction))


def row_digests(split: Split) -> list[bytes]:
    """One digest per row of what a model sees: every input's tokens and length."""
    digests = []
    for i in range(len(split)):
        h = hashlib.blake2b(digest_size=16)
        for tokens, lengths in zip(split.inputs, split.lengths, strict=True):
            h.update(np.int64(lengths[i]).tobytes())
            h.update(np.ascontiguousarray(tokens[i]).tobytes())
        digests.append(h.digest())
    return digests


def hold_out_indices(
    split: Split, fraction: float, seed: int = VAL_SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` row indices of ``split``, each sorted, together every row once.

    val is the first :func:`num_held_out` rows of the permutation of
    ``range(len(split))`` drawn by ``np.random.default_rng(seed)`` (so a larger
    fraction holds out a superset of a smaller one's rows), plus every other row
    identical to one of them (same tokens and lengths: data sets such as IMDB
    hold exact duplicates), so that no example is both trained and validated on.
    train is the rest.
    """
    num = len(split)
    num_val = num_held_out(num, fraction)
    if not 0 < num_val < num:
        raise ValueError(
            f"holding out {fraction} of {num} examples leaves {num_val} for validation and "
            f"{num - num_val} for training; both need at least one"
        )
    order = np.random.default_rng(seed).permutation(num)
    digests = row_digests(split)
    held = {digests[i] for i in order[:num_val]}
    is_val = np.fromiter((d in held for d in digests), bool, num)
    if is_val.all():
        raise ValueError(f"every one of the {num} examples duplicates a held-out one")
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def hold_out(split: Split, fraction: float, seed: int = VAL_SPLIT_SEED) -> tuple[Split, Split]:
    """``(train, val)``: ``split`` minus a seeded ``fraction`` of its rows, and those rows
    (:func:`hold_out_indices`).

    Both are copies in memory (together the size of ``split``'s tokens at the
    loaded length: 50 MB for IMDB at 1000 bytes, 200 MB at 4000).
    """
    train, val = hold_out_indices(split, fraction, seed)
    return split.take(train), split.take(val)
