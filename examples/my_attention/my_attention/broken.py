"""A deliberately broken mechanism: squared-ReLU attention that ignores the padding mask.

It is what many public LRA ports do, and ``lra-check-attention`` must catch it:

    lra-check-attention my_attention.broken:MaskIgnoringAttention

fails the ``padded token content`` line. Do not train it.
"""

from __future__ import annotations

import jax.numpy as jnp

from my_attention.attention import SquaredReluAttention


class MaskIgnoringAttention(SquaredReluAttention):
    """Treats every position, padding included, as a real key."""

    def __call__(self, x, *, mask, deterministic=True, rngs=None):
        return super().__call__(x, mask=jnp.ones_like(mask), deterministic=deterministic, rngs=rngs)
