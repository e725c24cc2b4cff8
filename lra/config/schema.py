"""Checking configs against the typed schema (:mod:`lra.config.types`), before any work.

One generic validator: a composed config is walked against its schema dataclass, and each
value is checked for its type, then against the constraints declared next to its field (a
``Literal`` of allowed values, a :class:`~lra.config.types.Range`, a
:class:`~lra.config.types.MinItems`), then each mapping against its relations
(:data:`~lra.config.types.RELATIONS`). Checks that need the machine or the data (device
count, file contents, data lengths, the task's own allowed ``val_source``) stay where that
is known.

A config breaks the schema when it has a key the schema does not know
(``+trainer.num_step=5``, ``trainer.num_step=5``, ``+foo=1``, a typo in a task
or model file), a value of the wrong type (``trainer.learning_rate=abc``,
``trainer.num_steps=1.5``, ``seed=x``), a value its key does not allow
(``trainer.schedule=linear``, ``trainer.grad_accum=0``), or no value for a required key.
The entry points then print exactly one line and exit with status 2, like every
other user error of the harness (``lra.run.exit_status.report_errors``)::

    error: trainer.num_step: unknown key (did you mean num_steps?); allowed keys: b1, b2, ...
    error: trainer.learning_rate: expected a float, got 'abc'
    error: trainer.grad_accum: expected an integer >= 1, got 0
    error: trainer.schedule: expected one of rsqrt, cosine, constant; got 'linear'

How, and why this way. The schema is *not* in the configs' defaults lists.
Composing with it there would make Hydra reject these mistakes itself, but with
its own multi-line message and exit status 1, and it would change the config
every run sees (``trainer.learning_rate=1`` would become ``1.0``), so the
resolved config, and with it every run's identity hash and run folder, would
change. Instead the schema only *checks*:

1. :func:`check_command_line`, called by each console script before its Hydra
   app (before JAX starts, before data loads, before Hydra makes an output
   folder), composes the config exactly as Hydra is about to (Hydra's own
   argument parser, search path with ``--config-dir``, config loader and
   overrides) and checks it with :func:`find_problem`. Overrides Hydra itself
   refuses because the key does not exist (``trainer.num_step=5`` without
   ``+``) are looked up in the schema, so they give the same line. For ``-m``
   every value of every swept parameter (command line and
   ``hydra.sweeper.params``, e.g. ``experiment=figure1``) is composed and
   checked at least once (the i-th job checked takes the i-th value of each
   parameter), so a sweep stops before its first job, not in its tenth. Any
   other composition error (an unknown group option, a bad override grammar)
   is left to Hydra, which reports it as it always has. ``--help``,
   ``--hydra-help``, ``--info`` and shell completion are not checked;
   ``--cfg`` is.
2. :func:`validate`, called inside each app on the config the job actually
   got, is the backstop for anything step 1 could not see (a job of a sweeper
   whose values cannot be listed, a primary config of the user's own). In a
   sweep its error is that job's ``failed`` row (:mod:`lra.run.sweep`).
3. :func:`check_value`: one key's value, for library functions called with a
   plain value (``make_schedule("cosine", ...)``) rather than a checked config.

The config passed to the app is Hydra's, unchanged: checking never converts or
adds a value. Scalars are checked with OmegaConf's own value nodes, so what
passes is exactly what a structured config would accept (``'7'`` is an
integer, ``1`` a float, ``yes`` a boolean); interpolations (``${...}``) are
not resolved and not checked. Nothing here imports JAX.

``lra-report`` is checked the same way (:class:`~lra.config.types.ReportConfig`,
from ``lra.report.main.report_main``).

A new config key goes into its config file *and* into its dataclass in
:mod:`lra.config.types`: tests/test_typed_config.py composes every model x task (x protocol,
trainer and logger preset) and fails until the two agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import sys
import types
import typing
from typing import Annotated, Any, Literal

from omegaconf import (
    MISSING,
    BooleanNode,
    DictConfig,
    FloatNode,
    IntegerNode,
    ListConfig,
    OmegaConf,
    StringNode,
    ValidationError,
)

from lra.config.compose import CONFIG_DIR
from lra.config.types import RELATIONS, SCHEMAS, MinItems, Range, TrainConfig
from lra.errors import ConfigError


class SchemaError(ConfigError):
    """A config breaks the schema: an unknown key, a wrong type, a value outside what its key
    allows, or a missing value."""


# --- checking a composed config -----------------------------------------------------------

_SCALARS = {int: IntegerNode, float: FloatNode, bool: BooleanNode, str: StringNode}


def _optional(tp) -> tuple[Any, bool]:
    """(``X``, True) for ``X | None``, else (``tp``, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _peel(tp) -> tuple[Any, tuple]:
    """(``X``, its constraints) for ``Annotated[X, ...]``, else (``tp``, ())."""
    if typing.get_origin(tp) is Annotated:
        return tp.__origin__, tp.__metadata__
    return tp, ()


def describe(tp) -> str:
    """``tp`` in words: ``a float``, ``an integer or null``, ``a list of integers``."""
    tp, optional = _optional(tp)
    tp, _ = _peel(tp)
    origin = typing.get_origin(tp)
    if tp is int:
        text = "an integer"
    elif tp is float:
        text = "a float"
    elif tp is bool:
        text = "a boolean (true or false)"
    elif tp is str:
        text = "a string"
    elif origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        text = "a list" if item is Any else "a list of " + _plural(describe(item))
    elif origin is dict or dataclasses.is_dataclass(tp):
        text = "a mapping"
    else:
        text = "any value"
    return text + " or null" if optional else text


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            text = text[len(article) :]
            break
    head, sep, tail = text.partition(" ")
    return head + "s" + sep + tail if not head.endswith("s") else text


def _word(value) -> str:
    """A value as YAML spells it: ``true``, ``null``, ``fp32``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _shown(node) -> str:
    """A config value as the error line shows it: strings quoted, ``null`` for None."""
    if isinstance(node, (DictConfig, ListConfig)):
        return repr(OmegaConf.to_container(node, resolve=False))
    value = node._value()
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


def _fields(schema) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def _hints(schema) -> dict[str, Any]:
    return typing.get_type_hints(schema, include_extras=True)


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is dataclasses.MISSING


def _unknown(path: str, key: str, allowed: list[str]) -> str:
    full = f"{path}.{key}" if path else key
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{full}: unknown key{hint}; allowed keys: {', '.join(sorted(allowed))}"


def _missing(path: str) -> str:
    return f"{path}: no value given; set it in its config file or on the command line ({path}=...)"


def _scalar(node, tp):
    """The value of the scalar ``node`` as a ``tp`` (``'7'`` -> 7); ValidationError if it is
    not one."""
    if tp in _SCALARS:
        return _SCALARS[tp](value=node._value())._value()
    return node._value()


def _is_allowed(value, values: tuple) -> bool:
    return any(value == v and type(value) is type(v) for v in values)


def _constraint_problem(node, tp, rules: tuple, path: str, optional: bool) -> str | None:
    """``node`` (of type ``tp``, already checked) against its declared constraints."""
    for rule in rules:
        if typing.get_origin(rule) is Literal:
            values = typing.get_args(rule)
            if not _is_allowed(_scalar(node, tp), values):
                wanted = ", ".join(_word(v) for v in values)
                return f"{path}: expected one of {wanted}; got {_shown(node)}"
        elif isinstance(rule, Range):
            if not rule.holds(_scalar(node, tp)):
                tail = " or null" if optional else ""
                return f"{path}: expected {describe(tp)} {rule.words()}{tail}, got {_shown(node)}"
        elif isinstance(rule, MinItems) and len(node) < rule.count:
            items = "item" if rule.count == 1 else "items"
            return f"{path}: expected {describe(tp)} of at least {rule.count} {items}, got []"
    return None


def _problem(node, tp, path: str, one_of=None) -> str | None:
    """The first thing wrong with ``node`` (a config node at ``path``) against type ``tp``
    (and the constraints ``Annotated`` on it)."""
    if node._is_missing():
        return _missing(path)
    if node._is_interpolation():
        return None
    if one_of is not None:
        return _one_of_problem(node, one_of, path)
    declared = tp
    tp, optional = _optional(tp)
    tp, rules = _peel(tp)
    if node._is_none():
        if optional or tp is Any:
            return None
        return f"{path}: expected {describe(tp)}, got null"
    found = _type_problem(node, tp, path, declared)
    if found or not rules:
        return found
    return _constraint_problem(node, tp, rules, path, optional)


def _type_problem(node, tp, path: str, declared) -> str | None:
    if tp is Any:
        return None
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(node, DictConfig):
            return f"{path}: expected a mapping, got {_shown(node)}"
        return _mapping_problem(node, tp, path)
    if origin is dict:
        if not isinstance(node, DictConfig):
            return f"{path}: expected a mapping, got {_shown(node)}"
        _, value_type = typing.get_args(tp) or (str, Any)
        for key in node.keys():
            found = _problem(node._get_node(key), value_type, f"{path}.{key}")
            if found:
                return found
        return None
    if origin is list:
        if not isinstance(node, ListConfig):
            return f"{path}: expected {describe(tp)}, got {_shown(node)}"
        (item_type,) = typing.get_args(tp) or (Any,)
        for i in range(len(node)):
            found = _problem(node._get_node(i), item_type, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(node, (DictConfig, ListConfig)):
        return f"{path}: expected {describe(declared)}, got {_shown(node)}"
    try:
        _SCALARS[tp](value=node._value())
    except ValidationError:
        return f"{path}: expected {describe(declared)}, got {_shown(node)}"
    return None


def _one_of_problem(node, forms, path: str) -> str | None:
    """``node`` against the first of ``forms`` its shape fits (mapping, list or scalar)."""
    if node._is_none():
        wanted = " or ".join(describe(f) for f in forms)
        return f"{path}: expected {wanted}, got null"
    for form in forms:
        origin = typing.get_origin(form)
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(form):
            return _mapping_problem(node, form, path)
        if isinstance(node, ListConfig) and origin is list:
            return _problem(node, form, path)
        if not isinstance(node, (DictConfig, ListConfig)) and form in _SCALARS:
            return _problem(node, form, path)
    wanted = ", ".join(describe(f) for f in forms)
    return f"{path}: expected one of: {wanted}; got {_shown(node)}"


def _values(node: DictConfig, hints: dict) -> dict:
    """The concrete scalar values of a checked mapping, each as its field's type (a missing
    value, an interpolation or a sub-mapping is left out)."""
    out = {}
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            continue
        if child._is_missing() or child._is_interpolation():
            continue
        tp, _ = _peel(_optional(hints[key])[0])
        out[key] = None if child._is_none() else _scalar(child, tp)
    return out


def _mapping_problem(node: DictConfig, schema, path: str, skip=()) -> str | None:
    fields, hints = _fields(schema), _hints(schema)
    for key in node.keys():
        if key in skip:
            continue
        if key not in fields:
            return _unknown(path, str(key), list(fields))
        f = fields[key]
        found = _problem(
            node._get_node(key), hints[key], f"{path}.{key}" if path else key,
            f.metadata.get("one_of"),
        )  # fmt: skip
        if found:
            return found
    for name, f in fields.items():
        if name not in node and _required(f):
            return _missing(f"{path}.{name}" if path else name)
    relations = RELATIONS.get(schema, ())
    if relations:
        values = _values(node, hints)
        for relation in relations:
            found = relation(values)
            if found:
                return found
    return None


def find_problem(cfg: DictConfig, schema: type) -> str | None:
    """What is wrong with the composed config ``cfg`` under ``schema`` (a dataclass), as one
    line without the ``error:`` prefix, or None if nothing is. A ``hydra`` key (the composed
    config before Hydra strips it) is not checked."""
    return _mapping_problem(cfg, schema, "", skip=("hydra",))


def schema_for(config_name: str | None) -> type | None:
    """The schema of a primary config name, None for a config of the user's own."""
    return SCHEMAS.get(os.path.splitext(config_name or "")[0])


