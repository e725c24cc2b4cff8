"""Typed configs (lra/config/types.py, checked by lra/config/schema.py): every shipped config
passes, mistakes are one line.

Configs are composed in-process with Hydra's compose API and with
:func:`lra.config.schema.command_line_problem` (the check the console scripts run before
their Hydra app); two lra-train subprocesses check the line, the exit status and that
nothing ran.
"""

import dataclasses
import itertools
from pathlib import Path

import pytest
from conftest import make_config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_cli import cli

from lra.config import types
from lra.config.compose import CONFIG_DIR
from lra.config.schema import SchemaError, command_line_problem, find_problem, validate
from lra.config.types import BenchConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted(p.stem for p in Path(CONFIG_DIR, "model").glob("*.yaml"))
TASKS = sorted(p.stem for p in Path(CONFIG_DIR, "task").glob("*.yaml"))
PROTOCOLS = sorted(p.stem for p in Path(CONFIG_DIR, "protocol").glob("*.yaml"))
OUTSIDE = ROOT / "examples" / "my_attention" / "configs"
TRAINER_KEYS = ", ".join(sorted(f.name for f in dataclasses.fields(types.TrainerConfig)))


def composed(config_name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def without_model(cfg) -> dict:
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("model")
    return plain


# authors: per model x task files, covered by tests/test_protocol_authors.py (other pairs are
# refused by design, and this test's per-model / per-task shortcut cannot compose them).
@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS if p != "authors"])
def test_every_model_x_task_combination_validates(protocol):
    """Every model x task pair under each protocol, composed by Hydra. To keep this fast, each
    model file (with its protocol_model file) and each task file (with its protocol_task file)
    is composed once, and a pair's config is the task's composition with the model's
    ``model`` node: Hydra's own result whenever the model's files write only under ``model``
    and the task's files nothing under it (checked; pairs where that fails, and a few
    others as a check of the method, are composed by Hydra as a pair)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):

        def pair(model, task):
            return compose("config", [f"model={model}", f"task={task}", f"protocol={protocol}"])

        by_model = {m: compose("config", [f"model={m}", f"protocol={protocol}"]) for m in MODELS}
        by_task = {t: compose("config", [f"task={t}", f"protocol={protocol}"]) for t in TASKS}
        plain = compose("config", [f"protocol={protocol}"])
        # Files that reach across (a model file setting task.*, a task file setting model.*).
        tangled = {m for m, c in by_model.items() if without_model(c) != without_model(plain)}
        tangled |= {t for t, c in by_task.items() if c.model != plain.model}
        configs = {}
        for model, task in itertools.product(MODELS, TASKS):
            if model in tangled or task in tangled:
                configs[(model, task)] = pair(model, task)
            else:
                configs[(model, task)] = by_task[task].copy()
                configs[(model, task)].model = by_model[model].model
        for model, task in [("flash", "text"), ("transnormer_t1", "image"), ("ls", "pathx_tiny")]:
            real = OmegaConf.to_container(pair(model, task))
            assert OmegaConf.to_container(configs[(model, task)]) == real, (model, task)
    assert len(configs) == len(MODELS) * len(TASKS) >= 17 * 12
    problems = {key: find_problem(cfg, TrainConfig) for key, cfg in configs.items()}
    assert {key: p for key, p in problems.items() if p} == {}


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=figure1"],
        ["experiment=figure1_tiny"],
        ["trainer=bf16"],
        ["logger=wandb"],
        ["logger=tensorboard"],
        ["logger=[wandb,tensorboard]", "trainer=bf16", "protocol=transnormer", "task=text"],
        ["model=local_then_global", "model.attention.lower_fraction=0.25"],
        ["model.attention=[softmax,performer]", "task.arch.num_layers=2"],
        ["task=retrieval_tiny", "+task.source.download=true", "task.source.fixture.seed=3"],
        ["task=text", "task.val_source=test", "task.val_fraction=null"],
        ["trainer.learning_rate=1", "trainer.num_steps='7'", "trainer.remat=block"],
        ["+model.attention_options.softmax.implementation=fused", "trainer.eval_batches=null"],
        [f"hydra.searchpath=[file://{OUTSIDE}]", "model=my_attention"],
    ],
)
def test_shipped_presets_and_valid_overrides_pass(overrides):
    cfg = make_config(*overrides)
    assert find_problem(cfg, TrainConfig) is None
    validate(cfg, "config")  # the in-app check agrees


@pytest.mark.parametrize("model", ["transformer", "flash", "transnormer_t2"])
def test_lra_bench_configs_validate(model):
    cfg = composed("bench", f"model={model}", "protocol=transnormer")
    assert find_problem(cfg, BenchConfig) is None


def test_lra_bench_checks_its_own_keys():
    assert command_line_problem("bench", ["lengths=[1024,x]"]) == (
        "lengths[1]: expected an integer, got 'x'"
    )
    assert command_line_problem("bench", ["+bench.repeat=2"]) == (
        "bench.repeat: unknown key; allowed keys: isolate, softmax_paths, steps_per_window, "
        "warmup_steps, windows"
    )


def test_lra_report_checks_its_keys():
    assert command_line_problem("report", []) is None
    assert command_line_problem("report", ["protocols=[transnormer,lra_official]"]) is None
    assert command_line_problem("report", ["results_dir=results/cpu-tiny"]) is None
    assert command_line_problem("report", ["figure_length=abc"]) == (
        "figure_length: expected an integer, got 'abc'"
    )
    assert command_line_problem("report", ["+figure_lenght=3"]).startswith(
        "figure_lenght: unknown key (did you mean figure_length?); allowed keys: "
        "bootstrap_resamples, curves,"
    )
    assert command_line_problem("report", ["bootstrap_resamples=abc"]) == (
        "bootstrap_resamples: expected an integer, got 'abc'"
    )


def test_every_schema_is_a_structured_config_that_accepts_the_shipped_defaults():
    """The dataclasses are what OmegaConf / Hydra read as structured configs, and merging
    the default composition into them (OmegaConf's own check) agrees with find_problem."""
    for name, dataclass in types.SCHEMAS.items():
        assert OmegaConf.structured(dataclass) is not None
        cfg = composed(name, "run=x") if name == "eval" else composed(name)
        assert find_problem(cfg, dataclass) is None, name
        OmegaConf.merge(OmegaConf.structured(dataclass), cfg)
    from hydra.core.config_store import ConfigStore

    stored = ConfigStore.instance().repo
    assert {f"lra_schema_{n}.yaml" for n in types.SCHEMAS} <= set(stored)


def unknown(key: str, allowed: str, hint: str = "") -> str:
    return f"{key}: unknown key{hint}; allowed keys: {allowed}"


TOP_KEYS = (
    "compile_cache, data_dir, distributed, init, logger, model, num_workers, pretrain, "
    "protocol, rebuild, results_dir, seed, stage, task, trainer"
)
ARCH_KEYS = (
    "attention_dropout, dim, dropout, mlp_dim, norm, norm_momentum, norm_position, num_heads, "
    "num_layers, pooling, positions, qkv_dim"
)
TASK_KEYS = (
    "arch, data_subdir, dataset, dual, generator, max_length, name, num_classes, source, "
    "val_fraction, val_source, vocab_size"
)


NUM_STEP = unknown("trainer.num_step", TRAINER_KEYS, " (did you mean num_steps?)")
NUM_LAYER = unknown("task.arch.num_layer", ARCH_KEYS, " (did you mean num_layers?)")
GENERATOR_KEYS = "max_args, max_depth, max_length, min_length, num_test, num_train, num_val, seed"
WANDB_KEYS = "entity, group, name, project, tags"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # unknown keys: added (+), assigned (Hydra itself refuses these), swept, in --cfg
        (["+trainer.num_step=5"], NUM_STEP),
        (["trainer.num_step=5"], NUM_STEP),
        (["-m", "seed=0,1", "+trainer.num_step=5"], NUM_STEP),
        (["+foo=1"], unknown("foo", TOP_KEYS)),
        (["--cfg", "job", "+foo=1"], unknown("foo", TOP_KEYS)),
        (["+task.shuffle=true"], unknown("task.shuffle", TASK_KEYS)),
        (["+task.arch.num_layer=3"], NUM_LAYER),
        (["task.arch.num_layer=3"], NUM_LAYER),
        (["+task.generator.depth=3"], unknown("task.generator.depth", GENERATOR_KEYS)),
        (
            ["logger=wandb", "+logger.wandb.projekt=x"],
            unknown("logger.wandb.projekt", WANDB_KEYS, " (did you mean project?)"),
        ),
        (
            ["model=transnormer_t1", "+model.attention.uper=x"],
            unknown(
                "model.attention.uper", "lower, lower_fraction, upper", " (did you mean upper?)"
            ),
        ),
        # wrong types
        (["trainer.learning_rate=abc"], "trainer.learning_rate: expected a float, got 'abc'"),
        (["trainer.num_steps=1.5"], "trainer.num_steps: expected an integer, got 1.5"),
        (["seed=x"], "seed: expected an integer, got 'x'"),
        (
            ["trainer.progress=maybe"],
            "trainer.progress: expected a boolean (true or false), got 'maybe'",
        ),
        (["trainer.num_steps=null"], "trainer.num_steps: expected an integer, got null"),
        (["task.arch=5"], "task.arch: expected a mapping, got 5"),
        (["trainer.mesh.data=all"], "trainer.mesh.data: expected an integer, got 'all'"),
        (
            ["distributed.local_device_ids=[0,a]"],
            "distributed.local_device_ids[1]: expected an integer, got 'a'",
        ),
        (["task.val_fraction=most"], "task.val_fraction: expected a float or null, got 'most'"),
        (
            ["model=local_then_global", "model.attention.lower_fraction=half"],
            "model.attention.lower_fraction: expected a float, got 'half'",
        ),
        # a bad value of a sweep stops the sweep before its first job
        (
            ["-m", "seed=0,1", "trainer.learning_rate=0.1,abc"],
            "trainer.learning_rate: expected a float, got 'abc'",
        ),
        (
            ["-m", "experiment=figure1_tiny", "task.arch.dropout=0.1,high"],
            "task.arch.dropout: expected a float, got 'high'",
        ),
    ],
)
def test_mistakes_are_one_line_naming_the_key(overrides, message):
    assert command_line_problem("config", overrides) == message


