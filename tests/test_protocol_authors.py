"""protocol=authors (issue 27 part 5): each SSM model's reference settings per task, from
configs/protocol_model_task/authors_<model>_<task>.yaml."""

import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import make_config
from flax import nnx
from omegaconf import OmegaConf

from lra.config.compose import CONFIG_DIR
from lra.config.schema import command_line_problem
from lra.config.setting import describe_setting
from lra.train import optim

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
FILES = sorted(Path(CONFIG_DIR, "protocol_model_task").glob("authors_*.yaml"))


def resolved(*overrides):
    return OmegaConf.to_container(make_config(*overrides), resolve=True)


def test_lra_train_cfg_job_shows_the_s5_listops_script_values():
    """lindermanlab/S5 bin/run_experiments/run_lra_listops.sh: n_layers 8, d_model 128,
    ssm_size_base 16, blocks 8, bsz 50, lr_factor 3 x ssm_lr_base 0.001, weight_decay 0.04,
    p_dropout 0, 40 epochs of 96,000 / 50, opt_config BfastandCdecay (B with the global lr)."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("lra-train")), "model=s5", "task=listops"]
        + ["protocol=authors", "--cfg", "job"],
        capture_output=True,
        text=True,
        check=True,
    )
    cfg = OmegaConf.create(out.stdout)
    assert cfg.protocol == "authors"
    assert (cfg.task.arch.num_layers, cfg.task.arch.dim) == (8, 128)
    assert cfg.task.arch.dropout == 0.0 and cfg.task.arch.pooling == "mean"
    s5 = cfg.model.attention_options.s5
    assert (s5.state_size, s5.blocks, s5.c_init, s5.activation) == (
        16,
        8,
        "lecun_normal",
        "half_glu2",
    )
    t = cfg.trainer
    assert (t.batch_size, t.learning_rate, t.weight_decay) == (50, 0.003, 0.04)
    assert (t.schedule, t.warmup_steps, t.num_steps) == ("cosine", 1920, 40 * 1920)
    assert (t.b2, t.eps) == (0.999, 1e-8)
    assert OmegaConf.to_container(t.param_groups) == {
        "ssm_a": {"learning_rate": 0.001, "weight_decay": 0.0},
        "ssm_dt": {"learning_rate": 0.001, "weight_decay": 0.0},
    }


def test_s4d_listops_takes_the_s4_experiment_file():
    """state-spaces/s4 configs/experiment/lra/s4-listops.yaml with mode diag."""
    config = resolved("model=s4d", "task=listops", "protocol=authors")
    arch, trainer = config["task"]["arch"], config["trainer"]
    assert (arch["num_layers"], arch["dim"], arch["dropout"], arch["pooling"]) == (
        6,
        256,
        0.0,
        "mean",
    )
    s4d = config["model"]["attention_options"]["s4d"]
    assert (s4d["state_size"], s4d["init"], s4d["dt_min"], s4d["dt_max"]) == (4, "legs", 0.001, 0.1)
    assert (trainer["batch_size"], trainer["learning_rate"], trainer["weight_decay"]) == (
        32,
        0.01,
        0.05,
    )
    assert (trainer["warmup_steps"], trainer["num_steps"]) == (12000, 120000)
    # lr {dt: null, A: 0.001, B: 0.001}, wd 0.0: Delta keeps the optimizer's lr, without decay
    assert trainer["param_groups"] == {
        "ssm_a": {"learning_rate": 0.001, "weight_decay": 0.0},
        "ssm_b": {"learning_rate": 0.001, "weight_decay": 0.0},
        "ssm_dt": {"learning_rate": 0.01, "weight_decay": 0.0},
    }
    pathx = resolved("model=s4d", "task=pathx", "protocol=authors")
    assert pathx["model"]["attention_options"]["s4d"]["dt_min"] == 0.0001
    assert pathx["trainer"]["param_groups"] == {
        "ssm": {"learning_rate": 0.001, "weight_decay": 0.0}
    }


def test_s5_pathx_puts_b_at_the_ssm_rate_with_decay():
    """run_lra_pathx.sh: opt_config BandCdecay, ssm_lr_base 0.0006, weight_decay 0.06."""
    trainer = resolved("model=s5", "task=pathx", "protocol=authors")["trainer"]
    assert trainer["param_groups"]["ssm_b"] == {"learning_rate": 0.0006, "weight_decay": 0.06}
    assert trainer["learning_rate"] == pytest.approx(0.0018)


def test_lru_text_takes_the_papers_tables_8_and_9():
    """Table 9 (Text): H 256, N 192, 50k iterations, batch 32, LR factor 0.1, weight decay
    0.05, dropout 0.1; Table 8: ring [0.5, 0.9]; D.1: unidirectional; D.2: 10% warm-up."""
    config = resolved("model=lru", "task=text", "protocol=authors")
    arch, trainer = config["task"]["arch"], config["trainer"]
    assert (arch["num_layers"], arch["dim"], arch["dropout"]) == (6, 256, 0.1)
    lru = config["model"]["attention_options"]["lru"]
    assert (lru["state_size"], lru["r_min"], lru["r_max"], lru["bidirectional"]) == (
        192,
        0.5,
        0.9,
        False,
    )
    assert (trainer["batch_size"], trainer["num_steps"], trainer["warmup_steps"]) == (
        32,
        50000,
        5000,
    )
    assert trainer["param_groups"] == {"ssm": {"lr_factor": 0.1, "weight_decay": 0.0}}
    # No base learning rate in the paper: the task file's stays, and the group follows it.
    official = resolved("model=lru", "task=text")
    assert trainer["learning_rate"] == official["trainer"]["learning_rate"]
    groups = optim._groups(OmegaConf.create(trainer))
    assert groups["ssm"]["learning_rate"] == pytest.approx(0.1 * trainer["learning_rate"])
    pathx = resolved("model=lru", "task=pathx", "protocol=authors")["model"]["attention_options"]
    assert pathx["lru"]["bidirectional"] and pathx["lru"]["max_phase"] == pytest.approx(
        0.1 * 3.141592653589793
    )


def test_a_model_without_authors_settings_is_an_error_naming_the_ones_that_have_them():
    for model in ("mamba", "transformer"):
        problem = command_line_problem(
            "config", [f"model={model}", "task=listops", "protocol=authors"]
        )
        assert problem.startswith("protocol: expected one of lra_official, transnormer, authors")
        assert "model=s4d, model=s5 and model=lru" in problem
    assert command_line_problem("config", ["model=s5", "task=listops", "protocol=authors"]) is None


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_authors_file_validates_records_authors_and_its_groups_match_the_model(path):
    _, model, task = path.stem.split("_", 2)
    assert task in TASKS
    text = path.read_text()
    assert "Source:" in text and "NOT REPRODUCED" in text  # cites its source, says what is not
    overrides = [f"model={model}", f"task={task}", "protocol=authors"]
    assert command_line_problem("config", overrides) is None
    config = resolved(*overrides)
    described = describe_setting(config)
    assert described["protocol"] == "authors" and described["overrides"] == {}
    assert described["variant"] == model
    # The groups name parameters the model has (a tiny copy of its shape).
    from lra.train.model import build_model

    tiny = make_config(*overrides, "task.arch.num_layers=1", "task.arch.dim=8")
    _, params, stats, _ = nnx.split(
        build_model(tiny, nnx.Rngs(params=0)), nnx.Param, nnx.BatchStat, ...
    )
    optim.make_optimizer(tiny.trainer).init(params)
    # Every reference normalises with BatchNorm; post-norm exactly where the header quotes the
    # source's prenorm false (S4's ListOps and Image files).
    assert "not built yet" not in text
    arch = config["task"]["arch"]
    assert arch["norm"] == "batch" and jax.tree.leaves(stats)  # running statistics exist
    assert arch["norm_position"] == ("post" if "prenorm false" in text else "pre")
    changed = resolved(*overrides, "trainer.learning_rate=0.5")
    assert describe_setting(changed)["protocol"] == "custom"


def test_other_protocols_keep_their_settings_and_identities():
    official = resolved("model=s5", "task=listops")
    assert official["protocol"] == "lra_official"
    assert official["trainer"]["param_groups"] is None
    assert official["task"]["arch"]["num_layers"] == 4
    theirs = resolved("model=s5", "task=listops", "protocol=transnormer")
    assert theirs["task"]["arch"]["dim"] == 128 and theirs["trainer"]["param_groups"] is None


# (overrides, norm, norm_position): S4's s4-listops.yaml (prenorm false, norm batch); S5's
# --batchnorm=True with its default prenorm=True; LRU's Appendix D.1 (batch normalisation
# before the recurrent block); OpenNLPLab/lra transnormer-lra-imdb.yaml (norm batch) and
# transnormer-lra-listops.yaml (norm layer), both prenorm true, for every model.
REFERENCE_NORMS = [
    (("model=s4d", "task=listops", "protocol=authors"), "batch", "post"),
    (("model=s5", "task=text", "protocol=authors"), "batch", "pre"),
    (("model=lru", "task=image", "protocol=authors"), "batch", "pre"),
    (("model=transformer", "task=text", "protocol=transnormer"), "batch", "pre"),
    (("model=transformer", "task=listops", "protocol=transnormer"), "layer", "pre"),
]


@pytest.mark.parametrize(
    "overrides, norm, position", REFERENCE_NORMS, ids=[" ".join(o) for o, _, _ in REFERENCE_NORMS]
)
def test_protocols_build_the_references_norms(overrides, norm, position):
    from lra.train.model import build_model, model_kwargs

    config = make_config(*overrides)
    assert (config.task.arch.norm, config.task.arch.norm_position) == (norm, position)
    kwargs = model_kwargs(config)  # after the model's arch_overrides
    assert (kwargs["norm"], kwargs["norm_position"]) == (norm, position)
    tiny = make_config(*overrides, "task.arch.num_layers=1", "task.arch.dim=8")
    stats = nnx.state(build_model(tiny, nnx.Rngs(params=0)), nnx.BatchStat)
    assert bool(jax.tree.leaves(stats)) == (norm == "batch")
    official = make_config(*overrides[:2])  # the LRA setting keeps the LayerNorm, pre-norm
    assert (official.task.arch.norm, official.task.arch.norm_position) == ("layer", "pre")


def test_lra_bench_takes_the_authors_model_settings_at_the_figure_1_sizes():
    from lra.config.compose import compose_config

    bench = compose_config("bench", ["model=s5", "protocol=authors"])
    text = make_config("model=s5", "task=text", "protocol=authors")
    assert OmegaConf.to_container(bench.model.attention_options) == OmegaConf.to_container(
        text.model.attention_options
    )
    assert (bench.task.arch.norm, bench.task.arch.norm_momentum) == ("batch", 0.95)
    official = compose_config("bench", ["model=s5"])
    for key in ("dim", "qkv_dim", "mlp_dim"):  # bench.yaml's own (Figure-1) sizes win
        assert bench.task.arch[key] == official.task.arch[key] < text.task.arch[key]
