"""Long-Short Transformer attention: Zhu, Ping, Xiao, Shoeybi, Goldstein, Anandkumar,
Catanzaro, "Long-Short Transformer: Efficient Transformers for Language and Vision",
NeurIPS 2021.

Each query attends, in ONE softmax, to (a) the keys of a segment-wise sliding window around
it and (b) r landmarks: keys/values dynamically projected along the sequence. Shapes
(B batch, L length, D model dim, H heads, E = qkv_dim, d = E / H, r = num_landmarks,
w = window, a = max(w // 2, 1) the window's extension, G = ceil(L / w) segments):

    Q      = (x W_q) / sqrt(d)                          float[B, L, H, d]
    K, V   = LN_local(x W_k), LN_local(x W_v)           float[B, L, H, d]  (LN over E)
    P      = softmax over the sequence of (x W_p)       float[B, L, H, r]  padded rows excluded
    Kbar   = LN_global(P^T K),  Vbar = LN_global(P^T V) float[B, r, H, d]  (LN over E)
    out_i  = softmax([Q_i Kbar^T ; Q_i K_j^T for j in window(i)]) [Vbar ; V_j]   then W_o
    local weights                                      float[B, G, H, w, w + 2a]

DualLN: two LayerNorms, one on the local keys/values and one on the projected (global)
ones, as in the authors' code: LN_local acts on x W_k and x W_v over all heads together, the
landmarks are projected from those normalised K, V, and LN_global normalises the projected
ones (again over all heads together). The same LayerNorm serves keys and values of a branch.
Both use epsilon 1e-5, PyTorch's nn.LayerNorm default, which the authors' code keeps.

Window (``window`` = w, the authors' ``window_size`` / ``win_size``): the segment-wise
sliding window of the authors' LRA code (NVIDIA/transformer-ls lra/attention_transformer_ls.py,
``sliding_chunks_matmul_qk_v2`` with ``get_tiles_v2``; the same code is in the TransNormer
authors' OpenNLPLab/lra src/models/sequence/x_attention/ls_attention.py). The sequence is cut
into segments of w tokens starting at position 0, and every query of segment t = i // w sees
the keys of its own segment plus a = max(w // 2, 1) keys on each side:

    window(i) = { j : t*w - a <= j < (t + 1)*w + a,  0 <= j < L,  j real },   t = i // w

that is w + 2a keys (2w for even w; 16 for the default w = 8), so a query's reach is between
a and w + a - 1 positions on each side depending on its place in its segment. window = 0 is
the authors' "no window" case: each query sees only its own key. Computed memory-linearly:
segments of queries against the w + 2a keys around them, never L x L. Keys beyond either end
of the sequence (the authors pad with zero keys and mask them) are excluded; a sequence whose
length is not a multiple of w ends in a shorter segment (the authors' LRA module requires a
multiple of w; OpenNLPLab/lra pads the input to one, and its copy ignores the key padding
mask, which this module and NVIDIA's apply).

Options and defaults: window = 8, num_landmarks = 32: the paper's LRA setting
"Transformer-LS (w, r) = (8, 32)", also the setting of the authors' LRA run scripts
(NVIDIA/transformer-ls lra/run_listops.sh: lms 32, win_size 8; OpenNLPLab/lra
configs/model/transformer_ls.yaml: num_landmarks 32, window_size 8). num_landmarks = 0
leaves out the landmark branch (pure windowed attention), as the authors' code allows.
The authors' optional depthwise convolution on V (off in those scripts) and their special
CLS handling are not included: a CLS token is an ordinary position here. ``dropout_rate``
drops entries of the joint attention weights.

Padding: padded keys get the most negative finite logit inside the window, and padded
positions are excluded from the softmax over the sequence that builds P, so they enter no
landmark. Appending padding leaves outputs at real positions unchanged (segments start at
position 0, and the window and P depend only on real tokens). A row with no real token gives
finite (meaningless) outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.attention.common import (
    MultiHeadAttention,
    check_int,
    from_blocks,
    mask_logits,
    to_blocks,
    with_neighbours,
)
from lra.models.registry import register

__all__ = ["LongShortAttention"]

# PyTorch's nn.LayerNorm default, kept by the authors' DualLN.
DUAL_LN_EPSILON = 1e-5


@register("long_short")
class LongShortAttention(MultiHeadAttention):
    """Segment-wise sliding-window attention joined with attention to projected landmarks."""

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
        check_int(self.label, "window", window, minimum=0)
        check_int(self.label, "num_landmarks", num_landmarks, minimum=0)
        self.window = window
        # Segment length and keys on each side (window 0: segments of 1 seeing only themselves).
        self.segment = max(window, 1)
        self.extension = max(window // 2, 1) if window > 0 else 0
        self.num_landmarks = num_landmarks
        # Drawn in this order (the output projection last).
        self.query = self._dense_in(rngs)
        self.key = self._dense_in(rngs)
        self.value = self._dense_in(rngs)
        if num_landmarks > 0:
            self.landmark_scores = nnx.Linear(dim, num_heads * num_landmarks, rngs=rngs)
        else:
            self.landmark_scores = None
        self.local_norm = nnx.LayerNorm(qkv_dim, epsilon=DUAL_LN_EPSILON, rngs=rngs)
        if num_landmarks > 0:
            self.global_norm = nnx.LayerNorm(qkv_dim, epsilon=DUAL_LN_EPSILON, rngs=rngs)
        else:
            self.global_norm = None
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

    def _window_keys(self, y: jax.Array) -> jax.Array:
        """[B, L, ...] -> [B, G, w + 2a, ...]: for each segment, the keys of its window
        (zeros / False beyond the ends of the sequence)."""
        c, ext = self.segment, self.extension
        return with_neighbours(to_blocks(y, c))[:, :, c - ext : 2 * c + ext]

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

        q_blocks = to_blocks(q, self.segment)  # [B, G, w, H, d]
        k_win, v_win = self._window_keys(k), self._window_keys(v)  # [B, G, w + 2a, H, d]
        key_real = self._window_keys(mask)[:, :, None, None, :]  # [B, G, 1, 1, w + 2a]
        logits = mask_logits(jnp.einsum("bnihd,bnjhd->bnhij", q_blocks, k_win), key_real)
        r = self.num_landmarks
        if r > 0:
            k_bar, v_bar = self._landmarks(x, k, v, mask)
            global_ = jnp.einsum("bnihd,brhd->bnhir", q_blocks, k_bar)
            logits = jnp.concatenate([global_, logits], axis=-1)
        weights = jax.nn.softmax(logits, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("bnhij,bnjhd->bnihd", weights[..., r:], v_win)
        if r > 0:
            y = y + jnp.einsum("bnhir,brhd->bnihd", weights[..., :r], v_bar)
        return self.out(self._merge(from_blocks(y, n)))