def validate(cfg: DictConfig, config_name: str | None = None) -> None:
    """Raise :class:`SchemaError` if ``cfg`` breaks the schema of ``config_name`` (default:
    the running Hydra job's primary config). A config with no schema passes."""
    if config_name is None:
        from hydra.core.hydra_config import HydraConfig

        config_name = HydraConfig.get().job.config_name if HydraConfig.initialized() else None
    schema = schema_for(config_name)
    if schema is not None:
        problem = find_problem(cfg, schema)
        if problem:
            raise SchemaError(problem)


def _field_type(key: str, schema: type):
    """``(type, one_of)`` of the dotted ``key`` in ``schema``; KeyError if it names no field."""
    tp, one_of = schema, None
    for part in key.split("."):
        tp, _ = _optional(tp)
        tp, _ = _peel(tp)
        f = _fields(tp)[part]
        tp, one_of = _hints(tp)[part], f.metadata.get("one_of")
    return tp, one_of


def check_value(key: str, value, schema: type = TrainConfig) -> None:
    """Raise :class:`SchemaError` (the line :func:`find_problem` gives) if ``value`` is not
    what the dotted ``key`` of ``schema`` allows: for library functions called with a plain
    value (``check_value("trainer.schedule", name)``) rather than a checked config."""
    tp, one_of = _field_type(key, schema)
    node = OmegaConf.create({"value": value})._get_node("value")
    problem = _problem(node, tp, key, one_of)
    if problem:
        raise SchemaError(problem)


