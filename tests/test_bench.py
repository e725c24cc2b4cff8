"""lra-bench: complete records at a tiny size, OOM cells, bad settings, the figure1 sweep."""

import json
from pathlib import Path

import jax
import pytest
from hydra import compose, initialize_config_dir

from lra.cli import CONFIG_DIR
from lra.errors import ConfigError
from lra.measure import bench
from lra.record.store import read_records

TINY_BENCH = [
    "task=listops_tiny",
    "task.arch.num_layers=1",
    "task.arch.dim=16",
    "task.arch.qkv_dim=16",
    "task.arch.mlp_dim=32",
    "task.arch.num_heads=2",
    "batch_size=2",
    "bench.warmup_steps=1",
    "bench.windows=2",
    "bench.steps_per_window=1",
]
FIGURE1_MODELS = (
    "transformer flash_quad flash ls performer cosformer linformer nystromformer reformer "
    "transnormer_t1 transnormer_t2"
).split()


def bench_config(*overrides: str, config_name: str = "bench"):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def test_bench_records_keep_the_protocol_when_only_the_measurement_changes():
    from omegaconf import OmegaConf

    from lra.config.setting import describe_setting

    cfg = bench_config("model=flash", "protocol=transnormer", "lengths=[1024]", "batch_size=2")
    container = OmegaConf.to_container(cfg, resolve=True)
    described = describe_setting(container, config_name="bench", ignore=bench.MEASUREMENT_KEYS)
    assert described["protocol"] == "transnormer" and described["variant"] == "flash"
    assert container["model"]["attention_options"]["flash"]["rope"] is True


def test_bench_records_say_how_softmax_ran():
    from lra.train.describe import softmax_implementations

    cfg = bench_config("model=transformer")
    assert cfg.task.max_length >= 1024  # Text: the chunked path on a CPU
    # On a GPU float32 stays on the plain path (cuDNN takes no float32; seen on an H200).
    long_path = "chunked" if jax.default_backend() == "cpu" else "plain"
    assert softmax_implementations(cfg) == {"train": long_path, "eval": long_path}
    short = bench_config("model=transformer", "task.max_length=512")
    assert softmax_implementations(short) == {"train": "plain", "eval": "plain"}
    fused = bench_config(
        "model=transformer", "+model.attention_options.softmax.implementation=fused"
    )
    assert softmax_implementations(fused) == {"train": "fused", "eval": "fused"}


def test_default_bench_config_is_the_figure1_setting():
    cfg = bench_config()
    assert cfg.task.name == "text" and cfg.batch_size == 20
    assert list(cfg.lengths) == [1024, 2048, 3072, 4096, 5120]
    assert (cfg.task.arch.num_layers, cfg.task.arch.dim) == (6, 128)


def test_bench_writes_one_complete_record_per_length(tmp_path):
    cfg = bench_config(
        *TINY_BENCH,
        "model=performer",
        "lengths=[16,32]",
        f"results_dir={tmp_path}",
        "bench.isolate=false",
    )
    records = bench.run_benchmark(cfg)
    assert [r["length"] for r in records] == [16, 32]
    stored = sorted(read_records(tmp_path), key=lambda r: r["length"])
    assert [r["length"] for r in stored] == [16, 32]
    for record in stored:
        assert record["kind"] == "bench" and record["status"] == "ok"
        assert record["model"] == "performer" and record["task"] == "listops_tiny"
        assert record["train_steps_per_sec"] > 0 and record["eval_steps_per_sec"] > 0
        assert len(record["train_steps_per_sec_windows"]) == 2
        # Every window keeps how busy the rest of the machine was; the speed says its spread.
        assert len(record["train_window_other_cores"]) == 2
        assert len(record["eval_window_load_average"]) == 2
        assert record["train_steps_per_sec_spread"] >= 0
        assert record["achieved_flops_per_sec"] == pytest.approx(
            record["flops_per_step"] * record["train_steps_per_sec"]
        )
        assert set(record["compile_cache"]) == {"dir", "hits", "misses"}
        assert record["softmax_implementation"] is None  # performer has no softmax layer
        assert record["peak_memory_bytes"] > 0 and record["memory_source"]
        assert record["flops_per_step"] > 0 and record["num_params"] > 0
        assert (
            record["platform"] == jax.default_backend()
            and record["config"]["task"]["max_length"] == (record["length"])
        )
        # Lengths and timing options are not overrides of the model's setting; its size is.
        assert "lengths" not in record["overrides"] and "batch_size" not in record["overrides"]
        assert record["overrides"]["task.arch.dim"] == 16 and record["protocol"] == "custom"
        assert record["layer_mechanisms"] == ["performer"]
    # The longer sequence costs more work and memory.
    assert stored[1]["flops_per_step"] > stored[0]["flops_per_step"]
    assert stored[1]["peak_memory_bytes"] > stored[0]["peak_memory_bytes"]


