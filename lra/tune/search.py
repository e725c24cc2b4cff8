"""The search space of ``lra-tune``: which config keys a study searches, and over what.

``tune.search=auto`` reads ``configs/search/<protocol>.yaml`` (the learning rate, weight decay,
dropout and warm-up fraction) and adds the model's section of ``configs/search/model/<model>.yaml``
where there is one (the state-space mixers' SSM learning rate): its ``<protocol>`` section, else
``default``. ``tune.search=<path>`` reads one YAML file of the same form, the whole space.

Each key is a dotted config key the schema (:mod:`lra.config.types`) knows, mapped to one of::

    {low: a, high: b, log: bool, type: float|int}   a value in [a, b]
    {factor: [a, b], log: bool}                     a x .. b x the base config's value
    {fraction_of: K, low: a, high: b}               round(f x the value of K), f in [a, b]
    {choices: [v1, v2, ...]}                        one of the values
    {value: v}                                      set, not searched

An entry may add ``also: [keys]`` (those keys take the same value) and ``grid: [...]`` (the points
``tune.sampler=grid`` tries; for ``factor`` and ``fraction_of`` entries, factors and fractions).
:func:`check_space` sets every key to the ends of its range in a copy of the base config and runs
the schema on it, so a key the harness does not have or a range outside the schema's is one
line before any trial starts. The space's hash (:func:`space_hash`) is part of the study's name
and of the final runs' ``tuning`` block.
"""

import copy
import dataclasses
import hashlib
import json
import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from lra.config import schema
from lra.config.compose import CONFIG_DIR
from lra.config.types import TrainConfig
from lra.errors import ConfigError

SEARCH_DIR = Path(CONFIG_DIR) / "search"
_KINDS = ("range", "factor", "fraction", "choices", "value")
_ENTRY_KEYS = {"low", "high", "log", "type", "factor", "fraction_of", "choices", "value", "also"}


@dataclass(frozen=True)
class Param:
    """One key of the space, with its base value resolved (``low``/``high`` are absolute)."""

    key: str
    kind: str  # one of _KINDS
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple = ()
    value: object = None
    fraction_of: str | None = None
    base: float | None = None  # the base value a factor or fraction multiplies
    also: tuple = ()
    grid: tuple = ()
    source: str = ""  # the file that gave it

    @property
    def searched(self) -> bool:
        return self.kind != "value"

    def keys(self) -> tuple[str, ...]:
        return (self.key, *self.also)

    def to_value(self, raw):
        """The config value of a sampled ``raw`` (a factor or fraction becomes the key's value)."""
        if self.kind == "factor":
            return float(raw) * float(self.base)
        if self.kind == "fraction":
            return int(round(float(raw) * float(self.base)))
        if self.integer:
            return int(raw)
        return raw


@dataclass
class Space:
    """The whole search space: its keys in file order and the files it came from."""

    params: list[Param] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def searched_keys(self) -> list[str]:
        return [k for p in self.params for k in p.keys()]

    def describe(self) -> list[dict]:
        return [
            {k: v for k, v in asdict(p).items() if v not in (None, (), "")} for p in self.params
        ]


def space_hash(space: Space) -> str:
    """A short, stable hash of the resolved space (its keys, kinds, ranges and grids)."""
    canonical = json.dumps(
        [{k: v for k, v in p.items() if k != "source"} for p in space.describe()],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"tune.search: cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"tune.search: {path} must map config keys to entries")
    return data


def space_files(search: str, cfg) -> list[tuple[Path, dict]]:
    """``[(file, {key: entry})]`` of ``tune.search=search`` for the train config ``cfg``'s
    protocol and model."""
    search = str(search)
    if search != "auto":
        path = Path(search).expanduser()
        if not path.is_file():
            raise ConfigError(f"tune.search={search}: no such file; give a YAML file or auto")
        return [(path, _read(path))]
    protocol = cfg.get("protocol") or "lra_official"
    path = SEARCH_DIR / f"{protocol}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SEARCH_DIR.glob("*.yaml")))
        raise ConfigError(
            f"tune.search=auto: no search space for protocol={protocol} (configs/search/ has "
            f"{known}); give one with tune.search=<file>"
        )
    files = [(path, _read(path))]
    model_file = SEARCH_DIR / "model" / f"{cfg.model.name}.yaml"
    if model_file.is_file():
        sections = _read(model_file)
        section = sections.get(protocol, sections.get("default")) or {}
        files.append((model_file, section))
    return files


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what}: expected a number, got {value!r}")
    return float(value)


def _base_value(cfg, key: str, source: str):
    value = OmegaConf.select(cfg, key, default=None)
    if value is None:
        raise ConfigError(
            f"tune.search ({source}): {key} has no value in this config to multiply; give "
            "low and high instead"
        )
    return _number(value, f"tune.search ({source}): {key}")


def _is_config_key(key: str) -> bool:
    """Whether the schema has ``key`` (through its dataclasses and ``dict[str, ...]`` maps:
    ``trainer.param_groups.ssm.learning_rate``)."""
    tp = TrainConfig
    for part in key.split("."):
        tp, _ = schema._optional(tp)
        tp, _ = schema._peel(tp)
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]  # the key names one entry of the mapping
            continue
        if not dataclasses.is_dataclass(tp):
            return False
        fields = schema._hints(tp)
        if part not in fields:
            return False
        tp = fields[part]
    return True


def _check_known(key: str, source: str) -> None:
    if not _is_config_key(key):
        raise ConfigError(
            f"tune.search ({source}): {key} is not a config key of the harness; a search key "
            "names one (lra-train --cfg job shows them)"
        )


