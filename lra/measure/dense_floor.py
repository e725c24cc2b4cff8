"""The dense-layer floor of a train step: attention mechanisms that keep the projections of
attention without the attention (``scripts/dense_floor.py``).

Issue 15 asks the linear-attention models to train at 1.5x a plain PyTorch twin on the CPU.
Their train step is mostly dense layers (Q/K/V/output projections and the MLP). With every
layer's mechanism replaced by ``value_only`` (``out(V + 0 * (Q + K))``: the four projections
forward and backward, no mixing over positions; ``0 * (Q + K)`` keeps Q and K in the gradient,
as floats are not folded), the step's time is the floor no attention implementation can beat.
FLASH and FLASH_quad, whose gated unit replaces the MLP, get ``gau_value_only``: the unit's
projections (U, V, the shared Z and its offset/scales) and ``out(U * V)``.

Nothing is registered on import: :func:`register_floor` adds both names to the registry
(idempotent); the programs and tests that build a floor call it.
"""

from __future__ import annotations

from lra.models.attention.common import MultiHeadAttention
from lra.models.attention.flash import FlashAttention
from lra.models.registry import names, register

FLOOR = "value_only"
GAU_FLOOR = "gau_value_only"
# The overrides that turn a model of configs/model into its floor (every layer value_only);
# a model of gated attention units (FLASH: no MLP) gets gau_value_only instead.
FLOOR_OVERRIDES = (f"model.attention={FLOOR}", "model.attention_options={}")
GAU_FLOOR_OVERRIDES = (f"model.attention={GAU_FLOOR}", "model.attention_options={}")
GAU_MODELS = ("flash", "flash_quad")


class ValueOnly(MultiHeadAttention):
    """out(V + 0 * (Q + K)): the projections of attention without the attention.

    x float[B, L, D] -> float[B, L, D]; Q, K, V float[B, L, H, d] as every mechanism's.
    Padding is not excluded (nothing mixes positions, so nothing reads a padded key).
    """

    kind = FLOOR
    memory_class = "linear"
    same_without_padding = True

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        self._check_call(x, mask, deterministic, rngs)
        q, k, v = self._qkv(x)
        return self.out(self._merge(v + 0 * (q + k)))


class GatedValueOnly(FlashAttention):
    """FLASH's gated unit without attention: out(U * (V + 0 * sum of the Z parts)).

    Keeps every projection of the unit (U, V, the shared Z and its four offset/scales) forward
    and backward, with FLASH's default sizes (expansion 2, shared_dim 128). x float[B, L, D]
    -> float[B, L, D]; U, V float[B, L, e], the Z parts float[B, L, s].
    """

    kind = GAU_FLOOR

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        self._check_call(x, mask, deterministic, rngs)
        u, v, parts = self._project(x)
        return self.out(u * (v + 0 * sum(part.sum(-1, keepdims=True) for part in parts)))


def register_floor() -> None:
    """Register ``value_only`` and ``gau_value_only`` (a second call does nothing)."""
    for name, cls in ((FLOOR, ValueOnly), (GAU_FLOOR, GatedValueOnly)):
        if name not in names():
            register(name)(cls)


def floor_overrides(model: str) -> tuple[str, ...]:
    """The overrides that make ``model``'s floor."""
    return GAU_FLOOR_OVERRIDES if model in GAU_MODELS else FLOOR_OVERRIDES
