"""Classifier heads on the encoder: pooling and the one- and two-input classifiers.

Shapes (B batch, L' encoder length, D = dim, C classes):

    pool           float[B, L', D] -> float[B, D]  'cls': position 0; 'mean': masked mean;
                                                   'last': the last real position
    Classifier     int32[B, L] -> float[B, C]      Dense(mlp_dim), ReLU, Dense(C)
    DualClassifier two int32[B, L] -> float[B, C]  Retrieval: one shared encoder for both
                                                   documents, [u, v, u*v, u-v] -> Dense(mlp_dim)
                                                   ReLU -> Dense(mlp_dim // 2) ReLU -> Dense(C)

The dual encoder runs both documents as one batch of 2B rows, as the S4 and S5 code stacks
them for AAN (state-spaces/s4 ``src/dataloaders/lra.py`` and lindermanlab/S5
``s5/dataloaders/lra.py``: ``torch.cat([xs1, xs2], dim=0)``): one encoder pass per step, so
a BatchNorm's statistics cover both documents and its running statistics move once a step.
With LayerNorm the result is the two separate passes' (only the dropout draws differ).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lra.models.encoder import DropoutRngs, Encoder, call_rngs

POOLINGS = ("cls", "mean", "last")


def pool(h: jax.Array, mask: jax.Array, pooling: str) -> jax.Array:
    """float[B, L, D] -> float[B, D]: 'cls' takes position 0; 'mean' averages real positions;
    'last' takes the last real position (the TransNormer authors' Pathfinder decoder,
    OpenNLPLab/lra ``decoder.mode: last``). An all-padding row gives 0 under 'mean' and 'last'.

    The mean sums in float32 and divides by max(count, 1), so an all-padding row gives 0.
    """
    if pooling == "cls":
        return h[:, 0]
    if pooling == "mean":
        m = mask.astype(bool)[..., None]
        total = jnp.sum(jnp.where(m, h, 0), axis=1, dtype=jnp.float32)
        count = jnp.maximum(jnp.sum(m, axis=1, dtype=jnp.float32), 1.0)
        return (total / count).astype(h.dtype)
    if pooling == "last":
        count = jnp.sum(mask.astype(jnp.int32), axis=1)
        last = jnp.take_along_axis(h, jnp.maximum(count - 1, 0)[:, None, None], axis=1)[:, 0]
        return jnp.where((count > 0)[:, None], last, 0).astype(h.dtype)
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")


def _encoder(kw: dict[str, Any], pooling: str, rngs: nnx.Rngs) -> Encoder:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    return Encoder(cls_token=pooling == "cls", rngs=rngs, **kw)


class Classifier(nnx.Module):
    """Single-sequence classifier: tokens int32[B, L], lengths int32[B] -> logits float[B, C]."""

    def __init__(self, *, num_classes: int, pooling: str, rngs: nnx.Rngs, **encoder_kwargs):
        """``encoder_kwargs`` are :class:`Encoder`'s (vocab_size, max_len, num_layers, dim,
        qkv_dim, num_heads, mlp_dim, dropout, attention_dropout, positions, attention,
        attention_options, remat); the head is Dense(mlp_dim), ReLU, Dense(num_classes)."""
        self.pooling = pooling
        self.encoder = _encoder(encoder_kwargs, pooling, rngs)
        dim, mlp_dim = encoder_kwargs["dim"], encoder_kwargs["mlp_dim"]
        self.hidden = nnx.Linear(dim, mlp_dim, rngs=rngs)
        self.logits = nnx.Linear(mlp_dim, num_classes, rngs=rngs)

    def __call__(
        self, tokens, lengths, *, deterministic: bool = True, rngs: DropoutRngs = None
    ) -> jax.Array:
        rngs = call_rngs(deterministic, rngs, "Classifier")
        h, mask = self.encoder(tokens, lengths, deterministic=deterministic, rngs=rngs)
        u = pool(h, mask, self.pooling)
        return self.logits(nnx.relu(self.hidden(u)))


class DualClassifier(nnx.Module):
    """Retrieval: one shared encoder for two documents -> logits float[B, C]."""

    def __init__(self, *, num_classes: int, pooling: str, rngs: nnx.Rngs, **encoder_kwargs):
        """``encoder_kwargs`` as for :class:`Classifier`; the head is [u, v, u*v, u-v] ->
        Dense(mlp_dim) ReLU -> Dense(mlp_dim // 2) ReLU -> Dense(num_classes)."""
        self.pooling = pooling
        self.encoder = _encoder(encoder_kwargs, pooling, rngs)
        dim, mlp_dim = encoder_kwargs["dim"], encoder_kwargs["mlp_dim"]
        if mlp_dim < 2:
            raise ValueError(
                f"DualClassifier needs mlp_dim >= 2 (head uses mlp_dim // 2), got {mlp_dim}"
            )
        self.hidden1 = nnx.Linear(4 * dim, mlp_dim, rngs=rngs)
        self.hidden2 = nnx.Linear(mlp_dim, mlp_dim // 2, rngs=rngs)
        self.logits = nnx.Linear(mlp_dim // 2, num_classes, rngs=rngs)

    def __call__(
        self,
        tokens1,
        lengths1,
        tokens2,
        lengths2,
        *,
        deterministic: bool = True,
        rngs: DropoutRngs = None,
    ) -> jax.Array:
        rngs = call_rngs(deterministic, rngs, "DualClassifier")
        if tokens1.shape != tokens2.shape:
            raise ValueError(
                "DualClassifier takes two documents of one shape int32[B, L], got "
                f"{tokens1.shape} and {tokens2.shape}"
            )
        tokens = jnp.concatenate([tokens1, tokens2])  # int32[2B, L]
        lengths = jnp.concatenate([lengths1, lengths2])
        h, mask = self.encoder(tokens, lengths, deterministic=deterministic, rngs=rngs)
        u, v = jnp.split(pool(h, mask, self.pooling), 2)  # float[B, D] each
        z = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        z = nnx.relu(self.hidden1(z))
        z = nnx.relu(self.hidden2(z))
        return self.logits(z)


def build_classifier(*, dual: bool, **kwargs: Any) -> Classifier | DualClassifier:
    """``DualClassifier(**kwargs)`` if ``dual`` (Retrieval), else ``Classifier(**kwargs)``."""
    return (DualClassifier if dual else Classifier)(**kwargs)
