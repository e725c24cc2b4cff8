"""The LRA classifier: embeddings, pre-LayerNorm encoder blocks, pooling, classifier heads.

Shapes (B batch, L token length <= max_len, D = dim, C classes):

    tokens:  int32[B, L]       lengths: int32[B]  (the padding mask is arange(L) < lengths,
                                                   never derived from token values)
    Embedder -> float[B, L', D], mask bool[B, L']  with L' = L + 1 under CLS pooling (a learned
                                                   CLS vector is prepended before positions
                                                   are added, as in the official LRA encoder)
    Encoder  -> float[B, L', D]                    num_layers blocks, then a final LayerNorm
    pool     -> float[B, D]                        'cls': position 0; 'mean': masked mean
    Classifier     -> float[B, C]                  Dense(mlp_dim), ReLU, Dense(C)
    DualClassifier -> float[B, C]                  Retrieval: one shared encoder for both
                                                   documents, [u, v, u*v, u-v] -> Dense(mlp_dim)
                                                   ReLU -> Dense(mlp_dim // 2) ReLU -> Dense(C)

Attention per layer: ``attention`` is one registered name (every layer), a list of
``num_layers`` names (a per-layer schedule, lowest layer first) or a lower/upper split (see
``resolve_schedule``). ``attention_options`` maps a mechanism name to the keyword options for
every layer using that mechanism; a mechanism absent from the map gets no extra options. Keys
naming no registered mechanism are an error (this catches flat option dicts such as
``{"num_features": 256}``); options for a registered mechanism the schedule does not use at
this depth are ignored. A split whose lower or upper part comes to 0 layers at this depth
(e.g. on 1-layer tasks) is one mechanism throughout: ``describe_layers`` reports what each
layer became, and the Encoder warns (UserWarning).

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
from lra.models.registry import make_attention
from lra.models.registry import names as registered_names

__all__ = [
    "MLP",
    "Block",
    "Classifier",
    "DualClassifier",
    "Embedder",
    "Encoder",
    "build_classifier",
    "describe_layers",
    "pool",
    "sinusoidal_positions",
]

# What a call accepts as ``rngs``: an nnx.Rngs (its "dropout" stream, else "default"), a JAX
# key (wrapped as nnx.Rngs(dropout=key)), or None when deterministic.
DropoutRngs = nnx.Rngs | jax.Array | None

POOLINGS = ("cls", "mean", "last")
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


def _call_rngs(deterministic: bool, rngs: Any, where: str) -> nnx.Rngs | None:
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
        h = nnx.gelu(self.fc1(x))
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return self.fc2(h)


class Block(nnx.Module):
    """Pre-LayerNorm block: x + drop(attn(LN x)), then x + drop(mlp(LN x)).

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
    ):
        self.kind = attention
        self.attention_norm = nnx.LayerNorm(dim, rngs=rngs)
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
            self.mlp_norm = nnx.LayerNorm(dim, rngs=rngs)
            self.mlp = MLP(dim=dim, mlp_dim=mlp_dim, dropout=dropout, rngs=rngs)
            self.mlp_dropout = nnx.Dropout(dropout)
        else:
            self.mlp_norm = self.mlp = self.mlp_dropout = None

    def __call__(self, x, *, mask, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        kw = {"deterministic": deterministic, "rngs": rngs}
        x = x + self.attention_dropout(
            self.attention(self.attention_norm(x), mask=mask, **kw), **kw
        )
        if self.has_mlp:
            x = x + self.mlp_dropout(self.mlp(self.mlp_norm(x), **kw), **kw)
        return x


def resolve_schedule(attention: str | Sequence[str] | Mapping, num_layers: int) -> tuple[str, ...]:
    """One mechanism name per layer, lowest first.

    ``attention`` is one name (every layer), a list of ``num_layers`` names, or a split
    ``{"lower": name, "upper": name, "lower_fraction": f}``: the lowest
    ``int(num_layers * f)`` layers use ``lower`` and the rest ``upper`` (short-range lower
    layers and global upper layers, Rae and Razavi 2020; TransNormer's Diag-then-Norm layout),
    so one model config fits tasks of any depth. At a depth where one part comes to 0 layers
    the split silently becomes one mechanism; :func:`describe_layers` reports that, and the
    Encoder warns.
    """
    if isinstance(attention, str):
        return (attention,) * num_layers
    if isinstance(attention, Mapping):
        unknown = set(attention) - {"lower", "upper", "lower_fraction"}
        if unknown or not {"lower", "upper"} <= set(attention):
            raise ValueError(
                "a split attention schedule needs keys lower, upper and optionally "
                f"lower_fraction (default 0.5), got {sorted(attention)}"
            )
        _, num_lower = _split_parts(attention, num_layers)
        return (attention["lower"],) * num_lower + (attention["upper"],) * (num_layers - num_lower)
    if not isinstance(attention, Sequence) or not all(isinstance(a, str) for a in attention):
        raise ValueError(
            f"attention must be a mechanism name, a list of names or a lower/upper split, "
            f"got {attention!r}"
        )
    if len(attention) != num_layers:
        raise ValueError(
            f"attention schedule has {len(attention)} entries but num_layers={num_layers}; "
            "give one mechanism name per layer (or a single name for all layers)"
        )
    return tuple(attention)


def _split_parts(attention: Mapping, num_layers: int) -> tuple[float, int]:
    """(lower_fraction, number of lower layers) of a lower/upper split; see resolve_schedule."""
    fraction = float(attention.get("lower_fraction", 0.5))
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"lower_fraction must be in [0, 1], got {fraction}")
    return fraction, int(num_layers * fraction)


