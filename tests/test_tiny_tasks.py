"""The six tiny tasks end to end: prepared offline, then one lra-train multirun, six records."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_DATA, SMALL_RUN, make_config
from test_cli import cli

from lra.data.tasks import load_task, prepare_command, prepare_task
from lra.errors import DataError
from lra.record import predictions

# Each tiny task at an even smaller size, so preparing all six takes seconds.
SMALLER = {
    "listops_tiny": SMALL_DATA,
    "text_tiny": ["task.source.fixture.num_per_class=40"],
    "retrieval_tiny": [
        "task.source.fixture.num_train=64",
        "task.source.fixture.num_val=32",
        "task.source.fixture.num_test=32",
    ],
    "image_tiny": ["task.source.fixture.num_per_batch=16", "task.source.fixture.num_test=32"],
    "pathfinder_tiny": ["task.source.num_images=60", "task.source.images_per_batch=30"],
    "pathx_tiny": ["task.source.num_images=40", "task.source.images_per_batch=20"],
}


# The tests that use the module fixture `tiny_data_dir` run on one pytest-xdist worker
# (--dist loadgroup), so it is built once, not once per worker.
TINY_DATA_GROUP = pytest.mark.xdist_group("tiny_tasks_data")


@pytest.fixture(scope="module")
def tiny_data_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tiny_data")
    for task, overrides in SMALLER.items():
        prepare_task(make_config(f"task={task}", *overrides).task, data_dir, num_workers=1)
    return data_dir


@TINY_DATA_GROUP
def test_every_tiny_task_loads_in_its_shape(tiny_data_dir):
    for task in SMALLER:
        cfg = make_config(f"task={task}")
        splits = load_task(cfg.task, tiny_data_dir)
        num_inputs = 2 if cfg.task.dual else 1
        for split in splits.values():
            assert len(split.inputs) == num_inputs
            assert split.max_length == cfg.task.max_length
            assert split.inputs[0].max() < cfg.task.vocab_size
            assert 0 <= split.labels.min() and split.labels.max() < cfg.task.num_classes
            assert (split.lengths[0] >= 1).all()
            assert (split.lengths[0] <= cfg.task.max_length).all()


def test_unprepared_task_names_the_lra_data_command(tmp_path):
    cfg = make_config("task=image_tiny")
    with pytest.raises(DataError) as err:
        load_task(cfg.task, tmp_path)
    assert prepare_command("image_tiny", tmp_path) in str(err.value)


@TINY_DATA_GROUP
def test_one_multirun_over_the_six_tiny_tasks_leaves_six_records(tiny_data_dir, tmp_path):
    out = cli(
        "lra-train",
        "-m",
        "model=transformer",
        f"task={','.join(SMALLER)}",
        f"data_dir={tiny_data_dir}",
        f"results_dir={tmp_path / 'records'}",
        *SMALL_RUN,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "records").glob("*/record.json")]
    assert sorted(r["task"] for r in records) == sorted(SMALLER)
    for record in records:
        assert record["model"] == "transformer"
        assert 0.0 <= record["test_accuracy"] <= 1.0
        assert record["test_loss"] == record["test_loss"]  # finite, not NaN
        assert record["num_steps"] == 4
        # The selected model's per-example predictions: one row per test example (a Retrieval
        # pair is one row), each example once, and the record's accuracy to the last bit.
        named = record["predictions"]["test"]
        rows = predictions.read(Path(record["run_dir"]) / named["file"], named["sha256"])
        n_test = record["split_sizes"]["test"]
        assert sorted(rows["index"].tolist()) == list(range(n_test)), record["task"]
        assert rows["logits"].dtype == np.float16 and rows["logits"].shape[0] == n_test
        accuracy = float(np.mean(rows["pred"] == rows["label"]))
        assert accuracy == record["test_accuracy"], record["task"]
