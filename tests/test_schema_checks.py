"""Allowed values, ranges and relations of the typed schema (lra/config/types.py), checked by
the one generic validator (lra/config/schema.py) before JAX is imported; and defaults living
in the YAML only (the schema keeps a default only on a key some shipped config leaves out).
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, DictConfig
from test_cli import cli

from lra.config import types
from lra.config.compose import CONFIG_DIR
from lra.config.schema import SchemaError, check_value, command_line_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.grad_accum=0"], "trainer.grad_accum: expected an integer >= 1, got 0"),
        (["trainer.num_steps=0"], "trainer.num_steps: expected an integer >= 1, got 0"),
        (["trainer.batch_size=-4"], "trainer.batch_size: expected an integer >= 1, got -4"),
        (["trainer.eval_every=0"], "trainer.eval_every: expected an integer >= 1, got 0"),
        (["trainer.log_every=0"], "trainer.log_every: expected an integer >= 1, got 0"),
        (
            ["trainer.keep_checkpoints=0"],
            "trainer.keep_checkpoints: expected an integer >= 1, got 0",
        ),
        (
            ["trainer.checkpoint_every=-1"],
            "trainer.checkpoint_every: expected an integer >= 0, got -1",
        ),
        (
            ["trainer.checkpoint_minutes=-0.5"],
            "trainer.checkpoint_minutes: expected a float >= 0, got -0.5",
        ),
        (["trainer.learning_rate=0"], "trainer.learning_rate: expected a float > 0, got 0"),
        (
            ["trainer.eval_batches=0"],
            "trainer.eval_batches: expected an integer >= 1 or null, got 0",
        ),
        (["task.arch.dropout=1.0"], "task.arch.dropout: expected a float in [0, 1), got 1.0"),
        (
            ["task=text", "task.val_source=train", "task.val_fraction=1.5"],
            "task.val_fraction: expected a float in (0, 1) or null, got 1.5",
        ),
        (
            ["trainer.schedule=linear"],
            "trainer.schedule: expected one of rsqrt, cosine, constant; got 'linear'",
        ),
        (["trainer.precision=fp8"], "trainer.precision: expected one of fp32, bf16; got 'fp8'"),
        (
            ["trainer.dropout_rng=philox"],
            "trainer.dropout_rng: expected one of hash, rbg, threefry; got 'philox'",
        ),
        (
            ["trainer.selection=best"],
            "trainer.selection: expected one of best_val, last; got 'best'",
        ),
        (
            ["trainer.resume=maybe"],
            "trainer.resume: expected one of auto, never, must; got 'maybe'",
        ),
        (
            ["task.arch.pooling=max"],
            "task.arch.pooling: expected one of cls, mean, last; got 'max'",
        ),
        (
            ["distributed.enabled=maybe"],
            "distributed.enabled: expected one of auto, true, false; got 'maybe'",
        ),
        (
            ["task.val_source=dev"],
            "task.val_source: expected one of official, train, test; got 'dev'",
        ),
        # relations between keys
        (
            ["trainer.schedule=cosine", "trainer.decay_steps=500", "trainer.warmup_steps=1000"],
            "trainer.decay_steps (500) must exceed trainer.warmup_steps (1000); "
            "null decays over trainer.num_steps",
        ),
        (
            ["trainer.batch_size=30", "trainer.grad_accum=4"],
            "trainer.batch_size=30 does not split into trainer.grad_accum=4 micro-batches; "
            "use a multiple of 4 (e.g. 28 or 32)",
        ),
        (
            ["distributed.coordinator_address=node1:1234"],
            "distributed.coordinator_address is set but distributed.num_processes or "
            "distributed.process_id is not; give all three (or none, on SLURM or a TPU slice)",
        ),
        # a bad value anywhere in a sweep stops it before its first job
        (
            ["-m", "seed=0,1", "trainer.grad_accum=1,0"],
            "trainer.grad_accum: expected an integer >= 1, got 0",
        ),
    ],
)
def test_lra_train_values_outside_what_the_key_allows(overrides, message):
    assert command_line_problem("config", overrides) == message


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        (
            "bench",
            ["lengths=[]"],
            "lengths: expected a list of integers of at least 1 item, got []",
        ),
        ("bench", ["lengths=[0,16]"], "lengths[0]: expected an integer >= 1, got 0"),
        ("bench", ["batch_size=0"], "batch_size: expected an integer >= 1, got 0"),
        ("bench", ["rounds=0"], "rounds: expected an integer >= 1, got 0"),
        ("bench", ["bench.windows=0"], "bench.windows: expected an integer >= 1, got 0"),
        ("eval", ["run=x", "split=dev"], "split: expected one of train, val, test; got 'dev'"),
        ("smoke", ["steps=0"], "steps: expected an integer >= 1, got 0"),
        ("report", ["tasks=all"], "tasks: expected one of auto, official, tiny; got 'all'"),
        ("report", ["figure_length=0"], "figure_length: expected an integer >= 1, got 0"),
    ],
)
def test_other_entry_points_check_their_values(config, overrides, message):
    assert command_line_problem(config, overrides) == message


def test_boundary_values_pass():
    ok = [
        "trainer.checkpoint_every=0",
        "trainer.checkpoint_minutes=0",
        "trainer.warmup_steps=0",
        "task.arch.dropout=0",
        "trainer.batch_size=32",
        "trainer.grad_accum=4",
        "distributed.enabled=false",
        "trainer.schedule=cosine",
        "trainer.decay_steps=1001",
    ]
    assert command_line_problem("config", ok) is None


def test_check_value_gives_the_same_line_for_a_plain_value():
    with pytest.raises(SchemaError, match=r"^trainer\.schedule: expected one of rsqrt, cosine"):
        check_value("trainer.schedule", "linear")
    check_value("trainer.schedule", "cosine")
    with pytest.raises(SchemaError, match=r"^distributed\.coordinator_address is set"):
        check_value(
            "distributed",
            {
                "enabled": "auto",
                "coordinator_address": "h:1",
                "num_processes": None,
                "process_id": None,
                "local_device_ids": None,
                "cpu_collectives": "gloo",
            },
        )


def test_the_check_answers_before_jax_is_imported():
    code = (
        "import sys\n"
        "from lra.config.schema import command_line_problem\n"
        "print(command_line_problem('config', ['trainer.grad_accum=0']))\n"
        "assert 'jax' not in sys.modules, 'the schema check imported JAX'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "trainer.grad_accum: expected an integer >= 1, got 0\n"


def test_lra_train_stops_on_a_bad_value_with_one_line(tmp_path):
    out = cli(
        "lra-train",
        "trainer.grad_accum=0",
        f"data_dir={tmp_path / 'no_data'}",
        f"results_dir={tmp_path / 'results'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr == "error: trainer.grad_accum: expected an integer >= 1, got 0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output folder, nothing run


def test_the_code_branches_on_the_schemas_values():
    """Each enumeration the code branches on is the schema's Literal (or agrees with it)."""
    from lra.data.tasks import VAL_SOURCES
    from lra.models.encoder import POSITIONS
    from lra.models.heads import POOLINGS
    from lra.run.folder import RESUME_MODES
    from lra.track import BACKENDS
    from lra.train import dropout_rng, optim, steps

    assert optim.SCHEDULES == types.allowed(types.Schedule)
    assert dropout_rng.GENERATORS == types.allowed(types.DropoutGenerator)
    assert RESUME_MODES == types.allowed(types.ResumeMode)
    assert VAL_SOURCES == types.allowed(types.ValSource)
    assert set(steps.PRECISIONS) == set(types.allowed(types.Precision))
    assert set(POOLINGS) == set(types.allowed(types.Pooling))
    assert set(POSITIONS) == set(types.allowed(types.Positions))
    assert set(BACKENDS) == {f.name for f in dataclasses.fields(types.LoggerConfig)}


