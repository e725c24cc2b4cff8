"""lra-smoke: two models (one of them from a user's config folder) on listops_tiny; its rules."""

import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from test_cli import cli

from lra.cli import CONFIG_DIR
from lra.errors import ConfigError
from lra.measure.smoke import Row, _choose, _options

EXAMPLE_CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "my_attention" / "configs"


def test_two_models_train_and_beat_the_majority_class(tmp_path):
    out = cli(
        "lra-smoke",
        "--config-dir",
        str(EXAMPLE_CONFIGS),
        "models=[transformer,my_attention]",
        "tasks=[listops_tiny]",
        "learn_steps=60",
        "pretrain_rows=none",  # the self-pretraining row: tests/test_pretrain_runs.py
        f"data_dir={tmp_path / 'data'}",
        f"results_dir={tmp_path / 'smoke'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    table = (tmp_path / "smoke" / "smoke.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| transformer", "| my_attention"]
    assert all("ok (beats majority)" in r for r in rows[1:])
    records = [json.loads(p.read_text()) for p in (tmp_path / "smoke").glob("*/record.json")]
    assert sorted(r["model"] for r in records) == ["my_attention", "transformer"]
    for record in records:
        assert record["config"]["trainer"]["num_steps"] == 60
        assert record["test_accuracy"] > record["test_majority_rate"]
        assert all(math.isfinite(h["train_loss"]) for h in record["history"])
    sources = {r["model"]: r["attention_sources"] for r in records}
    assert sources["transformer"] == {"softmax": "lra.models.attention.softmax:SoftmaxAttention"}
    assert sources["my_attention"] == {
        "my_attention": "my_attention.attention:SquaredReluAttention from my-attention 0.1.0"
    }


def test_an_unknown_model_is_a_one_line_error(tmp_path):
    out = cli("lra-smoke", "models=[transformr]", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    assert "unknown model(s) ['transformr']; available: cosformer" in out.stderr
    assert "--config-dir" in out.stderr and "Traceback" not in out.stderr


def test_defaults_are_every_model_and_every_tiny_task():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="smoke")
        tasks = _choose(cfg.tasks, "task", [t for t in _options("task") if "_tiny" in t], "")
        model_names = _choose(cfg.models, "model", _options("model"), "")
    assert cfg.models is None and cfg.tasks is None
    configs = Path(CONFIG_DIR)
    assert model_names == sorted(p.stem for p in (configs / "model").glob("*.yaml"))
    assert tasks == sorted(p.stem for p in (configs / "task").glob("*_tiny.yaml"))
    assert len(tasks) == 6


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (Row("m", "text_tiny", 2, loss=0.7, accuracy=0.5, majority=0.5), None),
        (
            Row("m", "text_tiny", 2, loss=float("nan"), accuracy=0.5, majority=0.5),
            "training loss nan",
        ),
        (Row("m", "text_tiny", 2, error="ConfigError: bad"), "ConfigError: bad"),
        (
            Row("m", "listops_tiny", 9, loss=2.0, accuracy=0.11, majority=0.11,
                checks_learning=True),
            "test accuracy 0.1100 <= majority class 0.1100",
        ),
    ],
)  # fmt: skip
def test_a_row_fails_on_a_non_finite_loss_an_error_or_no_learning(row, problem):
    assert row.problem == problem
    assert row.cells()[-1] == ("ok" if problem is None else f"FAIL: {problem}")


def test_no_choice_at_all_is_an_error():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        compose(config_name="smoke")
        with pytest.raises(ConfigError, match="unknown task"):
            _choose([], "task", [], "task(s)")


def test_default_budget_tabulates_accuracy_speed_and_size_and_a_rerun_skips(tmp_path):
    command = [
        "lra-smoke",
        "budget=default",
        "models=[transformer]",
        "tasks=[listops_tiny]",
        'overrides=["trainer.num_steps=60","trainer.warmup_steps=6"]',
        "pretrain_rows=none",
        f"data_dir={tmp_path / 'data'}",
        f"results_dir={tmp_path / 'smoke'}",
    ]
    out = cli(*command, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    table = (tmp_path / "smoke" / "smoke.md").read_text()
    head = "| model | task | steps | test accuracy | val accuracy | majority class | train steps/s"
    assert head + " | params | check |" in table
    (record_path,) = (tmp_path / "smoke").glob("*/record.json")
    record = json.loads(record_path.read_text())
    assert record["config"]["trainer"]["resume"] != "never"  # a rerun resumes or skips
    (row,) = [line for line in table.splitlines() if line.startswith("| transformer ")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["transformer", "listops_tiny", "60"]
    assert cells[3:6] == [
        f"{record['test_accuracy']:.4f}",
        f"{record['val_accuracy']:.4f}",
        f"{record['test_majority_rate']:.4f}",
    ]
    assert cells[6] == f"{record['train_steps_per_sec']:.1f}"
    assert cells[7] == f"{record['num_params']:,}" and cells[8] == "ok (beats majority)"
    again = cli(*command, cwd=tmp_path)  # the finished run is reported done, not retrained
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is already done" in again.stdout + again.stderr
    assert (tmp_path / "smoke" / "smoke.md").read_text() == table
