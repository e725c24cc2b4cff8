"""The per-token model of self-pretraining (issue 28): an encoder and a per-position head.

Amos, Berant and Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors" (ICLR 2024); reference code IdoAmos/not-from-scratch (a
PyTorch S4 fork). A prediction for every position of the backbone's output.

    tokens:   int32[B, L]     ids in [0, vocab_size); the masked objective's mask token is
                              one more id, so the trainer builds this model with
                              vocab_size + 1 embeddings
    lengths:  int32[B]        the padding mask is arange(L) < lengths (padding at the end)
    Encoder   -> float[B, L, D]   (no CLS token: one output per input token; final LayerNorm)
    head      -> float[B, L, outputs]   one Dense D -> outputs per position

``outputs`` is the number of target classes per position (the vocabulary for tokens, 256
for pixels) or 1 for a regression target. With ``causal=True`` every layer runs in causal
mode (lra.models.encoder), so position i's output depends on tokens <= i only and can
predict token i + 1; with ``causal=False`` it is the bidirectional encoder of the masked
objective. Which positions enter the loss, and the shift of next-token targets, are the
trainer's business (lra.train).

The encoder is the attribute ``encoder``, built with the keyword arguments of
:class:`lra.models.heads.Classifier` (minus ``num_classes`` and ``pooling``), so its
parameter subtree has the same paths and shapes as the classifier's (the embedding table
apart, when built with one more row): stage 2 copies it across and drops ``head``. The head
is a single Dense layer, so what the encoder learns is not absorbed by a deep head that is
thrown away.

Hand-off note: a classifier with CLS pooling has two encoder parameters more than this model
has (``embedder/cls`` [D], and with learned positions ``embedder/pos`` has max_len + 1 rows
against max_len here, the classifier's row 0 being the CLS slot, so this model's row t is the
classifier's row t + 1). How those are filled at the hand-off is the trainer's choice.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from lra.models.encoder import DropoutRngs, Encoder, call_rngs

__all__ = ["TokenPredictor", "build_token_predictor"]


class TokenPredictor(nnx.Module):
    """Encoder + Dense(dim -> outputs) at every position: tokens int32[B, L], lengths
    int32[B] -> float[B, L, outputs]."""

    def __init__(self, *, outputs: int, causal: bool, rngs: nnx.Rngs, **encoder_kwargs: Any):
        """``encoder_kwargs`` are :class:`lra.models.encoder.Encoder`'s without ``cls_token``
        and ``causal`` (vocab_size, max_len, num_layers, dim, qkv_dim, num_heads, mlp_dim,
        dropout, attention_dropout, positions, attention, attention_options, remat)."""
        if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
            raise ValueError(f"TokenPredictor: outputs must be an integer >= 1, got {outputs!r}")
        for key in ("cls_token", "causal", "num_classes", "pooling", "dual"):
            if key in encoder_kwargs:
                raise TypeError(f"TokenPredictor does not take {key!r}")
        self.outputs = outputs
        self.causal = bool(causal)
        self.encoder = Encoder(cls_token=False, causal=self.causal, rngs=rngs, **encoder_kwargs)
        self.head = nnx.Linear(encoder_kwargs["dim"], outputs, rngs=rngs)

    def __call__(
        self, tokens, lengths, *, deterministic: bool = True, rngs: DropoutRngs = None
    ) -> jax.Array:
        rngs = call_rngs(deterministic, rngs, "TokenPredictor")
        h, _ = self.encoder(tokens, lengths, deterministic=deterministic, rngs=rngs)
        return self.head(h)


def build_token_predictor(*, outputs: int, causal: bool, **kwargs: Any) -> TokenPredictor:
    """``TokenPredictor(outputs=..., causal=..., **kwargs)``: ``kwargs`` are
    :func:`lra.models.build_classifier`'s without ``num_classes``, ``pooling`` and ``dual``
    (``rngs`` and the encoder's arguments)."""
    return TokenPredictor(outputs=outputs, causal=causal, **kwargs)
