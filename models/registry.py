"""Name -> class registry of attention mechanisms: built-ins, import paths, entry points.

A mechanism is an ``nnx.Module`` subclass registered under a unique name::

    @register("softmax")
    class SoftmaxAttention(nnx.Module):
        memory_class = "quadratic"          # or "linear": how memory grows with length
        same_without_padding = True         # output at real tokens = output without padding
        def __init__(self, *, dim, num_heads, max_len, rngs, qkv_dim=None, dropout_rate=0.0,
                     **its_own_options): ...
        def __call__(self, x, *, mask, deterministic=True, rngs=None): ...

and built with ``make_attention(name, dim=..., num_heads=..., max_len=..., rngs=..., **options)``.
Shapes: ``x: float[B, L, D]``, ``mask: bool[B, L]`` (True = real token), result
``float[B, L, D]``. Every mechanism accepts the options ``qkv_dim`` and ``dropout_rate``
(the encoder always passes them); any others are its own.

A class attribute ``replaces_mlp = True`` tells the encoder block that the mechanism is a
whole layer (a gated attention unit such as FLASH) and the block has no MLP sub-layer.
A mechanism has a causal mode (for next-token pretraining, issue 28) iff its constructor
declares a keyword argument ``causal`` (``causal: bool = False``): with ``causal=True`` its
output at position i depends only on inputs at positions <= i, and its parameters are the same
as with ``causal=False``. :func:`supports_causal` tells (by signature, for built-ins, entry
points and import paths alike); :func:`causal_mechanisms` lists the built-ins that have it.

``memory_class`` and ``same_without_padding`` are declarations that ``lra-check-attention``
(:mod:`lra.measure.conformance`) verifies.

A mechanism name is one of three things, looked up in this order:

1. a built-in name (``models/attention/*.py``, registered with :func:`register`);
2. a name an installed package declares in the entry-point group ``lra.attention``
   (``[project.entry-points."lra.attention"] my_attention = "my_pkg.attention:MyAttention"``);
3. an import path ``package.module:ClassName``.

Outside classes are checked when first loaded: an ``nnx.Module`` subclass whose constructor
and call take the arguments above. Failures raise :class:`RegistryError` naming the module
and what is wrong.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib import metadata
from typing import Any

from flax import nnx

__all__ = [
    "ENTRY_POINT_GROUP",
    "RegistryError",
    "available",
    "causal_mechanisms",
    "get",
    "is_builtin",
    "make_attention",
    "names",
    "register",
    "source",
    "supports_causal",
]

ENTRY_POINT_GROUP = "lra.attention"

_REGISTRY: dict[str, type[nnx.Module]] = {}
_LOADED: dict[str, type[nnx.Module]] = {}  # entry-point names and import paths, once checked

# Constructor arguments every mechanism receives from make_attention itself.
_CORE_ARGS = ("dim", "num_heads", "max_len", "rngs")
# Keyword arguments every mechanism's constructor and call must accept.
_INIT_ARGS = (*_CORE_ARGS, "qkv_dim", "dropout_rate")
_CALL_ARGS = ("mask", "deterministic", "rngs")
_CONTRACT = (
    "every mechanism is an nnx.Module with __init__(self, *, dim, num_heads, max_len, rngs, "
    "qkv_dim=None, dropout_rate=0.0, ...) and __call__(self, x, *, mask, deterministic=True, "
    "rngs=None)"
)


class RegistryError(ValueError):
    """An unknown, clashing or malformed mechanism, or options a mechanism does not take."""


def _lacking(function: Callable, required: tuple[str, ...]) -> list[str]:
    """The names in ``required`` that ``function`` cannot take as keyword arguments."""
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [a for a in required if a not in params or params[a].kind not in keyword]


def check_contract(cls: Any, where: str) -> type[nnx.Module]:
    """Return ``cls`` if it keeps the mechanism contract; else raise naming ``where``."""
    if not (inspect.isclass(cls) and issubclass(cls, nnx.Module)):
        raise RegistryError(
            f"attention {where}: {cls!r} is not an nnx.Module subclass; {_CONTRACT}"
        )
    for method, required in (("__init__", _INIT_ARGS), ("__call__", _CALL_ARGS)):
        lacking = _lacking(getattr(cls, method), required)
        if lacking:
            raise RegistryError(
                f"attention {where}: {cls.__module__}.{cls.__qualname__}.{method} does not "
                f"take {', '.join(lacking)}; {_CONTRACT}"
            )
    return cls


def register(name: str) -> Callable[[type[nnx.Module]], type[nnx.Module]]:
    """Class decorator registering a built-in attention mechanism under ``name``.

    Raises ``RegistryError`` if ``name`` is already taken or the class breaks the contract.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise RegistryError(f"attention name must be a non-empty string without ':', got {name!r}")

    def decorator(cls: type[nnx.Module]) -> type[nnx.Module]:
        if name in _REGISTRY:
            raise RegistryError(
                f"attention name {name!r} is already registered to "
                f"{_REGISTRY[name].__module__}.{_REGISTRY[name].__qualname__}; "
                f"pick another name for {cls.__module__}.{cls.__qualname__}"
            )
        _REGISTRY[name] = check_contract(cls, repr(name))
        return cls

    return decorator


