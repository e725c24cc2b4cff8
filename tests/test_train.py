"""train_and_evaluate end to end on a small listops_tiny, called as the CLI would."""

import json
import math
from pathlib import Path

import jax
import pytest
from conftest import train_small

from lra.errors import ConfigError, DataError
from lra.record.store import TRAIN_RECORD_KEYS
from lra.train.hooks import TrainingDiverged


def run(data_dir, results_dir, *overrides):
    return train_small(data_dir, results_dir, *overrides)


def test_a_few_steps_write_a_complete_finite_record(listops_tiny_dir, tmp_path):
    record = run(listops_tiny_dir, tmp_path)
    assert set(TRAIN_RECORD_KEYS) <= set(record)
    on_disk = json.loads(Path(record["record_path"]).read_text())
    assert on_disk["test_accuracy"] == record["test_accuracy"]
    for key in (
        "test_accuracy",
        "val_accuracy",
        "train_steps_per_sec",
        "eval_steps_per_sec",
        "peak_memory_bytes",
        "flops_per_step",
        "num_params",
        "wall_seconds",
    ):
        assert isinstance(record[key], int | float) and math.isfinite(record[key]), key
        assert record[key] >= 0, key
    assert 0 <= record["test_accuracy"] <= 1
    assert 0 < record["test_majority_rate"] <= 1
    assert record["flops_per_step"] > 0 and record["num_params"] > 1000
    # On CPU always the compiled analysis; on a GPU the device's peak if the steps set it.
    sources = {"xla_compiled_memory_analysis"}
    if jax.default_backend() != "cpu":
        sources.add("device_peak_bytes_in_use")
    assert record["memory_source"] in sources
    # Float32 at this length: the plain path on CPU and GPU alike (cuDNN takes no float32).
    assert record["softmax_implementation"] == {"train": "plain", "eval": "plain"}
    assert record["selection"] == "best_val"
    assert record["selected_step"] in (2, 4)
    assert [h["step"] for h in record["history"]] == [1, 2, 3, 4]
    assert record["config"]["trainer"]["num_steps"] == 4
    assert record["config"]["data_dir"] == str(listops_tiny_dir)
    # The small run overrides the files: its own setting, a named variant, protocol custom.
    assert record["overrides"]["trainer.num_steps"] == 4
    assert "task.generator.num_train" in record["overrides"]
    assert record["variant"].startswith("transformer[") and record["protocol"] == "custom"
    assert len(record["setting"]) == 10 and record["setting"] in record["run_key"]
    assert record["layer_mechanisms"] == ["softmax"] and record["schedule_warning"] is None
    assert record["val_source"] == "official"
    assert record["split_sizes"] == {"train": 256, "val": 64, "test": 64}
    assert set(record["compile_cache"]) == {"dir", "hits", "misses"}


def test_records_name_each_layers_mechanism_and_a_degenerate_schedule():
    from conftest import make_config

    from lra.train.describe import layers_description

    image = layers_description(make_config("task=image", "model=transnormer_t2"))
    assert image["layer_mechanisms"] == ["transnormer_norm"]
    assert "0 lower layers" in image["schedule_warning"]
    theirs = make_config("task=image", "model=transnormer_t2", "protocol=transnormer")
    deep = layers_description(theirs)
    assert deep["layer_mechanisms"] == ["transnormer_diag"] * 6 + ["transnormer_norm"] * 6
    assert deep["schedule_warning"] is None


def test_same_seed_same_result_and_last_selection(listops_tiny_dir, tmp_path):
    first = run(listops_tiny_dir, tmp_path / "a", "seed=3", "trainer.selection=last")
    second = run(listops_tiny_dir, tmp_path / "b", "seed=3", "trainer.selection=last")
    assert "skipped" not in second  # trained again in its own folder
    assert first["selected_step"] == 4 and first["selection"] == "last"
    assert first["history"] == second["history"]
    assert first["test_accuracy"] == second["test_accuracy"]
    other = run(listops_tiny_dir, tmp_path, "seed=4", "trainer.selection=last")
    assert other["history"] != first["history"]


def test_bf16_precision_trains(listops_tiny_dir, tmp_path):
    record = run(listops_tiny_dir, tmp_path, "trainer=bf16")
    assert record["precision"] == "bf16"
    assert all(math.isfinite(h["train_loss"]) for h in record["history"])


def test_diverging_loss_stops_with_the_step(listops_tiny_dir, tmp_path):
    with pytest.raises(TrainingDiverged, match="at step 2;"):
        run(
            listops_tiny_dir,
            tmp_path / "records",
            "trainer.learning_rate=1e30",
            "trainer.schedule=constant",
            "trainer.warmup_steps=0",
        )
    assert not list((tmp_path / "records").rglob("record.json"))


def test_missing_data_names_the_prepare_command(tmp_path):
    with pytest.raises(DataError) as info:
        run(tmp_path / "empty", tmp_path / "records")
    assert f"lra-data task=listops_tiny data_dir={tmp_path / 'empty'}" in str(info.value)
    assert list((tmp_path / "records").iterdir()) == []


def test_unwritable_results_dir_fails_before_training(listops_tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DataError, match="not writable"):
        run(listops_tiny_dir, blocker / "records")


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.selection=best", "trainer.selection"),
        ("trainer.schedule=linear", "trainer.schedule"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("model.attention=nope", "nope"),
    ],
)
def test_bad_config_values_are_named(listops_tiny_dir, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        run(listops_tiny_dir, tmp_path, override)
