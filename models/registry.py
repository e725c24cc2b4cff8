"""Name -> class registry of attention mechanisms.

A mechanism is an ``nnx.Module`` subclass registered under a unique name::

    @register("softmax")
    class SoftmaxAttention(nnx.Module):
        def __init__(self, *, dim, num_heads, max_len, rngs, qkv_dim=None, dropout_rate=0.0,
                     **its_own_options): ...
        def __call__(self, x, *, mask, deterministic=True, rngs=None): ...

and built with ``make_attention(name, dim=..., num_heads=..., max_len=..., rngs=..., **options)``.
Shapes: ``x: float[B, L, D]``, ``mask: bool[B, L]`` (True = real token), result
``float[B, L, D]``. Every mechanism accepts the options ``qkv_dim`` and ``dropout_rate``
(the encoder always passes them); any others are its own.

A class attribute ``replaces_mlp = True`` tells the encoder block that the mechanism is a
whole layer (a gated attention unit such as FLASH) and the block has no MLP sub-layer.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from flax import nnx

__all__ = ["RegistryError", "make_attention", "names", "register"]

_REGISTRY: dict[str, type[nnx.Module]] = {}

# Constructor arguments every mechanism receives from make_attention itself.
_CORE_ARGS = ("dim", "num_heads", "max_len", "rngs")


class RegistryError(ValueError):
    """An unknown or duplicate mechanism name, or options a mechanism does not take."""


def register(name: str) -> Callable[[type[nnx.Module]], type[nnx.Module]]:
    """Class decorator registering an attention mechanism under ``name``.

    Raises ``RegistryError`` if ``name`` is already taken.
    """
    if not isinstance(name, str) or not name:
        raise RegistryError(f"attention name must be a non-empty string, got {name!r}")

    def decorator(cls: type[nnx.Module]) -> type[nnx.Module]:
        if name in _REGISTRY:
            raise RegistryError(
                f"attention name {name!r} is already registered to "
                f"{_REGISTRY[name].__module__}.{_REGISTRY[name].__qualname__}; "
                f"pick another name for {cls.__module__}.{cls.__qualname__}"
            )
        _REGISTRY[name] = cls
        return cls

    return decorator


def names() -> tuple[str, ...]:
    """The registered mechanism names, sorted."""
    return tuple(sorted(_REGISTRY))


def get(name: str) -> type[nnx.Module]:
    """The class registered under ``name`` (``RegistryError`` if none)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise RegistryError(
            f"unknown attention mechanism {name!r}; registered: {', '.join(names()) or '(none)'}"
        ) from None


def _check_options(name: str, cls: type, options: dict[str, Any]) -> None:
    """Raise RegistryError naming the mechanism and each option its constructor lacks."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    clashing = sorted(set(options) & set(_CORE_ARGS))
    if clashing:
        raise RegistryError(
            f"attention {name!r}: {', '.join(clashing)} must be given as make_attention "
            "arguments, not as options"
        )
    accepted = sorted(k for k, p in params.items() if k != "self" and k not in _CORE_ARGS)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise RegistryError(
            f"attention {name!r} does not take option(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(accepted) or '(none)'}"
        )


def make_attention(
    name: str, *, dim: int, num_heads: int, max_len: int, rngs: nnx.Rngs, **options: Any
) -> nnx.Module:
    """Build the mechanism registered as ``name``.

    ``max_len`` is the longest sequence the module will see (including a CLS token, if any).
    Raises ``RegistryError`` for an unknown name or an option the mechanism does not take.
    """
    cls = get(name)
    _check_options(name, cls, options)
    return cls(dim=dim, num_heads=num_heads, max_len=max_len, rngs=rngs, **options)
