"""The PyTorch twin of the harness's classifier (``models/encoder.py``, ``models/heads.py``):
embedding, encoder blocks (attention from :data:`lra.measure.compare.attention.TWIN_ATTENTION`,
MLP, norms, dropout where the harness puts it), pooling and the one- or two-input head.
tokens int[B, L], lengths int[B] -> logits float[B, C].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from lra.measure.bench_config import SetupError
from lra.measure.compare.attention import TWIN_ATTENTION
from lra.measure.compare.layers import (
    cached,
    layer_norm,
    sinusoidal_table,
)


class Embedder(nn.Module):
    """Token embedding (+ CLS vector prepended) + positions, then dropout."""

    HARNESS_NAMES = {"embedding": ("embedding.weight", False)}

    def __init__(self, *, vocab_size, dim, max_len, positions, cls_token, dropout):
        super().__init__()
        self.dim = dim
        self.embedding = nn.Embedding(vocab_size, dim)
        self.cls = nn.Parameter(torch.zeros(dim)) if cls_token else None
        learned = positions == "learned"
        self.pos = nn.Parameter(torch.zeros(max_len + int(cls_token), dim)) if learned else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens, mask):
        b = tokens.shape[0]
        x = self.embedding(tokens)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(b, 1, self.dim), x], dim=1)
            mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)
        n = x.shape[1]
        if self.pos is not None:
            pos = self.pos[:n]
        else:
            pos = cached(
                ("sinusoidal", n, self.dim, x.device, x.dtype),
                lambda: torch.tensor(sinusoidal_table(n, self.dim), device=x.device),
            )
        return self.dropout(x + pos), mask


class MLP(nn.Module):
    """Dense(D -> mlp_dim), GELU (tanh approximation, as jax.nn.gelu), dropout, Dense."""

    def __init__(self, *, dim, mlp_dim, dropout):
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.fc2(self.dropout(F.gelu(self.fc1(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LayerNorm: x + drop(attn(LN x)), then x + drop(mlp(LN x)) unless a GAU."""

    def __init__(
        self,
        *,
        attention,
        options,
        dim,
        qkv_dim,
        num_heads,
        mlp_dim,
        max_len,
        dropout,
        attention_dropout,
    ):
        super().__init__()
        self.attention_norm = layer_norm(dim)
        try:
            self.attention = TWIN_ATTENTION[attention](
                dim=dim,
                num_heads=num_heads,
                max_len=max_len,
                qkv_dim=qkv_dim,
                dropout_rate=attention_dropout,
                **options,
            )
        except TypeError as err:
            raise SetupError(f"twin {attention}: options {options} not mirrored: {err}") from err
        self.attention_dropout = nn.Dropout(dropout)
        self.has_mlp = not self.attention.replaces_mlp
        if self.has_mlp:
            self.mlp_norm = layer_norm(dim)
            self.mlp = MLP(dim=dim, mlp_dim=mlp_dim, dropout=dropout)
            self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = x + self.attention_dropout(self.attention(self.attention_norm(x), mask))
        if self.has_mlp:
            x = x + self.mlp_dropout(self.mlp(self.mlp_norm(x)))
        return x


class Encoder(nn.Module):
    """Embedder, blocks (per the harness's layer schedule), final LayerNorm."""

    def __init__(
        self,
        *,
        vocab_size,
        max_len,
        num_layers,
        dim,
        qkv_dim,
        num_heads,
        mlp_dim,
        dropout,
        attention_dropout,
        positions,
        cls_token,
        schedule,
        options,
        remat,
    ):
        super().__init__()
        self.remat = remat
        self.embedder = Embedder(
            vocab_size=vocab_size,
            dim=dim,
            max_len=max_len,
            positions=positions,
            cls_token=cls_token,
            dropout=dropout,
        )
        self.blocks = nn.ModuleList(
            Block(
                attention=name,
                options=options[name],
                dim=dim,
                qkv_dim=dim if qkv_dim is None else qkv_dim,
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                max_len=max_len + int(cls_token),
                dropout=dropout,
                attention_dropout=attention_dropout,
            )
            for name in schedule
        )
        self.final_norm = layer_norm(dim)

    def forward(self, tokens, lengths):
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        x, mask = self.embedder(tokens, mask)
        for block in self.blocks:
            if self.remat and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return self.final_norm(x), mask


def pool(h, mask, pooling: str):
    if pooling == "cls":
        return h[:, 0]
    if pooling == "mean":
        m = mask[..., None]
        return (h * m).sum(1) / m.sum(1).clamp(min=1)
    count = mask.sum(1)  # "last": the last real position
    last = h[torch.arange(h.shape[0], device=h.device), (count - 1).clamp(min=0)]
    return torch.where((count > 0)[:, None], last, torch.zeros_like(last))


class Classifier(nn.Module):
    """tokens [B, L], lengths [B] -> logits [B, C]: pool, Dense(mlp_dim), ReLU, Dense(C)."""

    def __init__(self, *, num_classes, pooling, **encoder):
        super().__init__()
        self.pooling = pooling
        self.encoder = Encoder(cls_token=pooling == "cls", **encoder)
        self.hidden = nn.Linear(encoder["dim"], encoder["mlp_dim"])
        self.logits = nn.Linear(encoder["mlp_dim"], num_classes)

    def forward(self, tokens, lengths):
        u = pool(*self.encoder(tokens, lengths), self.pooling)
        return self.logits(F.relu(self.hidden(u)))


class DualClassifier(nn.Module):
    """Retrieval: shared encoder over both documents in one batch of 2B rows (as the harness's
    ``DualClassifier``), [u, v, u*v, u-v] -> Dense ReLU Dense ReLU Dense."""

    def __init__(self, *, num_classes, pooling, **encoder):
        super().__init__()
        self.pooling = pooling
        self.encoder = Encoder(cls_token=pooling == "cls", **encoder)
        dim, mlp_dim = encoder["dim"], encoder["mlp_dim"]
        self.hidden1 = nn.Linear(4 * dim, mlp_dim)
        self.hidden2 = nn.Linear(mlp_dim, mlp_dim // 2)
        self.logits = nn.Linear(mlp_dim // 2, num_classes)

    def forward(self, tokens1, lengths1, tokens2, lengths2):
        tokens, lengths = torch.cat([tokens1, tokens2]), torch.cat([lengths1, lengths2])
        u, v = pool(*self.encoder(tokens, lengths), self.pooling).chunk(2)
        z = F.relu(self.hidden1(torch.cat([u, v, u * v, u - v], dim=-1)))
        return self.logits(F.relu(self.hidden2(z)))
