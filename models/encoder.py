"""The LRA encoder: embeddings and blocks, pre-LayerNorm by default (norms: lra.models.norms;
heads: lra.models.heads; which mechanism each layer uses: lra.models.schedule).

Shapes (B batch, L token length <= max_len, D = dim, C classes):

    tokens:  int32[B, L]       lengths: int32[B]  (the padding mask is arange(L) < lengths,
                                                   never derived from token values)
    Embedder -> float[B, L', D], mask bool[B, L']  with L' = L + 1 under CLS pooling (a learned
                                                   CLS vector is prepended before positions
                                                   are added, as in the official LRA encoder)
    Encoder  -> float[B, L', D]                    num_layers blocks, then a final norm (pre-norm)
    pool, Classifier, DualClassifier               lra.models.heads

Attention per layer: ``attention`` is one registered name (every layer), a list of
``num_layers`` names (a per-layer schedule, lowest layer first) or a lower/upper split (see
``resolve_schedule``). ``attention_options`` maps a mechanism name to the keyword options for
every layer using that mechanism; a mechanism absent from the map gets no extra options. Keys
naming no registered mechanism are an error (this catches flat option dicts such as
``{"num_features": 256}``); options for a registered mechanism the schedule does not use at
this depth are ignored. A split whose lower or upper part comes to 0 layers at this depth
(e.g. on 1-layer tasks) is one mechanism throughout: ``describe_layers`` reports what each
layer became, and the Encoder warns (UserWarning).

Causal mode (``causal=True``, next-token pretraining, issue 28): every layer's mechanism is
built with ``causal=True`` (see lra.models.registry: a mechanism has the mode iff its
constructor declares ``causal``), so the output at position i depends only on tokens <= i.
A layer whose mechanism lacks it is a one-line ValueError naming it, before anything is built.
The parameters are the same as without it. Build a causal encoder with ``cls_token=False``
(a prepended CLS vector would be position 0 of every causal window, harmless but useless).

Randomness: ``rngs`` given to a constructor is used for parameter init only. Dropout keys come
from the ``rngs`` given at call time (an ``nnx.Rngs``, or a JAX key which is wrapped as
``nnx.Rngs(dropout=key)``); it is threaded to every Dropout and every attention module, and is
required when ``deterministic=False``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from lra.models.layer_scan import runs_of_equal_layers, scan_blocks
from lra.models.norms import check_norm, make_norm, normalize
from lra.models.registry import causal_mechanisms, make_attention, supports_causal
from lra.models.schedule import describe_layers, resolve_options, resolve_schedule

__all__ = [
    "MLP",
    "REMAT_POLICIES",
    "SAVED_OUTSIDE_ATTENTION",
    "Block",
    "Embedder",
    "Encoder",
    "check_causal",
    "padding_mask",
    "remat_policy",
    "sinusoidal_positions",
]

# trainer.remat -> what the backward pass recomputes instead of keeping (jax.checkpoint):
#   none           nothing: every residual is kept
#   block          each block's activations; only its input is kept (nnx.remat per block)
#   attention      the attention sublayer's (scores, softmax, dropout: the [B, H, L, L]
#                  tensors); its output and the MLP's residuals (named with
#                  ``checkpoint_name``: SAVED_OUTSIDE_ATTENTION) are kept
#   dots           each block's elementwise work (norms, softmax, dropout, activations); the
#                  outputs of its matmuls are kept (jax.checkpoint_policies.dots_saveable)
#   dots_no_batch  as ``dots``, keeping only matmuls without batch dimensions (the
#                  projections and MLP; the attention scores Q K^T are recomputed)
#                  (jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
# ``false``/``true`` are the older spellings of none/block.


def real_dots_only(policy):
    """``policy`` saving only real-valued products: JAX 0.10 cannot keep a complex residual
    (its remat inserts ``reduce_precision``, which takes floating types only), so the complex
    products of the S5 and LRU scans are recomputed instead of failing to differentiate."""

    def saveable(prim, *avals, **params) -> bool:
        if any(jnp.issubdtype(a.dtype, jnp.complexfloating) for a in avals):
            return False
        return policy(prim, *avals, **params)

    return saveable


# The values the ``attention`` policy keeps: everything the backward pass needs outside the
# attention sublayer (its output, and the MLP's input, pre-activation and activation).
SAVED_OUTSIDE_ATTENTION = ("attention_output", "mlp_input", "mlp_hidden", "mlp_activation")

REMAT_POLICIES = {
    "none": None,
    "block": jax.checkpoint_policies.nothing_saveable,
    "attention": jax.checkpoint_policies.save_only_these_names(*SAVED_OUTSIDE_ATTENTION),
    "dots": real_dots_only(jax.checkpoint_policies.dots_saveable),
    "dots_no_batch": real_dots_only(jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
}


def remat_policy(remat: bool | str) -> str:
    """The :data:`REMAT_POLICIES` name of a ``trainer.remat`` value (``false``/``true``:
    none/block)."""
    if isinstance(remat, bool | np.bool_):
        return "block" if remat else "none"
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {', '.join(REMAT_POLICIES)}; got {remat!r}")
    return str(remat)


# What a call accepts as ``rngs``: an nnx.Rngs (its "dropout" stream, else "default"), a JAX
# key (wrapped as nnx.Rngs(dropout=key)), or None when deterministic.
DropoutRngs = nnx.Rngs | jax.Array | None

POSITIONS = ("sinusoidal", "learned")


@functools.lru_cache(maxsize=32)
def _sinusoidal_np(length: int, dim: int) -> np.ndarray:
    pos = np.arange(length, dtype=np.float64)[:, None]
    channel = np.arange(dim)
    inv_freq = np.power(10000.0, -(2 * (channel // 2)) / dim)
    angles = pos * inv_freq[None, :]
    table = np.where(channel % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)
    table.setflags(write=False)
    return table


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
    """Fixed sinusoidal position table float32[length, dim] (Vaswani et al. 2017).

    Interleaved layout: channel 2i is sin(p / 10000^(2i/dim)), channel 2i+1 the cos of the
    same angle. (The official LRA code puts all sines first, then all cosines: the same
    table up to a fixed permutation of channels.)
    """
    if length < 0 or dim < 1:
        raise ValueError(
            f"sinusoidal_positions: need length >= 0 and dim >= 1, got {length}, {dim}"
        )
    return jnp.asarray(_sinusoidal_np(int(length), int(dim)))


def call_rngs(deterministic: bool, rngs: Any, where: str) -> nnx.Rngs | None:
    """The dropout Rngs to thread down: None when deterministic, else required."""
    if deterministic:
        return None
    if rngs is None:
        raise ValueError(
            f"{where}: deterministic=False needs rngs for dropout; pass "
            "rngs=nnx.Rngs(dropout=key) (or a JAX key) at call time"
        )
    if isinstance(rngs, nnx.Rngs):
        return rngs
    if isinstance(rngs, jax.Array):
        return nnx.Rngs(dropout=rngs)
    raise TypeError(f"{where}: rngs must be an nnx.Rngs or a JAX key, got {type(rngs).__name__}")


def padding_mask(lengths: jax.Array, length: int) -> jax.Array:
    """bool[B, length], True at the first ``lengths[b]`` positions of row b."""
    return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def check_causal(schedule: Sequence[str]) -> None:
    """Raise a one-line ValueError naming the first layer of ``schedule`` (one mechanism name
    per layer) whose mechanism has no causal mode."""
    for index, name in enumerate(schedule):
        if not supports_causal(name):
            where = f" (layer {index + 1} of {len(schedule)})" if len(set(schedule)) > 1 else ""
            raise ValueError(
                f"attention {name!r}{where} has no causal mode; causal pretraining works with: "
                f"{', '.join(causal_mechanisms())} and outside mechanisms whose constructor "
                "takes causal=... (pretrain=masked works with every mechanism)"
            )


class Embedder(nnx.Module):
    """Token embedding (+ prepended CLS vector) + positions, then dropout."""

    def __init__(
        self,
        *,
        vocab_size: int,
        dim: int,
        max_len: int,
        positions: str,
        cls_token: bool,
        dropout: float,
        rngs: nnx.Rngs,
    ):
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        self.dim = dim
        self.max_len = max_len
        self.positions = positions
        self.max_positions = max_len + int(cls_token)
        # Own table rather than nnx.Embed, which casts its output to the dtype it was built
        # with; this one follows the parameter dtype. Init std 1.0 as in the official LRA.
        self.vocab_size = vocab_size
        self.embedding = nnx.Param(
            nnx.initializers.normal(1.0)(rngs.params(), (vocab_size, dim), jnp.float32)
        )
        self.cls = nnx.Param(jnp.zeros((dim,), jnp.float32)) if cls_token else None
        if positions == "learned":
            init = nnx.initializers.normal(0.02)
            self.pos = nnx.Param(init(rngs.params(), (self.max_positions, dim), jnp.float32))
        else:
            self.pos = None
        self.dropout = nnx.Dropout(dropout)

    def __call__(
        self,
        tokens: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be int[B, L], got shape {tokens.shape}")
        b, n = tokens.shape
        if n > self.max_len:
            raise ValueError(f"token length {n} exceeds max_len={self.max_len}; raise max_len")
        x = jnp.take(self.embedding[...], tokens, axis=0)  # ids outside the vocab give NaN
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (b, 1, self.dim))
            x = jnp.concatenate([cls, x], axis=1)
            mask = jnp.concatenate([jnp.ones((b, 1), bool), mask], axis=1)
        length = x.shape[1]
        if self.pos is not None:
            pos = self.pos[:length]
        else:
            pos = sinusoidal_positions(length, self.dim)
        x = x + pos.astype(x.dtype)[None]
        return self.dropout(x, deterministic=deterministic, rngs=rngs), mask


class MLP(nnx.Module):
    """Dense(dim -> mlp_dim), GELU, dropout, Dense(mlp_dim -> dim)."""

    def __init__(self, *, dim: int, mlp_dim: int, dropout: float, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(dim, mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)

    def __call__(self, x, *, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        # the names mark what remat=attention keeps (SAVED_OUTSIDE_ATTENTION)
        h = checkpoint_name(self.fc1(checkpoint_name(x, "mlp_input")), "mlp_hidden")
        h = self.dropout(nnx.gelu(h), deterministic=deterministic, rngs=rngs)
        return self.fc2(checkpoint_name(h, "mlp_activation"))


class Block(nnx.Module):
    """Pre-norm block: x + drop(attn(N x)), then x + drop(mlp(N x)); post-norm block:
    N(x + drop(attn x)), then N(x + drop(mlp x)). N is a LayerNorm or a masked BatchNorm
    (lra.models.norms).

    If the mechanism's class sets ``replaces_mlp = True`` the block is the attention
    sub-layer alone.
    """

    def __init__(
        self,
        *,
        attention: str,
        attention_options: Mapping[str, Any],
        dim: int,
        qkv_dim: int,
        num_heads: int,
        mlp_dim: int,
        max_len: int,
        dropout: float,
        attention_dropout: float,
        rngs: nnx.Rngs,
        causal: bool = False,
        norm: str = "layer",
        norm_position: str = "pre",
        norm_momentum: float = 0.9,
    ):
        """``causal``: build the mechanism with ``causal=True`` (it must declare it).
        ``norm`` (layer | batch), ``norm_position`` (pre | post) and a BatchNorm's
        ``norm_momentum``: lra.models.norms."""
        check_norm(norm, norm_position)
        self.kind = attention
        self.pre_norm = norm_position == "pre"
        if causal:
            attention_options = {**attention_options, "causal": True}
        self.attention_norm = make_norm(norm, dim, momentum=norm_momentum, rngs=rngs)
        self.attention = make_attention(
            attention,
            dim=dim,
            num_heads=num_heads,
            max_len=max_len,
            rngs=rngs,
            qkv_dim=qkv_dim,
            dropout_rate=attention_dropout,
            **attention_options,
        )
        self.attention_dropout = nnx.Dropout(dropout)
        self.has_mlp = not getattr(type(self.attention), "replaces_mlp", False)
        if self.has_mlp:
            self.mlp_norm = make_norm(norm, dim, momentum=norm_momentum, rngs=rngs)
            self.mlp = MLP(dim=dim, mlp_dim=mlp_dim, dropout=dropout, rngs=rngs)
            self.mlp_dropout = nnx.Dropout(dropout)
        else:
            self.mlp_norm = self.mlp = self.mlp_dropout = None

    def __call__(
        self,
        x,
        *,
        mask,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ):
        kw = {"deterministic": deterministic, "rngs": rngs}

        def sublayer(x, norm, layer, dropout, name=None):
            h = normalize(norm, x, mask, deterministic=deterministic) if self.pre_norm else x
            h = layer(h)
            if name is not None:  # named for remat=attention, which keeps it
                h = checkpoint_name(h, name)
            x = x + dropout(h, **kw)
            return x if self.pre_norm else normalize(norm, x, mask, deterministic=deterministic)

        x = sublayer(
            x,
            self.attention_norm,
            lambda h: self.attention(h, mask=mask, **kw),
            self.attention_dropout,
            "attention_output",
        )
        if self.has_mlp:
            x = sublayer(x, self.mlp_norm, lambda h: self.mlp(h, **kw), self.mlp_dropout)
        return x


class Encoder(nnx.Module):
    """Embedder, ``num_layers`` blocks, final LayerNorm. Returns (h, mask)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        max_len: int,
        num_layers: int,
        dim: int,
        qkv_dim: int | None,
        num_heads: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
        positions: str,
        cls_token: bool,
        attention: str | Sequence[str] | Mapping[str, Any],
        attention_options: Mapping[str, Mapping[str, Any]] | None = None,
        remat: bool | str = False,
        causal: bool = False,
        attention_max_len: int | None = None,
        norm: str = "layer",
        norm_position: str = "pre",
        norm_momentum: float = 0.9,
        rngs: nnx.Rngs,
    ):
        """``remat`` (a :data:`REMAT_POLICIES` name; ``True``/``False``: block/none) chooses
        what the backward pass recomputes instead of storing: less memory, more compute.
        ``causal``: every layer in causal mode (see the module docstring).
        ``attention_max_len``: the length the layers are built for (default ``max_len`` plus the
        CLS token): a pretraining model without the classifier's CLS token passes the
        classifier's, so that mechanisms with length-shaped parameters (Linformer's
        projections, Synthesizer's tables, FLASH's relative bias) hand over their shapes.
        ``norm`` (layer | batch), ``norm_position`` (pre | post) and a BatchNorm's
        ``norm_momentum``: lra.models.norms; a post-norm encoder has no final norm."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        check_norm(norm, norm_position)
        if causal and norm == "batch":
            raise ValueError(
                "norm=batch takes its statistics over every position of the batch, which a "
                "causal (next-token) model must not see; use norm=layer with pretrain=causal"
            )
        self.schedule = resolve_schedule(attention, num_layers)
        if causal:
            check_causal(self.schedule)
        self.causal = bool(causal)
        warning = describe_layers(attention, num_layers)["schedule_warning"]
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=1)  # nnx calls __init__ itself
        options = resolve_options(attention_options, self.schedule)
        self.embedder = Embedder(
            vocab_size=vocab_size,
            dim=dim,
            max_len=max_len,
            positions=positions,
            cls_token=cls_token,
            dropout=dropout,
            rngs=rngs,
        )
        self.blocks = nnx.List(
            [
                Block(
                    attention=name,
                    attention_options=options[name],
                    dim=dim,
                    qkv_dim=dim if qkv_dim is None else qkv_dim,
                    num_heads=num_heads,
                    mlp_dim=mlp_dim,
                    max_len=attention_max_len or max_len + int(cls_token),
                    dropout=dropout,
                    attention_dropout=attention_dropout,
                    rngs=rngs,
                    causal=self.causal,
                    norm=norm,
                    norm_position=norm_position,
                    norm_momentum=norm_momentum,
                )
                for name in self.schedule
            ]
        )
        # one assignment: a module, or None for post-norm (nnx fixes an attribute's kind at
        # its first assignment)
        self.final_norm = (
            make_norm(norm, dim, momentum=norm_momentum, rngs=rngs)
            if norm_position == "pre"
            else None
        )
        self.remat = remat_policy(remat)

    def __call__(self, tokens, lengths, *, deterministic: bool = True, rngs: DropoutRngs = None):
        rngs = call_rngs(deterministic, rngs, "Encoder")
        tokens = jnp.asarray(tokens)
        lengths = jnp.asarray(lengths)
        if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
            raise ValueError(
                f"need tokens int[B, L] and lengths int[B]; got {tokens.shape} and {lengths.shape}"
            )
        mask = padding_mask(lengths, tokens.shape[1])
        kw = {"deterministic": deterministic, "rngs": rngs}
        x, mask = self.embedder(tokens, mask, **kw)

        if self.remat == "none":
            for block in self.blocks:
                x = block(x, mask=mask, **kw)
        else:
            # A scan over each run of identical layers: one layer recomputed at a time, so the
            # policy lowers memory on every path (models/layer_scan.py has why and the numbers).
            policy = REMAT_POLICIES[self.remat]
            for run in runs_of_equal_layers(self.blocks):
                x = scan_blocks(run, x, mask, policy=policy, **kw)
        if self.final_norm is not None:
            x = normalize(self.final_norm, x, mask, deterministic=deterministic)
        return x, mask