def test_isolated_measurement_runs_in_a_fresh_process(tmp_path):
    cfg = bench_config(
        *TINY_BENCH, "model=linear_transformer", "lengths=[16]", f"results_dir={tmp_path}"
    )
    assert cfg.bench.isolate is True
    (record,) = bench.run_benchmark(cfg)
    assert record["status"] == "ok" and record["isolated"] is True
    assert record["train_steps_per_sec"] > 0 and record["device"]


def test_out_of_memory_length_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real_compile = bench.compile_steps

    def compile_or_oom(cfg, batch, **kwargs):
        if cfg.task.max_length > 16:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        return real_compile(cfg, batch, **kwargs)

    monkeypatch.setattr(bench, "compile_steps", compile_or_oom)
    cfg = bench_config(
        *TINY_BENCH,
        "lengths=[16,32,8]",
        f"results_dir={tmp_path}",
        "bench.isolate=false",
        "model=transformer",
    )
    records = bench.run_benchmark(cfg)
    assert [r["status"] for r in records] == ["ok", "oom", "ok"]
    assert "RESOURCE_EXHAUSTED" in records[1]["error"]
    assert "train_steps_per_sec" not in records[1]
    assert len(read_records(tmp_path)) == 3


def test_other_errors_are_not_mistaken_for_oom(tmp_path, monkeypatch):
    def broken(cfg, batch, **kwargs):
        raise ValueError("a bug, not memory")

    monkeypatch.setattr(bench, "compile_steps", broken)
    cfg = bench_config(
        *TINY_BENCH, "lengths=[16]", f"results_dir={tmp_path}", "bench.isolate=false"
    )
    with pytest.raises(ValueError, match="a bug"):
        bench.run_benchmark(cfg)


@pytest.mark.parametrize("lengths", ["[]", "[0,16]"])
def test_bad_lengths_are_one_clear_error(tmp_path, lengths):
    cfg = bench_config(*TINY_BENCH, f"lengths={lengths}", f"results_dir={tmp_path}")
    with pytest.raises(ConfigError, match="lengths"):
        bench.run_benchmark(cfg)
    assert not list(Path(tmp_path).glob("*.json"))


@pytest.mark.parametrize("experiment", ["figure1", "figure1_tiny"])
def test_figure1_experiment_composes_for_every_model_and_task(experiment):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        hydra_cfg = compose("config", [f"experiment={experiment}"], return_hydra_config=True)
    params = hydra_cfg.hydra.sweeper.params
    models, tasks = params.model.split(","), params.task.split(",")
    assert sorted(models) == sorted(FIGURE1_MODELS)
    official = ["listops", "text", "retrieval", "image", "pathfinder", "pathx"]
    assert tasks == (official if experiment == "figure1" else [t + "_tiny" for t in official])
    for model in models:
        for task in tasks:
            pair = bench_config(
                f"experiment={experiment}", f"model={model}", f"task={task}", config_name="config"
            )
            assert pair.model.name == model and pair.task.name == task
            assert pair.trainer.batch_size > 0 and pair.task.max_length > 0
            json.dumps(dict(pair.task.arch))  # a plain, resolvable architecture