def key_problem(key: str, schema: type) -> str | None:
    """``<key>: unknown key; allowed keys: ...`` if the dotted ``key`` names nothing the
    schema allows (below a free-form mapping anything goes), else None."""
    tp, path = schema, ""
    for part in key.split("."):
        tp, _ = _optional(tp)
        tp, _ = _peel(tp)
        if not dataclasses.is_dataclass(tp):
            return None  # a mapping, a list, Any or a scalar: not for this check to say
        fields = _fields(tp)
        if part not in fields:
            return _unknown(path, part, list(fields))
        tp = _hints(tp)[part]
        path = f"{path}.{part}" if path else part
    return None


# --- checking a command line before Hydra runs it ------------------------------------------


def _parse_args(argv: list[str]):
    """Hydra's own reading of ``argv``, or None where it would stop (Hydra then says why)."""
    from hydra._internal.utils import get_args_parser

    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return get_args_parser().parse_args(argv)
    except SystemExit:
        return None


def _override_problem(overrides: list[str], schema: type, groups: set[str]) -> str | None:
    """The unknown key among ``overrides`` that made composition fail, if one is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None
    for override in parsed:
        key = override.key_or_group
        if (
            override.is_hydra_override()
            or override.is_delete()
            or override.package is not None
            or "/" in key
            or key in groups
        ):
            continue
        found = key_problem(key, schema)
        if found:
            return found
    return None


def _sweep_jobs(master: DictConfig, overrides: list[str], parser) -> list[list[str]] | None:
    """Override lists of the sweep's jobs to check: every value of every swept key at least
    once (job i takes value i of each key, cycling), as Hydra's basic sweeper combines the
    command line with ``hydra.sweeper.params``. None if the values cannot be listed."""
    sweeper = master.hydra.get("sweeper") or {}
    params = []
    if str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    choices: dict[str, list[str]] = {}
    for override in parser.parse_overrides(params + list(overrides)):
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                return None
            choices[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    lists = [v for v in choices.values() if v]
    count = max((len(v) for v in lists), default=1)
    return [[v[i % len(v)] for v in lists] for i in range(count)]


def command_line_problem(config_name: str, argv: list[str]) -> str | None:
    """What is wrong with the config that ``argv`` (a console script's arguments) composes
    from ``configs/<config_name>.yaml``, as :func:`find_problem` says it, or None: nothing is,
    the command is not one that runs the app (``--help``, ``--info``, ...), or composing
    failed for a reason Hydra reports itself."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    args = _parse_args(argv)
    if args is None or args.help or args.hydra_help or args.info or args.shell_completion:
        return None
    if args.config_path is not None:
        return None  # another primary config folder: no schema of ours
    config_name = args.config_name or config_name
    schema = schema_for(config_name)
    if schema is None:
        return None
    search_path = create_config_search_path(CONFIG_DIR)
    if args.config_dir is not None:
        folder = os.path.abspath(args.config_dir)
        if not os.path.isdir(folder):
            return None
        search_path.prepend("command-line", f"file://{folder}", SearchPathQuery(provider="schema"))
    loader = ConfigLoaderImpl(config_search_path=search_path)
    app = Hydra(task_name="lra", config_loader=loader)
    overrides = list(args.overrides)
    parser = OverridesParser.create(config_loader=loader)
    parsed = parser.parse_overrides(overrides)
    groups = set(loader.list_groups(""))

    def compose(job_overrides: list[str], mode: RunMode) -> DictConfig | None:
        return app.compose_config(config_name, job_overrides, run_mode=mode)

    jobs = [overrides]
    if args.multirun or any(o.is_sweep_override() for o in parsed):
        try:
            master = compose(overrides, RunMode.MULTIRUN)
        except Exception:
            return _override_problem(overrides, schema, groups)
        jobs = _sweep_jobs(master, overrides, parser)
        if jobs is None:  # values of another sweeper: check what all jobs share
            return find_problem(master, schema)
    for job in jobs:
        try:
            cfg = compose(job, RunMode.RUN)
        except Exception:
            found = _override_problem(job, schema, groups)
            if found:
                return found
            return None
        found = find_problem(cfg, schema)
        if found:
            return found
    return None


def check_command_line(config_name: str, argv: list[str] | None = None) -> None:
    """Exit with status 2 and one ``error: ...`` line on stderr if the command line's config
    breaks the schema (see :func:`command_line_problem`). Anything unexpected while checking
    is ignored: Hydra then composes and reports as it always has, and :func:`validate` in the
    app still runs."""
    try:
        problem = command_line_problem(config_name, sys.argv[1:] if argv is None else argv)
    except Exception:
        return
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