def _depth_with_both_parts(fraction: float) -> int | None:
    """The smallest num_layers whose split has at least one lower and one upper layer (None
    if no depth does, i.e. lower_fraction 0 or 1)."""
    for depth in range(2, 1001):
        if 0 < int(depth * fraction) < depth:
            return depth
    return None


def describe_layers(
    attention: str | Sequence[str] | Mapping, num_layers: int
) -> dict[str, list[str] | str | None]:
    """What each layer of a schedule becomes at this depth, and a warning if a two-part
    schedule lost one of its parts.

    Returns ``{"layer_mechanisms": [name per layer, lowest first], "schedule_warning": str |
    None}``. The warning is set when ``attention`` is a lower/upper split (with two different
    mechanisms) whose ``int(num_layers * lower_fraction)`` lower layers come to 0 or to
    ``num_layers``: e.g. TransNormer's Diag-then-Norm split on a 1-layer task (LRA Image,
    Path-X) is pure NormAttention. It says what each layer became and what to change. The
    schedule itself is not changed (see :func:`resolve_schedule`).
    """
    layers = list(resolve_schedule(attention, num_layers))
    warning = None
    if isinstance(attention, Mapping) and attention["lower"] != attention["upper"]:
        lower, upper = str(attention["lower"]), str(attention["upper"])
        fraction, num_lower = _split_parts(attention, num_layers)
        if num_lower in (0, num_layers):
            missing, kept = ("lower", upper) if num_lower == 0 else ("upper", lower)
            depth = _depth_with_both_parts(fraction)
            if depth is None:
                fix = "set lower_fraction strictly between 0 and 1"
            else:
                fix = (
                    f"use a deeper model, at least {depth} layers "
                    f"(e.g. task.arch.num_layers={depth}), or change lower_fraction"
                )
            warning = (
                f"attention schedule {{lower: {lower}, upper: {upper}, lower_fraction: "
                f"{fraction:g}}} with num_layers={num_layers} gives int({num_layers} * "
                f"{fraction:g}) = {num_lower} lower layers: no {missing} layer, every layer is "
                f"{kept} (layers, lowest first: {layers}), so this is not the two-part model "
                f"the config names; to get both parts, {fix}"
            )
    return {"layer_mechanisms": layers, "schedule_warning": warning}


def resolve_options(
    attention_options: Mapping[str, Mapping[str, Any]] | None, schedule: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Options per mechanism name in ``schedule`` (``{}`` for those absent from the map)."""
    attention_options = {} if attention_options is None else attention_options
    if not isinstance(attention_options, Mapping):
        raise ValueError(
            f"attention_options must map mechanism name -> options, got {attention_options!r}"
        )
    used = sorted(set(schedule))
    # Options for a registered mechanism that this depth's schedule happens not to use are
    # ignored (a lower/upper split may leave one part empty); any other key is a mistake.
    stray = sorted(set(attention_options) - set(used) - set(registered_names()))
    if stray:
        raise ValueError(
            f"attention_options keys {stray} name no registered mechanism; "
            "attention_options maps a mechanism name to its options, e.g. "
            "{'performer': {'num_features': 256}}"
        )
    out = {}
    for name in used:
        opts = attention_options.get(name) or {}
        if not isinstance(opts, Mapping):
            raise ValueError(f"attention_options[{name!r}] must be a mapping, got {opts!r}")
        out[name] = dict(opts)
    return out


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
        remat: bool = False,
        rngs: nnx.Rngs,
    ):
        """``remat=True`` recomputes each block's activations in the backward pass
        (``nnx.remat`` per block) instead of storing them: less memory, more compute."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.schedule = resolve_schedule(attention, num_layers)
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
                    max_len=max_len + int(cls_token),
                    dropout=dropout,
                    attention_dropout=attention_dropout,
                    rngs=rngs,
                )
                for name in self.schedule
            ]
        )
        self.final_norm = nnx.LayerNorm(dim, rngs=rngs)
        self.remat = bool(remat)

    def __call__(self, tokens, lengths, *, deterministic: bool = True, rngs: DropoutRngs = None):
        rngs = _call_rngs(deterministic, rngs, "Encoder")
        tokens = jnp.asarray(tokens)
        lengths = jnp.asarray(lengths)
        if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
            raise ValueError(
                f"need tokens int[B, L] and lengths int[B]; got {tokens.shape} and {lengths.shape}"
            )
        mask = padding_mask(lengths, tokens.shape[1])
        kw = {"deterministic": deterministic, "rngs": rngs}
        x, mask = self.embedder(tokens, mask, **kw)

        def run_block(block, x, mask, rngs):
            return block(x, mask=mask, deterministic=deterministic, rngs=rngs)

        if self.remat:
            run_block = nnx.remat(run_block)
        for block in self.blocks:
            x = run_block(block, x, mask, rngs)
        return self.final_norm(x), mask


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
        rngs = _call_rngs(deterministic, rngs, "Classifier")
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
        rngs = _call_rngs(deterministic, rngs, "DualClassifier")
        kw = {"deterministic": deterministic, "rngs": rngs}
        u = pool(*self.encoder(tokens1, lengths1, **kw), self.pooling)
        v = pool(*self.encoder(tokens2, lengths2, **kw), self.pooling)
        z = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        z = nnx.relu(self.hidden1(z))
        z = nnx.relu(self.hidden2(z))
        return self.logits(z)


def build_classifier(*, dual: bool, **kwargs: Any) -> Classifier | DualClassifier:
    """``DualClassifier(**kwargs)`` if ``dual`` (Retrieval), else ``Classifier(**kwargs)``."""
    return (DualClassifier if dual else Classifier)(**kwargs)
