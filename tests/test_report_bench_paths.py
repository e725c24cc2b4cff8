"""lra-bench measures the Transformer on two softmax paths in one sweep
(``bench.softmax_paths``), and lra-report shows them as two labelled rows (issue 31, part 4).
A tiny CPU benchmark: one layer, d_model 16, length 16."""

import test_bench
from hydra import compose, initialize_config_dir

from lra.cli import CONFIG_DIR
from lra.measure import bench
from lra.record.store import read_records
from lra.report.efficiency import IMPLEMENTATION_KEY, efficiency

# test_bench's tiny benchmark, in this process and at one length
TINY_BENCH = [*test_bench.TINY_BENCH, "bench.isolate=false", "lengths=[16]"]


def test_bench_softmax_paths_adds_a_forced_plain_row_to_the_same_sweep(tmp_path):
    overrides = [
        *TINY_BENCH,
        "models=[transformer,performer]",
        "bench.softmax_paths=[plain]",
        f"results_dir={tmp_path}",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="bench", overrides=overrides)
    records = bench.run_benchmark(cfg, overrides=overrides)
    # transformer (auto), performer, and transformer forced plain; performer has no softmax
    assert [r["model"] for r in records] == ["transformer", "performer", "transformer"]
    forced = records[2]
    assert forced["overrides"][IMPLEMENTATION_KEY] == "plain"
    assert forced["softmax_implementation"] == {"train": "plain", "eval": "plain"}
    assert IMPLEMENTATION_KEY not in records[0]["overrides"]
    assert forced["sweep_order"] == "round-robin"
    [table] = efficiency(read_records(tmp_path))
    # at length 16 "auto" also runs the plain path: the rows say which was asked for
    assert set(table.models) == {"transformer (plain)", "transformer (auto: plain)", "performer"}
    assert table.baseline == "transformer (plain)"


def test_a_forced_path_shares_the_table_of_the_protocol_it_was_asked_under(tmp_path):
    # Under protocol=transnormer with nothing else overridden, the auto run records its protocol
    # and the forced plain run records "custom" (its one override): both belong to one table.
    overrides = [*TINY_BENCH, "models=[transformer]", "bench.softmax_paths=[plain]"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="bench", overrides=[*overrides, f"results_dir={tmp_path}"])
    auto, forced = bench.run_benchmark(cfg, overrides=overrides)
    for record in (auto, forced):
        record["config"]["protocol"] = "transnormer"
    auto.update(protocol="transnormer", overrides={})
    forced["overrides"] = {IMPLEMENTATION_KEY: "plain"}
    assert forced["protocol"] == "custom"
    [table] = efficiency([auto, forced])
    assert table.setting["protocol"] == "transnormer"
    assert set(table.models) == {"transformer (plain)", "transformer (auto: plain)"}
    forced["overrides"]["trainer.precision"] = "bf16"  # another override: another setting
    assert len(efficiency([auto, forced])) == 2
