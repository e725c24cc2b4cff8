"""Long-Short Transformer attention: Zhu, Ping, Xiao, Shoeybi, Goldstein, Anandkumar,
Catanzaro, "Long-Short Transformer: Efficient Transformers for Language and Vision",
NeurIPS 2021.

Each query attends, in ONE softmax, to (a) the keys in a sliding window around it and (b) r
landmarks: keys/values dynamically projected along the sequence. Shapes (B batch, L length,
D model dim, H heads, E = qkv_dim, d = E / H, r = num_landmarks):

    Q      = (x W_q) / sqrt(d)                          float[B, L, H, d]
    K, V   = LN_local(x W_k), LN_local(x W_v)           float[B, L, H, d]  (LN over E)
    P      = softmax over the sequence of (x W_p)       float[B, L, H, r]  padded rows excluded
    Kbar   = LN_global(P^T K),  Vbar = LN_global(P^T V) float[B, r, H, d]  (LN over E)
    out_i  = softmax([Q_i K_j^T for |i - j| <= w // 2 ; Q_i Kbar^T]) [V_j ; Vbar]  then W_o

DualLN: two LayerNorms, one on the local keys/values and one on the projected (global)
ones, as in the authors' code: LN_local acts on x W_k and x W_v over all heads together, the
landmarks are projected from those normalised K, V, and LN_global normalises the projected
ones (again over all heads together). The same LayerNorm serves keys and values of a branch.

Window: the exact band |i - j| <= window // 2 (window + 1 keys for even window), computed
memory-linearly: queries in blocks of c = max(window // 2, 1) attend the keys of their own
block and of the two neighbouring blocks (3c keys) under the exact band mask, so memory is
O(B H L (3c + r)), never L x L. The authors' code tiles the sequence into segments of
length w, each attending its own segment plus w / 2 keys on each side (2w keys; a query's
reach is between w / 2 and 3w / 2 - 1 on each side, depending on its place in the
segment). The band used here is the reach every query gets there; window = 2w gives the
same number of keys (2w + 1) as theirs.

Options and defaults: window = 8, num_landmarks = 32: the paper's LRA setting
"Transformer-LS (w, r) = (8, 32)", also the setting of the authors' LRA run scripts.
The authors' optional depthwise convolution on V (off in those scripts) and their special
CLS handling are not included: a CLS token is an ordinary position here. ``dropout_rate``
drops entries of the joint attention weights.

Padding: padded keys get the most negative finite logit inside the window, and padded
positions are excluded from the softmax over the sequence that builds P, so they enter no
landmark. Appending padding leaves outputs at real positions unchanged (the band and P
depend only on real tokens). A row with no real token gives finite (meaningless) outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.attention.common import (
    MultiHeadAttention,
    band,
    from_blocks,
    mask_logits,
    to_blocks,
    with_neighbours,
)
from models.registry import register

__all__ = ["LongShortAttention"]


@register("long_short")
class LongShortAttention(MultiHeadAttention):
    """Sliding-window attention joined with attention to dynamically projected landmarks."""

    kind = "long_short"
    memory_class = "linear"
    same_without_padding = True

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        max_len: int,
        rngs: nnx.Rngs,
        qkv_dim: int | None = None,
        dropout_rate: float = 0.0,
        window: int = 8,
        num_landmarks: int = 32,
    ):
        qkv_dim = self._init_heads(dim, num_heads, max_len, qkv_dim, dropout_rate)
        if window < 0:
            raise ValueError(f"long_short attention: window must be >= 0, got {window}")
        if num_landmarks < 1:
            raise ValueError(
                f"long_short attention: num_landmarks must be >= 1, got {num_landmarks}"
            )
        self.half_window = window // 2
        self.num_landmarks = num_landmarks
        # Drawn in this order (the output projection last).
        self.query = self._dense_in(rngs)
        self.key = self._dense_in(rngs)
        self.value = self._dense_in(rngs)
        self.landmark_scores = nnx.Linear(dim, num_heads * num_landmarks, rngs=rngs)
        self.local_norm = nnx.LayerNorm(qkv_dim, rngs=rngs)
        self.global_norm = nnx.LayerNorm(qkv_dim, rngs=rngs)
        self.out = self._dense_out(rngs)

    def _landmarks(self, x, k, v, mask):
        """Kbar, Vbar float[B, r, H, d]: LN_global(P^T K), LN_global(P^T V)."""
        b, n, _ = x.shape
        scores = self.landmark_scores(x).reshape(b, n, self.num_heads, self.num_landmarks)
        proj = jax.nn.softmax(mask_logits(scores, mask[:, :, None, None]), axis=1)  # over L

        def project(y):
            y = jnp.einsum("blhr,blhd->brhd", proj, y)
            return self._heads(self.global_norm(self._merge(y)))

        return project(k), project(v)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        _, n = self._check_call(x, mask, deterministic, rngs)
        mask = mask.astype(bool)
        q = self._heads(self.query(x))
        q = q * jnp.asarray(self.head_dim**-0.5, q.dtype)
        k = self._heads(self.local_norm(self.key(x)))
        v = self._heads(self.local_norm(self.value(x)))
        k_bar, v_bar = self._landmarks(x, k, v, mask)

        # Window keys: blocks of c queries see their own and both neighbouring blocks.
        c = max(self.half_window, 1)
        q_blocks = to_blocks(q, c)  # [B, nb, c, H, d]
        k_win = with_neighbours(to_blocks(k, c))  # [B, nb, 3c, H, d]
        v_win = with_neighbours(to_blocks(v, c))
        key_real = with_neighbours(to_blocks(mask, c))  # [B, nb, 3c]; outside: False
        allowed = key_real[:, :, None, None, :] & band(c, self.half_window)  # [B,nb,1,c,3c]

        local = mask_logits(jnp.einsum("bnihd,bnjhd->bnhij", q_blocks, k_win), allowed)
        global_ = jnp.einsum("bnihd,brhd->bnhir", q_blocks, k_bar)
        weights = jax.nn.softmax(jnp.concatenate([global_, local], axis=-1), axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        r = self.num_landmarks
        y = jnp.einsum("bnhir,brhd->bnihd", weights[..., :r], v_bar) + jnp.einsum(
            "bnhij,bnjhd->bnihd", weights[..., r:], v_win
        )
        return self.out(self._merge(from_blocks(y, n)))
