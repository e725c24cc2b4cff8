"""The in-memory form of one data split, shared by every task.

A split holds token arrays (one for single-input tasks, two for Retrieval),
their true lengths, and integer labels. Padding is described by the lengths
alone: a token id of 0 may be a real token (a black pixel), so nothing
downstream infers padding from token values.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """One split of a task.

    Attributes:
        inputs: tuple of integer arrays, each ``[N, L]`` (``L`` = the task's
            maximum length; positions at or past the length are padding).
        lengths: tuple of ``int32[N]`` arrays, one per input: the number of
            real tokens in each row.
        labels: ``int32[N]`` class ids.
    """

    inputs: tuple[np.ndarray, ...]
    lengths: tuple[np.ndarray, ...]
    labels: np.ndarray

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

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def max_length(self) -> int:
        return self.inputs[0].shape[1]