def names() -> tuple[str, ...]:
    """The built-in mechanism names, sorted."""
    return tuple(sorted(_REGISTRY))


def _entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Installed ``lra.attention`` entry points by name (a list: names may clash)."""
    found: dict[str, list[metadata.EntryPoint]] = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if all(point.value != p.value for p in found.get(point.name, [])):
            found.setdefault(point.name, []).append(point)
    return found


def _distribution(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an installed package"


def available() -> tuple[str, ...]:
    """Built-in names and the names installed packages declare as entry points, sorted."""
    return tuple(sorted(set(_REGISTRY) | set(_entry_points())))


def is_builtin(name: str) -> bool:
    return name in _REGISTRY


def _load_import_path(path: str) -> type[nnx.Module]:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise RegistryError(
            f"attention {path!r}: an import path is 'package.module:ClassName', "
            "with both parts non-empty"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise RegistryError(
            f"attention {path!r}: cannot import module {module_name!r}: "
            f"{type(err).__name__}: {err}; is its package installed (pip install -e ...) "
            "or on PYTHONPATH?"
        ) from err
    cls: Any = module
    for part in attribute.split("."):
        try:
            cls = getattr(cls, part)
        except AttributeError:
            raise RegistryError(
                f"attention {path!r}: module {module_name!r} ({module.__file__}) has no "
                f"attribute {attribute!r}"
            ) from None
    return check_contract(cls, repr(path))


def _load_entry_point(name: str, points: list[metadata.EntryPoint]) -> type[nnx.Module]:
    if name in _REGISTRY:
        raise RegistryError(
            f"attention name clash: {_distribution(points[0])} declares entry point "
            f"{name!r} = {points[0].value!r} in group {ENTRY_POINT_GROUP!r}, but {name!r} is "
            "a built-in mechanism; rename the entry point in that package's pyproject.toml"
        )
    if len(points) > 1:
        declared = "; ".join(f"{_distribution(p)}: {p.value!r}" for p in points)
        raise RegistryError(
            f"attention name clash: {name!r} is declared by more than one installed package "
            f"({declared}); uninstall one or use an import path package.module:ClassName"
        )
    try:
        cls = points[0].load()
    except Exception as err:
        raise RegistryError(
            f"attention {name!r}: cannot load entry point {points[0].value!r} of "
            f"{_distribution(points[0])}: {type(err).__name__}: {err}"
        ) from err
    return check_contract(cls, f"{name!r} (entry point {points[0].value!r})")


def get(name: str) -> type[nnx.Module]:
    """The class for a built-in name, an entry-point name or an import path.

    Raises ``RegistryError`` for an unknown name, a clash, or a class that cannot be loaded
    or breaks the contract.
    """
    if not isinstance(name, str) or not name:
        raise RegistryError(f"attention mechanism must be a non-empty string, got {name!r}")
    points = _entry_points().get(name)
    if name in _REGISTRY and not points:
        return _REGISTRY[name]
    if name not in _LOADED:
        if points:
            _LOADED[name] = _load_entry_point(name, points)
        elif ":" in name:
            _LOADED[name] = _load_import_path(name)
        else:
            raise RegistryError(
                f"unknown attention mechanism {name!r}; available: {', '.join(available())}; "
                "or give an import path 'package.module:ClassName'"
            )
    return _LOADED[name]


def source(name: str) -> str:
    """Where ``name``'s class comes from: ``module:Class``, plus the package for entry points."""
    cls = get(name)
    where = f"{cls.__module__}:{cls.__qualname__}"
    points = _entry_points().get(name)
    return f"{where} from {_distribution(points[0])}" if points else where


def _declares_causal(cls: type) -> bool:
    """Whether ``cls.__init__`` names a keyword argument ``causal`` (``**kwargs`` does not
    count)."""
    param = inspect.signature(cls.__init__).parameters.get("causal")
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return param is not None and param.kind in keyword


def supports_causal(name: str) -> bool:
    """Whether mechanism ``name`` (built-in, entry point or import path) has a causal mode: its
    constructor declares the keyword ``causal``. Raises ``RegistryError`` as :func:`get`."""
    return _declares_causal(get(name))


def causal_mechanisms() -> tuple[str, ...]:
    """The built-in mechanism names with a causal mode, sorted."""
    return tuple(name for name in names() if _declares_causal(_REGISTRY[name]))


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
    """Build the mechanism ``name`` (built-in, entry point or ``package.module:ClassName``).

    ``max_len`` is the longest sequence the module will see (including a CLS token, if any).
    Raises ``RegistryError`` for an unknown name or an option the mechanism does not take.
    """
    cls = get(name)
    _check_options(name, cls, options)
    return cls(dim=dim, num_heads=num_heads, max_len=max_len, rngs=rngs, **options)