def test_valid_command_lines_and_commands_that_run_nothing_pass():
    assert command_line_problem("config", []) is None
    assert command_line_problem("config", ["-m", "experiment=figure1"]) is None  # 11 jobs checked
    assert (
        command_line_problem("config", ["--config-dir", str(OUTSIDE), "model=my_attention"]) is None
    )
    assert command_line_problem("config", ["--help", "+foo=1"]) is None  # help is Hydra's
    assert command_line_problem("config", ["model=no_such_model"]) is None  # Hydra says which exist
    assert command_line_problem("config", ["-m", "hydra/launcher=local_gpus", "seed=0,1"]) is None
    assert command_line_problem("smoke", ["steps=many"]) == "steps: expected an integer, got 'many'"
    assert command_line_problem("eval", []) == (
        "run: no value given; set it in its config file or on the command line (run=...)"
    )


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_unknown_keys_inside_a_users_model_or_task_file(tmp_path):
    write(tmp_path, "model/mine.yaml", "name: mine\nattention: softmax\natention_options: {}\n")
    listops = (ROOT / "configs" / "task" / "listops_tiny.yaml").read_text()
    write(
        tmp_path,
        "task/mine.yaml",
        listops.replace("    pooling: cls", "    pooling: cls\n    poolng: mean"),
    )
    args = ["--config-dir", str(tmp_path)]
    assert command_line_problem("config", [*args, "model=mine"]) == unknown(
        "model.atention_options",
        "arch_overrides, attention, attention_options, name",
        " (did you mean attention_options?)",
    )
    assert command_line_problem("config", [*args, "task=mine"]) == unknown(
        "task.arch.poolng", ARCH_KEYS, " (did you mean pooling?)"
    )
    write(tmp_path, "model/bare.yaml", "name: bare\n")
    assert command_line_problem("config", [*args, "model=bare"]) == (
        "model.attention: no value given; set it in its config file or on the command line "
        "(model.attention=...)"
    )


def test_the_in_app_check_raises_a_harness_config_error():
    with pytest.raises(SchemaError, match=r"^trainer\.learning_rate: expected a float, got 'abc'$"):
        validate(make_config("trainer.learning_rate=abc"), "config")
    validate(make_config("+foo=1"), "a_config_of_your_own")  # no schema: not checked


def test_lra_train_stops_before_any_work_with_one_line(tmp_path):
    results = tmp_path / "results"
    common = [f"data_dir={tmp_path / 'no_such_data'}", f"results_dir={results}"]
    typo = cli("lra-train", "trainer.num_step=5", *common, cwd=tmp_path)  # Hydra would refuse
    assert typo.returncode == 2
    assert typo.stderr.splitlines() == [
        "error: " + unknown("trainer.num_step", TRAINER_KEYS, " (did you mean num_steps?)")
    ]
    assert typo.stdout == ""
    wrong_type = cli("lra-train", "trainer.learning_rate=abc", *common, cwd=tmp_path)
    assert wrong_type.returncode == 2
    assert wrong_type.stderr == "error: trainer.learning_rate: expected a float, got 'abc'\n"
    # Before Hydra made its output folder, before the results folder or the data were touched.
    assert sorted(p.name for p in tmp_path.iterdir()) == []
