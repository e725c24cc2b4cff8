"""Every model= config trains through lra-train on listops_tiny (finite loss), in one multirun."""

import json
import math
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN
from test_cli import cli

import lra.models

MODEL_CONFIGS = sorted(
    p.stem for p in (Path(__file__).parents[1] / "configs" / "model").glob("*.yaml")
)


def test_model_configs_cover_every_mechanism():
    from omegaconf import OmegaConf

    used = set()
    for name in MODEL_CONFIGS:
        attention = OmegaConf.load(
            Path(__file__).parents[1] / "configs" / "model" / f"{name}.yaml"
        ).attention
        if isinstance(attention, str):
            used.add(attention)
        else:
            used.update([attention.lower, attention.upper])
    assert used == set(lra.models.ATTENTION_NAMES)


# Three multiruns of a third each, so pytest-xdist's workers share them out.
CHUNKS = [MODEL_CONFIGS[i::3] for i in range(3)]


@pytest.mark.parametrize("chunk", CHUNKS, ids=[f"part{i}" for i in range(3)])
def test_every_model_trains_in_one_multirun(chunk, listops_tiny_dir, tmp_path):
    records = tmp_path / "records"
    out = cli(
        "lra-train",
        "-m",
        f"model={','.join(chunk)}",
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={records}",
        *SMALL_DATA,
        *SMALL_RUN,
        "task.arch.num_layers=2",
        "trainer.num_steps=2",
        "trainer.eval_every=2",
        "trainer.eval_batches=1",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = {}
    for path in records.glob("*/record.json"):
        record = json.loads(path.read_text())
        found[record["model"]] = record
    assert sorted(found) == sorted(chunk)
    for name, record in found.items():
        assert all(math.isfinite(h["train_loss"]) for h in record["history"]), name
        assert math.isfinite(record["test_accuracy"]), name


def test_any_mechanisms_combine_by_configuration_alone():
    import jax
    from conftest import make_config
    from flax import nnx

    from lra.train.model import build_model

    cfg = make_config(
        "model=transformer",
        "model.attention={lower:local,upper:performer}",
        "task.arch.num_layers=4",
        "task.arch.dim=16",
        "task.arch.qkv_dim=16",
        "task.arch.mlp_dim=16",
    )
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(0)))
    kinds = [type(block.attention).__name__ for block in model.encoder.blocks]
    assert kinds == ["LocalAttention"] * 2 + ["PerformerAttention"] * 2