def parse_param(key: str, entry, cfg, source: str) -> Param:
    """One entry of a search file as a :class:`Param`, its base value read from ``cfg``."""
    where = f"tune.search ({source}): {key}"
    _check_known(key, source)
    if not isinstance(entry, dict) or not entry:
        raise ConfigError(f"{where}: expected a mapping such as {{low: 0.0, high: 0.1}}")
    unknown = sorted(set(entry) - _ENTRY_KEYS - {"grid"})
    if unknown:
        raise ConfigError(
            f"{where}: unknown entry key {unknown[0]}; allowed: {sorted(_ENTRY_KEYS)}"
        )
    also = tuple(entry.get("also") or ())
    for other in also:
        _check_known(other, source)
    common = {"key": key, "also": also, "grid": tuple(entry.get("grid") or ()), "source": source}
    log = bool(entry.get("log", False))
    if "value" in entry:
        return Param(kind="value", value=entry["value"], **common)
    if "choices" in entry:
        choices = tuple(entry["choices"] or ())
        if not choices:
            raise ConfigError(f"{where}: choices is empty")
        return Param(
            kind="choices", choices=choices, **{**common, "grid": common["grid"] or choices}
        )
    if "factor" in entry:
        factor = entry["factor"]
        if not (isinstance(factor, list) and len(factor) == 2):
            raise ConfigError(f"{where}: factor takes [low, high], e.g. [0.1, 10.0]")
        low, high = (_number(f, where) for f in factor)
        base = _base_value(cfg, key, source)
        return Param(kind="factor", low=low, high=high, log=log, base=base, **common)
    if "low" not in entry or "high" not in entry:
        raise ConfigError(f"{where}: give low and high, factor, choices or value")
    low, high = _number(entry["low"], where), _number(entry["high"], where)
    if "fraction_of" in entry:
        of = str(entry["fraction_of"])
        _check_known(of, source)
        base = _base_value(cfg, of, source)
        return Param(kind="fraction", low=low, high=high, fraction_of=of, base=base, **common)
    integer = entry.get("type", "float") == "int"
    return Param(kind="range", low=low, high=high, log=log, integer=integer, **common)


def load_space(search: str, cfg) -> Space:
    """The search space ``tune.search=search`` of the train config ``cfg``, checked."""
    space = Space()
    for path, entries in space_files(search, cfg):
        space.files.append(str(path))
        for key, entry in entries.items():
            space.params = [p for p in space.params if p.key != key]  # a model file wins
            space.params.append(parse_param(str(key), entry, cfg, path.name))
    if not any(p.searched for p in space.params):
        raise ConfigError(f"tune.search: {', '.join(space.files)} searches no key")
    check_space(space, cfg)
    return space


def _corners(param: Param) -> list:
    """The raw values whose config values must pass the schema: a range's ends, every choice."""
    if param.kind == "value":
        return [param.value]
    if param.kind == "choices":
        return list(param.choices)
    values = [param.low, param.high, *param.grid]
    if param.low > param.high:
        raise ConfigError(
            f"tune.search ({param.source}): {param.key}: low {param.low} is above high {param.high}"
        )
    if param.log and param.low <= 0:
        raise ConfigError(
            f"tune.search ({param.source}): {param.key}: a log range needs low above 0, "
            f"got {param.low}"
        )
    return values


def apply(cfg, values: dict):
    """A copy of the train config ``cfg`` with ``{dotted key: value}`` set (keys may be new)."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    for key, value in values.items():
        OmegaConf.update(out, key, value, merge=True, force_add=True)
    return out


def fixed_values(space: Space) -> dict:
    return {k: p.value for p in space.params if p.kind == "value" for k in p.keys()}


def check_space(space: Space, cfg) -> None:
    """Each searched value's ends (and grid points) in a copy of ``cfg`` against the schema."""
    # Every key set (the fixed values, each searched key at its first corner), so that
    # relations between keys (a parameter group's rate and decay) hold while one key moves.
    start = fixed_values(space)
    for param in space.params:
        start.update(dict.fromkeys(param.keys(), param.to_value(_corners(param)[0])))
    base = apply(cfg, start)
    for param in space.params:
        for raw in _corners(param):
            value = param.to_value(raw)
            probe = apply(base, dict.fromkeys(param.keys(), value))
            try:
                schema.validate(probe, "config")
            except ConfigError as err:
                raise ConfigError(
                    f"tune.search ({param.source}): {param.key}={value} (an end of its range) "
                    f"breaks the schema: {err}"
                ) from None


def suggest(trial, space: Space) -> dict:
    """``{dotted key: value}`` of one Optuna ``trial`` (its ``suggest_*`` calls) over ``space``."""
    values = fixed_values(space)
    for param in space.params:
        if param.kind == "value":
            continue
        if param.kind == "choices":
            raw = trial.suggest_categorical(param.key, list(param.choices))
        elif param.integer:
            raw = trial.suggest_int(param.key, int(param.low), int(param.high), log=param.log)
        else:
            raw = trial.suggest_float(param.key, param.low, param.high, log=param.log)
        values.update(dict.fromkeys(param.keys(), param.to_value(raw)))
    return values


def grid(space: Space) -> dict:
    """Optuna's ``GridSampler`` search space: each searched key's ``grid`` points."""
    missing = [p.key for p in space.params if p.searched and not p.grid]
    if missing:
        raise ConfigError(
            f"tune.sampler=grid: {missing[0]} has no grid points; add grid: [...] to its entry "
            "in the search file, or use tune.sampler=tpe"
        )
    return {p.key: list(p.grid) for p in space.params if p.searched}


def grid_size(space: Space) -> int:
    return math.prod(len(points) for points in grid(space).values())
