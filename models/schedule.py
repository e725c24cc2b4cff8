"""Per-layer attention schedules: which mechanism each encoder layer uses, and its options.

``attention`` is one registered name (every layer), a list of ``num_layers`` names (lowest
layer first) or a lower/upper split ``{"lower": name, "upper": name, "lower_fraction": f}``
(short-range lower layers, global upper layers). ``attention_options`` maps a mechanism name to
the keyword options of every layer using it; keys naming no registered mechanism are an error.
A split whose lower or upper part comes to 0 layers at this depth is one mechanism throughout:
``describe_layers`` reports what each layer became.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lra.models.registry import names as registered_names


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