# --- defaults live in the YAML only ---------------------------------------------------------


def _compositions():
    """(primary config name, composed config) for every primary config and every option of
    the groups that add keys: each task, model, trainer preset, logger and protocol."""
    options = {
        group: sorted(p.stem for p in Path(CONFIG_DIR, group).glob("*.yaml"))
        for group in ("task", "model", "trainer", "logger", "protocol")
    }
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for name in types.SCHEMAS:
            yield name, compose(name, ["run=x"] if name == "eval" else [])
        for group, names in options.items():
            for option in names:
                yield "config", compose("config", [f"{group}={option}"])


def _walk(node: DictConfig, schema, seen: dict, present: dict) -> None:
    seen[schema] = seen.get(schema, 0) + 1
    for f in dataclasses.fields(schema):
        if f.name not in node:
            continue
        present[(schema, f.name)] = present.get((schema, f.name), 0) + 1
        child = node._get_node(f.name)
        nested = _nested(schema, f.name)
        if nested is not None and isinstance(child, DictConfig):
            _walk(child, nested, seen, present)


def _nested(schema, name):
    import typing

    tp = typing.get_type_hints(schema)[name]
    for candidate in (tp, *typing.get_args(tp)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def test_the_schema_has_no_default_for_a_key_the_yaml_always_defines():
    seen, present = {}, {}
    for name, cfg in _compositions():
        _walk(cfg, types.SCHEMAS[name], seen, present)
    with_default = [
        (schema, f.name)
        for schema in seen
        for f in dataclasses.fields(schema)
        if (f.default is not MISSING or f.default_factory is not dataclasses.MISSING)
        and _nested(schema, f.name) is None
    ]
    always = [
        f"{schema.__name__}.{field}"
        for schema, field in with_default
        if present.get((schema, field), 0) == seen[schema]
    ]
    assert always == [], always  # such a default belongs in the YAML (and is there): drop it here
    assert len(seen) >= 12 and len(with_default) >= 1  # the walk reached the nested schemas