def test_a_second_run_loads_its_compiled_steps_from_the_cache(tmp_path):
    """compile_cache: the rerun of the same shapes hits JAX's persistent cache."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    args = [
        *TINY_BENCH,
        "model=transformer",
        "lengths=[32]",
        "bench.isolate=false",
        f"compile_cache.dir={cache}",
        "compile_cache.min_compile_seconds=0",
    ]
    script = Path(sys.executable).parent / "lra-bench"
    for run in ("first", "second"):
        done = subprocess.run(
            [str(script), *args, f"results_dir={tmp_path / run}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    first, second = (read_records(tmp_path / run)[0] for run in ("first", "second"))
    assert first["compile_cache"]["dir"] == str(cache) and any(cache.iterdir())
    assert first["compile_cache"]["misses"] >= 2 and first["compile_cache"]["hits"] == 0
    assert second["compile_cache"]["hits"] >= 2 and second["compile_cache"]["misses"] == 0
    off = bench_config(*args[:-2], "compile_cache.enabled=false")
    assert off.compile_cache.enabled is False


def fake_cell_factory(calls: list):
    """A stand-in for bench.measure_cell: the n-th call measures windows [n, n + 1]."""

    def fake_cell(config, length, batch_size, options):
        calls.append((config["model"]["name"], length))
        rate = float(len(calls))
        return {
            "length": length,
            "batch_size": batch_size,
            "status": "ok",
            **bench.summarize_windows([rate, rate + 1], [{}, {}], "train"),
            **bench.summarize_windows([rate], [{}], "eval"),
            "flops_per_step": 10.0,
        }

    return fake_cell


def test_each_model_of_a_sweep_keeps_its_protocol(tmp_path, monkeypatch):
    """models=[...] under lra-bench: Hydra's choice is the default model, yet each record's
    reference is its own model's config (so no model.* overrides and the protocol holds),
    and models / rounds are how it was measured, not a setting."""
    import lra.config.setting

    monkeypatch.setattr(bench, "measure_cell", fake_cell_factory([]))
    app_choices = {"model": "transformer", "task": "text", "protocol": "transnormer"}
    for module in (lra.config.setting, bench):  # as HydraConfig's runtime choices would say
        monkeypatch.setattr(module, "group_choices", lambda config: dict(app_choices))
    overrides = ["lengths=[16]", "batch_size=2", "bench.isolate=false", f"results_dir={tmp_path}"]
    cfg = bench_config(
        *overrides, "protocol=transnormer", "models=[flash,transnormer_t2]", "rounds=2"
    )
    records = bench.run_benchmark(cfg, overrides=[*overrides, "protocol=transnormer"])
    for record in records:
        assert record["overrides"] == {}, record["overrides"]
        assert record["protocol"] == "transnormer" and record["variant"] == record["model"]


def test_a_sweep_of_models_runs_round_robin_and_pools_its_rounds(tmp_path, monkeypatch):
    """models + rounds: each round measures every length and model once, in that order;
    each record pools its windows over the rounds and keeps every round's median."""
    calls = []
    monkeypatch.setattr(bench, "measure_cell", fake_cell_factory(calls))
    overrides = [*TINY_BENCH, "lengths=[16,32]", "bench.isolate=false", f"results_dir={tmp_path}"]
    cfg = bench_config(*overrides, "models=[transformer,performer]", "rounds=2")
    records = bench.run_benchmark(cfg, overrides=overrides)
    assert (
        calls
        == [("transformer", 16), ("performer", 16), ("transformer", 32), ("performer", 32)] * 2
    )
    assert sorted((r["model"], r["length"]) for r in records) == [
        ("performer", 16),
        ("performer", 32),
        ("transformer", 16),
        ("transformer", 32),
    ]
    first = next(r for r in records if (r["model"], r["length"]) == ("transformer", 16))
    assert first["rounds"] == 2 and first["sweep_order"] == "round-robin"
    assert first["train_steps_per_sec_windows"] == [1.0, 2.0, 5.0, 6.0]
    assert first["train_steps_per_sec_rounds"] == [1.5, 5.5]
    assert first["train_steps_per_sec"] == 3.5
    assert first["config"]["model"]["name"] == "transformer"
    assert len(read_records(tmp_path)) == 4
