"""The PyTorch twins of the harness's attention mechanisms, one class per mechanism.

Module and weight names follow the harness's, so the weight mapping is the module path plus a
per-module rename (:mod:`lra.measure.compare.weights`). x float[B, L, D] -> float[B, L, D];
Q, K, V float[B, L, H, d].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lra.measure.bench_config import SetupError
from lra.measure.compare.layers import (
    cached,
    linear_context,
    linear_normaliser,
    lrpe_rotate,
    output_norm,
    rope_rotate,
    to_blocks,
)


class MultiHead(nn.Module):
    """Q, K, V (D -> E), out (E -> D), heads, attention dropout: models/attention/common.py."""

    replaces_mlp = False

    def __init__(self, *, dim, num_heads, max_len, qkv_dim=None, dropout_rate=0.0):
        super().__init__()
        qkv_dim = dim if qkv_dim is None else qkv_dim
        self.num_heads, self.head_dim, self.max_len = num_heads, qkv_dim // num_heads, max_len
        self.query = nn.Linear(dim, qkv_dim)
        self.key = nn.Linear(dim, qkv_dim)
        self.value = nn.Linear(dim, qkv_dim)
        self.out = nn.Linear(qkv_dim, dim)
        self.dropout = nn.Dropout(dropout_rate)

    def qkv(self, x):
        b, n, _ = x.shape
        return tuple(
            proj(x).view(b, n, self.num_heads, self.head_dim)
            for proj in (self.query, self.key, self.value)
        )


class SoftmaxAttention(MultiHead):
    """softmax(Q K^T / sqrt(d) + key mask) V, written out; "fused" uses
    F.scaled_dot_product_attention. The harness's "auto" is its plain path in float32 (cuDNN
    only for bf16/fp16 on a GPU), and the twin runs float32 only, so "auto" is plain here."""

    def __init__(self, *, implementation="auto", **common):
        super().__init__(**common)
        if implementation not in ("auto", "plain", "fused"):
            raise SetupError(f"twin softmax: unknown implementation {implementation!r}")
        self.implementation = implementation

    def forward(self, x, mask):
        q, k, v = self.qkv(x)
        if self.implementation == "fused":
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=mask[:, None, None, :],
                dropout_p=self.dropout.p if self.training else 0.0,
            )
            return self.out(y.transpose(1, 2).flatten(2))
        q = q * self.head_dim**-0.5
        logits = torch.einsum("bqhd,bkhd->bhqk", q, k)
        logits = logits.masked_fill(~mask[:, None, None, :], torch.finfo(logits.dtype).min)
        weights = self.dropout(logits.softmax(dim=-1))
        return self.out(torch.einsum("bhqk,bkhd->bqhd", weights, v).flatten(2))


KERNELS = {
    "1+elu": lambda x: F.elu(x) + 1,
    "elu": lambda x: F.elu(x),
    "relu": lambda x: F.relu(x),
}


class NormAttention(MultiHead):
    """TransNormer NormAttention: Norm(phi(Q) (phi(K)^T V)), then dropout, out."""

    def __init__(self, *, kernel="1+elu", norm_type="layernorm", lrpe=False, **common):
        super().__init__(**common)
        self.phi, self.lrpe = KERNELS[kernel], lrpe
        self.norm = output_norm(norm_type, self.num_heads * self.head_dim)

    def forward(self, x, mask):
        q, k, v = self.qkv(x)
        q, k = self.phi(q), self.phi(k)
        if self.lrpe:
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        y = linear_context(q, k * mask[:, :, None, None], v).flatten(2)
        return self.out(self.dropout(self.norm(y)))


class DiagAttention(MultiHead):
    """TransNormer DiagAttention: softmax (or relu + norm) attention inside blocks of C."""

    def __init__(
        self, *, score="softmax", block_size=64, norm_type="layernorm", lrpe=False, **common
    ):
        super().__init__(**common)
        self.score, self.block_size, self.lrpe = score, block_size, lrpe
        width = self.num_heads * self.head_dim
        self.norm = output_norm(norm_type, width) if score == "relu" else None

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = self.qkv(x)
        c = self.block_size
        q = to_blocks(q * self.head_dim**-0.5, c)  # [B, G, C, H, d]
        k, v = to_blocks(k, c), to_blocks(v, c)
        if self.lrpe:
            q, k = lrpe_rotate(q), lrpe_rotate(k)
        real_key = to_blocks(mask, c)[:, None, :, None, :]  # [B, 1, G, 1, C]
        logits = torch.einsum("bgqhd,bgkhd->bhgqk", q, k)
        if self.score == "softmax":
            low = torch.finfo(logits.dtype).min
            weights = logits.masked_fill(~real_key, low).softmax(dim=-1)
        else:
            weights = F.relu(logits) * real_key
        weights = self.dropout(weights)
        y = torch.einsum("bhgqk,bgkhd->bgqhd", weights, v)
        y = y.reshape(b, -1, self.num_heads * self.head_dim)[:, :n]
        if self.norm is not None:
            y = self.norm(y)
        return self.out(y)


def orthogonal_random_features(num_features: int, dim: int, device=None):
    """float32[m, d]: blocks of orthonormal rows (Haar Q of a Gaussian), chi-norm rows."""
    blocks = -(-num_features // dim)
    q, r = torch.linalg.qr(torch.randn(blocks, dim, dim, device=device))
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    q = q * torch.where(signs == 0, torch.ones_like(signs), signs)[:, None, :]
    rows = q.transpose(-1, -2).reshape(blocks * dim, dim)[:num_features]
    return rows * torch.randn(num_features, dim, device=device).norm(dim=-1, keepdim=True)


def positive_features(x, features, valid=None):
    """FAVOR+ phi(x) * exp(-max): x [B, L, H, d] (scaled) -> [B, L, H, m]."""
    ratio = features.shape[0] ** -0.5
    exponent = torch.einsum("blhd,md->blhm", x, features) - 0.5 * x.square().sum(-1, keepdim=True)
    if valid is None:  # queries: one max per position over the features
        return torch.exp(exponent - exponent.amax(-1, keepdim=True).detach()) * ratio
    low = torch.finfo(x.dtype).min
    real = valid[:, :, None, None]
    shift = exponent.masked_fill(~real, low).amax(dim=(1, 3), keepdim=True)
    shift = torch.where(shift > low, shift, torch.zeros_like(shift))
    exponent = (exponent - shift.detach()).masked_fill(~real, low)
    return torch.exp(exponent) * ratio * real


class PerformerAttention(MultiHead):
    """FAVOR+ with positive orthogonal random features (a buffer copied from the harness)."""

    def __init__(self, *, num_features=256, redraw="fixed", **common):
        super().__init__(**common)
        self.num_features, self.redraw = num_features, redraw
        self.register_buffer("features", torch.zeros(num_features, self.head_dim))

    def forward(self, x, mask):
        features = self.features
        if self.redraw == "every_call" and self.training:
            features = orthogonal_random_features(self.num_features, self.head_dim, x.device)
        q, k, v = self.qkv(x)
        scale = self.head_dim**-0.25
        phi_q = positive_features(q * scale, features)
        phi_k = positive_features(k * scale, features, mask)
        floor = math.sqrt(torch.finfo(x.dtype).tiny)
        denominator = linear_normaliser(phi_q, phi_k).clamp(min=floor)
        y = linear_context(phi_q, phi_k, v) / denominator[..., None]
        return self.out(self.dropout(y.flatten(2)))


class CosformerAttention(MultiHead):
    """cosFormer: relu features with cos re-weighting over M = 1 + last real index."""

    def forward(self, x, mask):
        n = x.shape[1]
        q, k, v = self.qkv(x)
        q, k = F.relu(q), F.relu(k)
        positions = torch.arange(1, n + 1, device=x.device)
        horizon = torch.where(mask, positions, 0).amax(dim=1).clamp(min=1).float()
        angle = (math.pi / 2) * torch.arange(n, device=x.device, dtype=torch.float32)[None, :]
        angle = (angle / horizon[:, None])[:, :, None, None].to(x.dtype)
        cos, sin = angle.cos(), angle.sin()
        q = torch.cat([q * cos, q * sin], dim=-1)
        k = torch.cat([k * cos, k * sin], dim=-1) * mask[:, :, None, None]
        y = linear_context(q, k, v) / linear_normaliser(q, k).clamp(min=1e-6)[..., None]
        return self.out(self.dropout(y.flatten(2)))


class RelativePositionBias(nn.Module):
    """A learned scalar per offset j - i, clipped to +-(span - 1)."""

    def __init__(self, span: int):
        super().__init__()
        self.span = span
        self.table = nn.Parameter(torch.zeros(2 * span - 1))

    def forward(self, length: int):
        def build():
            pos = torch.arange(length, device=self.table.device)
            offset = (pos[None, :] - pos[:, None]).clamp(-(self.span - 1), self.span - 1)
            return offset + self.span - 1

        return self.table[cached(("offsets", length, self.span, self.table.device), build)]


class GatedAttentionUnit(nn.Module):
    """FLASH's GAU projections: U, V = SiLU(x W_u), SiLU(x W_v); Z = SiLU(x W_z) offset and
    scaled ``num_offsets`` times (gamma, beta); out = (U * Vhat) W_o."""

    replaces_mlp = True

    def __init__(
        self, dim, max_len, dropout_rate, expansion_factor, shared_dim, num_offsets, span, rope
    ):
        super().__init__()
        expanded = int(expansion_factor * dim)
        self.rope = rope
        self.hidden = nn.Linear(dim, 2 * expanded)
        self.shared = nn.Linear(dim, shared_dim)
        self.gamma = nn.Parameter(torch.zeros(num_offsets, shared_dim))
        self.beta = nn.Parameter(torch.zeros(num_offsets, shared_dim))
        self.rel_bias = RelativePositionBias(min(span, max_len))
        self.out = nn.Linear(expanded, dim)
        self.dropout = nn.Dropout(dropout_rate)

    def project(self, x):
        u, v = F.silu(self.hidden(x)).chunk(2, dim=-1)
        z = F.silu(self.shared(x))
        parts = (z[..., None, :] * self.gamma + self.beta).unbind(dim=-2)
        if self.rope:
            parts = [rope_rotate(p) for p in parts]
        return u, v, parts


class FlashQuadAttention(GatedAttentionUnit):
    """GAU with relu^2 attention over the whole sequence, scaled by 1 / (real tokens)."""

    def __init__(
        self,
        *,
        dim,
        num_heads,
        max_len,
        qkv_dim=None,
        dropout_rate=0.0,
        expansion_factor=2.0,
        shared_dim=128,
        rope=False,
    ):
        del num_heads, qkv_dim
        super().__init__(dim, max_len, dropout_rate, expansion_factor, shared_dim, 2, max_len, rope)

    def forward(self, x, mask):
        n = x.shape[1]
        u, v, (q, k) = self.project(x)
        count = mask.sum(-1).clamp(min=1).to(x.dtype)[:, None, None]
        logits = torch.einsum("bis,bjs->bij", q, k) / count + self.rel_bias(n)
        weights = self.dropout(F.relu(logits).square() * mask[:, None, :])
        return self.out(u * torch.einsum("bij,bje->bie", weights, v))


class FlashAttention(GatedAttentionUnit):
    """GAU with mixed chunk attention: relu^2 inside chunks (1/g) + global linear (1/n)."""

    def __init__(
        self,
        *,
        dim,
        num_heads,
        max_len,
        qkv_dim=None,
        dropout_rate=0.0,
        expansion_factor=2.0,
        shared_dim=128,
        chunk_size=256,
        rope=False,
    ):
        del num_heads, qkv_dim
        super().__init__(
            dim, max_len, dropout_rate, expansion_factor, shared_dim, 4, chunk_size, rope
        )
        self.chunk_size = chunk_size

    def forward(self, x, mask):
        b, n, _ = x.shape
        u, v, (quad_q, quad_k, lin_q, lin_k) = self.project(x)
        count = mask.sum(-1).clamp(min=1).to(x.dtype)
        lin_kv = torch.einsum("bns,bne->bse", lin_k * mask[..., None], v) / count[:, None, None]
        linear = torch.einsum("bns,bse->bne", lin_q, lin_kv)
        g = min(self.chunk_size, n)  # a sequence shorter than a chunk is one chunk
        qq, qk, vc, mc = (to_blocks(y, g) for y in (quad_q, quad_k, v, mask))
        logits = torch.einsum("bcis,bcjs->bcij", qq, qk) * (1.0 / self.chunk_size)
        logits = logits + self.rel_bias(g)
        weights = self.dropout(F.relu(logits).square() * mc[:, :, None, :])
        quadratic = torch.einsum("bcij,bcje->bcie", weights, vc).reshape(b, -1, v.shape[-1])
        return self.out(u * (quadratic[:, :n] + linear))


TWIN_ATTENTION = {
    "softmax": SoftmaxAttention,
    "transnormer_norm": NormAttention,
    "transnormer_diag": DiagAttention,
    "performer": PerformerAttention,
    "cosformer": CosformerAttention,
    "flash": FlashAttention,
    "flash_quad": FlashQuadAttention,
}
