"""The encoder's normalisation: which norm, and where it sits in a block (issue 27).

``norm``:
    ``layer``  LayerNorm (Ba et al. 2016) per token: the LRA encoder's, the default.
    ``batch``  BatchNorm over the batch's real tokens (:mod:`lra.models.masked_batch_norm`):
               S4's, S5's and LRU's, and TransNormer's authors' on some tasks (their
               ``norm: batch``, ``torch.nn.BatchNorm1d``; per-GPU statistics there,
               synchronised over the mesh here).

``norm_position``:
    ``pre``    x + f(norm(x)) per sublayer, and a final norm after the last block (the LRA
               encoder's and S4's; S5's ``prenorm=True`` has no final norm).
    ``post``   norm(x + f(x)) per sublayer and no final norm (the last block's output is
               already normalised): the original Transformer's and S4's ``prenorm=False``
               (state-spaces/s4 ``src/models/sequence/backbones/model.py``: the final norm is
               the identity unless pre-norm).

Shapes: ``x: float[B, L, D]``, ``mask: bool[B, L]``.
"""

from __future__ import annotations

import jax
from flax import nnx

from lra.models.masked_batch_norm import MaskedBatchNorm

__all__ = ["NORMS", "NORM_POSITIONS", "check_norm", "make_norm", "normalize"]

NORMS = ("layer", "batch")
NORM_POSITIONS = ("pre", "post")


def check_norm(norm: str, norm_position: str) -> None:
    """A one-line ValueError for a norm or position that is not offered."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {norm!r}")
    if norm_position not in NORM_POSITIONS:
        raise ValueError(
            f"norm_position must be one of {', '.join(NORM_POSITIONS)}; got {norm_position!r}"
        )


def make_norm(norm: str, dim: int, *, momentum: float = 0.9, rngs: nnx.Rngs) -> nnx.Module:
    """A LayerNorm or a masked BatchNorm over ``dim`` channels (``momentum``: its running
    statistics', Flax's convention)."""
    if norm == "batch":
        return MaskedBatchNorm(dim, momentum=momentum, rngs=rngs)
    return nnx.LayerNorm(dim, rngs=rngs)


def normalize(norm: nnx.Module, x: jax.Array, mask: jax.Array, *, deterministic: bool):
    """``norm`` applied to ``x``: a BatchNorm takes its statistics from the real tokens of the
    batch in training (``deterministic=False``) and uses its running ones otherwise."""
    if isinstance(norm, MaskedBatchNorm):
        return norm(x, mask, use_running_average=deterministic)
    return norm(x)
