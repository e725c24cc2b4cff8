"""The report (leaderboard, efficiency, sources, lra-report) from records with known values.

Figure 1 has its own file (test_figure.py); the learning curves theirs (test_curves.py).
"""

import ast
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lra.errors import ConfigError, DataError
from lra.record.store import read_records, write_record
from lra.report import main as report
from lra.report.efficiency import efficiency, memory_slope
from lra.report.leaderboard import leaderboard, leaderboards
from lra.report.load import OFFICIAL_TASKS, TINY_NOTE, results_dirs
from lra.report.tables import (
    VAL_TEST_NOTE,
    efficiency_markdown,
    leaderboard_csv,
    leaderboard_markdown,
)

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
OFFICIAL = OFFICIAL_TASKS


def train(model, task, seed, acc, started="2026-01-01T00:00:00+00:00", version="v1", **extra):
    return {
        "schema_version": 1,
        "kind": "train",
        "model": model,
        "task": task,
        "seed": seed,
        "test_accuracy": acc,
        "val_accuracy": acc,
        "selection": "best_val",
        "code_version": version,
        "config_hash": f"{model}-{task}-{seed}",
        "device": "cpu",
        "started_at": started,
        **extra,
    }


def bench(
    model, length, speed=None, eval_speed=None, memory=None, status="ok", task="text", **extra
):
    record = {
        "schema_version": 1,
        "kind": "bench",
        "model": model,
        "task": task,
        "seed": 0,
        "length": length,
        "batch_size": 20,
        "precision": "fp32",
        "status": status,
        "device": "NVIDIA H200",
        "platform": "gpu",
        "code_version": "v1",
        "config_hash": f"bench-{model}-{length}",
        "started_at": "2026-01-02T00:00:00+00:00",
        **extra,
    }
    if status == "ok":
        record.update(
            train_steps_per_sec=speed,
            train_steps_per_sec_windows=record.get("train_steps_per_sec_windows", [speed, speed]),
            eval_steps_per_sec=eval_speed,
            eval_steps_per_sec_windows=[eval_speed],
            peak_memory_bytes=memory,
            memory_source="device_peak_bytes_in_use",
        )
    return record


def store(tmp_path, records, name="runs"):
    folder = tmp_path / name
    for r in records:
        write_record(r, folder)
    return folder, read_records(folder)


def full_row(model, accs, seed=0, **extra):
    return [train(model, t, seed, a, **extra) for t, a in zip(OFFICIAL, accs, strict=True)]


def official_store(tmp_path):
    """Three models on the official tasks and benchmark records at 1024 and 2048."""
    records = [
        # transformer: listops over three seeds, the other four tasks one seed, plus Path-X.
        train("transformer", "listops", 0, 0.5),
        train("transformer", "listops", 1, 0.6),
        train("transformer", "listops", 2, 0.7),
        *full_row("transformer", [0.6, 0.5, 0.8, 0.4, 0.7])[1:],
        train("transformer", "pathx", 0, 0.5),
        # performer: no image record, so no average.
        *[r for r in full_row("performer", [0.3, 0.6, 0.7, 0.4, 0.8]) if r["task"] != "image"],
        # an older duplicate of performer/text/seed0, superseded by the newer one above.
        train("performer", "text", 0, 0.1, started="2025-06-01T00:00:00+00:00"),
        *full_row("cosformer", [0.4, 0.6, 0.6, 0.5, 0.9]),
        bench("transformer", 1024, 10.0, 20.0, 100 * MIB),
        bench("transformer", 2048, status="oom"),
        bench("performer", 1024, 25.0, 30.0, 50 * MIB),
        bench("performer", 2048, 12.0, 15.0, 100 * MIB),
        bench("cosformer", 2048, 14.0, 18.0, 80 * MIB),
        bench("linformer", 2048, 16.0, 19.0, 60 * MIB),
    ]
    return store(tmp_path, records)


@pytest.fixture
def official(tmp_path):
    return official_store(tmp_path)


def cells_of(md, label):
    line = next(x for x in md.splitlines() if x.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


# ---------------------------------------------------------------- leaderboard


def test_leaderboard_means_stds_counts_and_empty_cells(official):
    _, records = official
    lb = leaderboard(records)
    assert lb.task_set == "official" and lb.tasks == OFFICIAL and lb.pathx == "pathx"
    assert lb.protocol == "unspecified"  # records without a protocol field
    tf = lb.row("transformer")
    listops = tf.cells["listops"]
    assert listops.n == 3 and listops.seeds == [0, 1, 2]
    assert listops.mean == pytest.approx(60.0, abs=1e-12)
    assert listops.std == pytest.approx(10.0, abs=1e-12)  # sample std of 50, 60, 70
    assert tf.cells["text"].n == 1 and tf.cells["text"].std is None
    assert tf.average == pytest.approx((60 + 50 + 80 + 40 + 70) / 5, abs=1e-12)
    assert tf.cells["pathx"].mean == pytest.approx(50.0)  # separate, not in the average
    perf = lb.row("performer")
    assert "image" not in perf.cells and perf.average is None
    assert perf.cells["text"].values == [pytest.approx(60.0)]  # the newest record counts
    assert len(perf.cells["text"].superseded) == 1
    assert [r.label for r in lb.rows] == ["cosformer", "transformer", "performer"]

    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(lb))))
    by_model = {r["model"]: r for r in rows}
    assert {r["protocol"] for r in rows} == {"unspecified"}
    assert float(by_model["transformer"]["listops_mean"]) == pytest.approx(60.0)
    assert float(by_model["transformer"]["listops_std"]) == pytest.approx(10.0)
    assert by_model["transformer"]["listops_n"] == "3"
    assert by_model["transformer"]["listops_setting"] == tf.cells["listops"].setting
    assert by_model["transformer"]["text_std"] == ""
    assert float(by_model["transformer"]["lra_average"]) == pytest.approx(60.0)
    assert by_model["performer"]["image_mean"] == by_model["performer"]["image_n"] == ""
    assert by_model["performer"]["lra_average"] == ""
    assert by_model["cosformer"]["pathx_mean"] == ""
    assert float(by_model["transformer"]["pathx_mean"]) == pytest.approx(50.0)

    md = leaderboard_markdown(lb)
    assert "## Protocol: unspecified" in md
    assert "60.00 ± 10.00 (n=3)" in md
    assert "1 older record(s)" in md and "†" in md
    cells = cells_of(md, "performer")
    assert cells[4] == "" and cells[6] == "" and cells[7] == ""  # image, average, Path-X
    assert " 0.00" not in next(x for x in md.splitlines() if x.startswith("| performer"))


def test_two_settings_of_one_model_are_two_rows_never_averaged(tmp_path):
    """A 2000-step and a 20-step transformer: two rows, each with its own seeds and n."""
    long = {"trainer": {"num_steps": 2000}, "model": {"name": "transformer"}}
    short = {"trainer": {"num_steps": 20}, "model": {"name": "transformer"}}
    quick = {"variant": "transformer[trainer.num_steps=20]", "overrides": {"trainer.num_steps": 20}}
    _, records = store(
        tmp_path,
        [
            *[train("transformer", "listops", s, a, config=long) for s, a in [(0, 0.8), (1, 0.6)]],
            *[
                train("transformer", "listops", s, a, config=short, **quick)
                for s, a in [(0, 0.2), (1, 0.1), (2, 0.3)]
            ],
        ],
    )
    lb = leaderboard(records)
    assert [r.label for r in lb.rows] == ["transformer", "transformer[trainer.num_steps=20]"]
    default, quick_row = lb.row("transformer"), lb.row("transformer[trainer.num_steps=20]")
    assert default.cells["listops"].n == 2 and default.cells["listops"].mean == pytest.approx(70)
    assert quick_row.cells["listops"].n == 3 and quick_row.cells["listops"].mean == pytest.approx(
        20
    )
    assert default.cells["listops"].setting != quick_row.cells["listops"].setting
    assert default.differs == {"listops": {"trainer.num_steps": "2000"}}
    assert quick_row.differs == {"listops": {"trainer.num_steps": "20"}}

    md = leaderboard_markdown(lb)
    assert cells_of(md, "transformer")[1] == "70.00 ± 14.14 (n=2)"
    assert cells_of(md, "transformer[trainer.num_steps=20]")[1] == "20.00 ± 10.00 (n=3)"
    assert "- transformer[trainer.num_steps=20]: trainer.num_steps=20" in md
    assert "(n=5)" not in md and "45.00" not in md  # never the mix of both
    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(lb))))
    assert [r["listops_n"] for r in rows] == ["2", "3"]


def test_settings_sharing_a_variant_get_a_hash_label_and_their_differing_keys(tmp_path):
    old = {"model": {"name": "performer", "dropout": 0.1}}
    new = {"model": {"name": "performer", "dropout": 0.0}}
    _, records = store(
        tmp_path,
        [
            train("performer", "listops", 0, 0.5, config=old, started="2025-01-01T00:00:00"),
            train("performer", "listops", 0, 0.7, config=new),
            train("performer", "text", 0, 0.6, config=new),
        ],
    )
    lb = leaderboard(records)
    labels = sorted(r.label for r in lb.rows)
    assert labels[0] == "performer"  # text: one setting only
    hashed = [lb.row(label) for label in labels[1:]]
    assert len(hashed) == 2 and all(r.label.startswith("performer @") for r in hashed)
    assert sorted(r.cells["listops"].mean for r in hashed) == pytest.approx([50.0, 70.0])
    for r in hashed:
        assert r.label == f"performer @{r.cells['listops'].setting[:6]}"
        assert set(r.differs["listops"]) == {"model.dropout"}
        assert not r.cells["listops"].superseded  # other settings are rows, not superseded
    md = leaderboard_markdown(lb)
    assert "model.dropout=0.1" in md and "model.dropout=0.0" in md


def test_protocols_are_separate_tables_never_averaged(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops", 0, 0.4, protocol="lra_official"),
            train("transformer", "listops", 1, 0.6, protocol="lra_official"),
            train("transformer", "listops", 0, 0.9, protocol="transnormer"),
        ],
    )
    boards = leaderboards(records)
    assert [b.protocol for b in boards] == ["lra_official", "transnormer"]
    assert boards[0].row("transformer").cells["listops"].values == [40.0, 60.0]
    assert boards[1].row("transformer").cells["listops"].values == [90.0]
    with pytest.raises(ConfigError, match="several protocols"):
        leaderboard(records)
    assert leaderboard(records, protocol="transnormer").rows[0].cells["listops"].n == 1

    md = leaderboard_markdown(boards)
    official_at, transnormer_at = (
        md.index("## Protocol: lra_official"),
        md.index("## Protocol: transnormer"),
    )
    assert official_at < md.index("50.00 ± 14.14 (n=2)") < transnormer_at
    assert md.index("90.00 (n=1)") > transnormer_at
    assert "(n=3)" not in md and "63.33" not in md
    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(boards))))
    assert [(r["protocol"], r["listops_n"]) for r in rows] == [
        ("lra_official", "2"),
        ("transnormer", "1"),
    ]


def test_parameter_budget_flags_over_1_10x_only(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops", 0, 0.5, num_params=1000),
            train("transformer", "text", 0, 0.5, num_params=2000),
            train("big", "listops", 0, 0.5, num_params=1000),
            train("big", "text", 0, 0.5, num_params=2300),  # 1.15x on text
            train("edge", "listops", 0, 0.5, num_params=1100),  # exactly 1.10x
            train("small", "listops", 0, 0.5, num_params=900),
            train("transformer", "listops", 0, 0.5, num_params=5000, variant="transformer[x=1]"),
        ],
    )
    lb = leaderboard(records)
    assert lb.baselines == {"listops": "transformer", "text": "transformer"}  # the default row
    big, edge, small = lb.row("big"), lb.row("edge"), lb.row("small")
    assert big.params_ratio == {"listops": 1.0, "text": pytest.approx(1.15)}
    assert big.over_budget and not edge.over_budget and not small.over_budget
    assert lb.row("transformer[x=1]").over_budget  # 5x the default transformer
    md = leaderboard_markdown(lb)
    assert cells_of(md, "big")[-1] == "1.00-1.15x !"
    assert cells_of(md, "edge")[-1] == "1.10x"
    assert cells_of(md, "small")[-1] == "0.90x"
    assert cells_of(md, "transformer")[-1] == "1.00x"
    assert "More than 1.10x the Transformer's parameters" in md
    rows = {r["row"]: r for r in csv.DictReader(io.StringIO(leaderboard_csv(lb)))}
    assert rows["big"]["params_over_budget"] == "true"
    assert rows["edge"]["params_over_budget"] == "false"


def test_no_budget_flag_or_footnote_when_all_within(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops", 0, 0.5, num_params=1000),
            train("performer", "listops", 0, 0.5, num_params=1050),
        ],
    )
    md = leaderboard_markdown(leaderboard(records))
    assert " !" not in md and "More than 1.10x" not in md


def test_validation_on_test_split_is_marked(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops", 0, 0.5, val_source="official"),
            train("performer", "listops", 0, 0.5, val_source="test"),
        ],
    )
    lb = leaderboard(records)
    assert lb.row("performer").val_test and not lb.row("transformer").val_test
    md = leaderboard_markdown(lb)
    assert VAL_TEST_NOTE == "validation = test split: selection saw test data"
    assert VAL_TEST_NOTE in md
    assert cells_of(md, "performer")[1].endswith("‡")
    assert "‡" not in cells_of(md, "transformer")[1]
    _, clean = store(tmp_path, [train("transformer", "listops", 0, 0.5)], name="clean")
    assert VAL_TEST_NOTE not in leaderboard_markdown(leaderboard(clean))


def test_task_set_auto_and_tiny_labels(tmp_path):
    _, records = store(tmp_path, [train("transformer", "listops_tiny", 0, 0.5)])
    lb = leaderboard(records)
    assert lb.task_set == "tiny" and lb.tasks[0] == "listops_tiny"
    assert TINY_NOTE in leaderboard_markdown(lb)
    assert "tiny_average" in leaderboard_csv(lb)
    assert leaderboard(records, "official").rows == []
    with pytest.raises(ConfigError):
        leaderboard(records, "everything")


# ---------------------------------------------------------------- efficiency


def test_efficiency_relative_to_transformer_and_oom(official):
    _, records = official
    [table] = efficiency(records)
    assert table.lengths == [1024, 2048] and table.models[0] == "transformer"
    assert table.relative("performer", 1024, "train_steps_per_sec") == pytest.approx(2.5)
    assert table.relative("performer", 1024, "eval_steps_per_sec") == pytest.approx(1.5)
    assert table.relative("performer", 1024, "peak_memory_bytes") == pytest.approx(0.5)
    assert table.status("transformer", 2048) == "oom"
    assert table.relative("performer", 2048, "train_steps_per_sec") is None
    md = efficiency_markdown([table])
    assert "| transformer | 10.00 | OOM |" in md
    assert "25.00 (2.50x)" in md and "30.00 (1.50x)" in md and "50.0 (0.50)" in md
    assert "NVIDIA H200" in md and "batch size 20" in md and "fp32" in md
    assert "device_peak_bytes_in_use" in md and "protocol unspecified" in md
    assert table.slope("performer") == pytest.approx(1.0)  # 50 -> 100 MiB over 1024 -> 2048


def test_efficiency_tables_split_by_protocol(tmp_path):
    folder, records = store(
        tmp_path,
        [
            bench("performer", 1024, 10.0, 1.0, MIB, protocol="lra_official"),
            bench("performer", 1024, 20.0, 1.0, MIB, config={"protocol": "transnormer"}),
        ],
    )
    tables = efficiency(records)
    speeds = {
        t.setting["protocol"]: t.value("performer", 1024, "train_steps_per_sec") for t in tables
    }
    assert speeds == {"lra_official": 10.0, "transnormer": 20.0}  # neither supersedes the other
    write_record(train("performer", "listops", 0, 0.5, protocol="transnormer"), folder)
    out = tmp_path / "out"
    report.run_report(folder, out, protocol="transnormer", figure=False, curves=False)
    md = (out / "efficiency.md").read_text()
    assert "protocol transnormer" in md and "protocol lra_official" not in md


def test_memory_slope_recovers_power_laws(tmp_path):
    lengths = [256, 512, 1024, 2048, 4096]
    assert memory_slope(lengths, [3e3 * n for n in lengths]) == pytest.approx(1.0)
    assert memory_slope(lengths, [7.0 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert memory_slope([1024], [5.0]) is None
    _, records = store(
        tmp_path,
        [bench("linear", n, 1.0, 1.0, 1000 * n) for n in lengths]
        + [bench("quadratic", n, 1.0, 1.0, 3 * n * n) for n in lengths[:-1]]
        + [bench("quadratic", 4096, status="oom")],
    )
    [table] = efficiency(records)
    assert table.slope("linear") == pytest.approx(1.0)
    assert table.slope("quadratic") == pytest.approx(2.0)


# ---------------------------------------------------------------- run_report


def test_run_report_writes_everything_with_sources(official, tmp_path):
    folder, records = official
    out = tmp_path / "report"
    paths = report.run_report(folder, out, figure_length=2048, show_published=False)
    names = {p.name for p in paths}
    assert names == {
        "leaderboard.md",
        "leaderboard.csv",
        "leaderboard.tex",
        "efficiency.md",
        "efficiency.csv",
        "efficiency.tex",
        "figure1.png",
        "figure1.svg",
        "figure1.pdf",
        "figure1.md",
        "sources.json",
        "pairwise.csv",
        "profiles.png",
        "profiles.svg",
        "profiles.pdf",
    }
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    trace = json.loads((out / "sources.json").read_text())
    files = {Path(r["path"]).name for r in records}
    cell = trace["leaderboard"]["unspecified"]["transformer"]["listops"]
    assert len(cell["records"]) == 3 and set(cell["records"]) <= files
    assert cell["seeds"] == [0, 1, 2] and cell["code_versions"] == ["v1"]
    assert len(cell["setting"]) == 10
    assert len(trace["leaderboard"]["unspecified"]["performer"]["text"]["superseded"]) == 1
    eff = trace["efficiency"][0]["cells"]["performer"]["1024"]
    assert eff["records"][0] in files and eff["status"] == "ok"
    assert trace["figure1"]["points"]["cosformer"]["x_record"] in files
    assert set(trace["figure1"]["points"]["cosformer"]["y_records"]) <= files
    assert trace["results_dir"] == [str(folder.resolve())]


def test_results_dir_list_reads_training_and_benchmark_folders(tmp_path):
    runs, _ = store(tmp_path, full_row("transformer", [0.5] * 5), name="runs")
    benches, _ = store(tmp_path, [bench("transformer", 2048, 5.0, 6.0, MIB)], name="bench")
    with pytest.raises(DataError, match="lra-bench -m model=transformer"):
        # one folder: no bench records, and the figure is required
        report.run_report(runs, tmp_path / "o1", curves=False, figure=True)
    assert not (tmp_path / "o1").exists()
    paths = report.run_report([runs, benches], tmp_path / "o2", curves=False)
    assert tmp_path / "o2" / "figure1.png" in paths
    trace = json.loads((tmp_path / "o2" / "sources.json").read_text())
    assert trace["figure1"]["points"]["transformer"]["x_record"].startswith("bench/")
    assert next(iter(trace["leaderboard"]["unspecified"]["transformer"]["text"]["records"]))
    # the default: results/runs and results/bench, relative to the working directory
    assert results_dirs(None) == [Path("results/runs").resolve(), Path("results/bench").resolve()]
    assert results_dirs(str(runs)) == [runs.resolve()]


def test_no_training_records_is_an_error_naming_the_folder_and_command(tmp_path):
    folder, _ = store(tmp_path, [bench("transformer", 2048, 5.0, 6.0, MIB)])
    for where in (folder, [folder, tmp_path / "absent"]):
        with pytest.raises(DataError) as err:
            report.run_report(where, tmp_path / "out")
        message = str(err.value)
        assert "no training records" in message and str(folder.resolve()) in message
        assert "lra-train -m experiment=figure1" in message
        assert "lra-train -m experiment=figure1_tiny" in message
    assert "(missing)" in message
    assert not (tmp_path / "out").exists()


def test_no_benchmark_records_for_the_figure_is_an_error_unless_figure_false(tmp_path):
    folder, _ = store(
        tmp_path,
        [
            *full_row("transformer", [0.5] * 5, protocol="transnormer"),
            *full_row("performer", [0.5] * 5, protocol="transnormer"),
            bench("transformer", 1024, 5.0, 6.0, MIB, protocol="transnormer"),
        ],
    )
    with pytest.raises(DataError) as err:
        report.run_report(folder, tmp_path / "out", curves=False, figure=True)
    message = str(err.value)
    assert "lra-bench -m model=performer,transformer lengths=[2048] protocol=transnormer" in message
    assert "1024" in message and "figure=false" in message
    assert not (tmp_path / "out").exists()
    paths = report.run_report(folder, tmp_path / "out", curves=False, figure=False)
    assert {p.name for p in paths} == {
        "leaderboard.md",
        "leaderboard.csv",
        "leaderboard.tex",
        "efficiency.md",
        "efficiency.csv",
        "efficiency.tex",
        "sources.json",
        "pairwise.csv",
        "profiles.png",
        "profiles.svg",
        "profiles.pdf",
    }
    assert "figure1" not in json.loads((tmp_path / "out" / "sources.json").read_text())


def test_wrong_task_set_is_an_error_not_an_empty_table(tmp_path):
    folder, _ = store(tmp_path, [train("transformer", "listops_tiny", 0, 0.5)])
    with pytest.raises(DataError, match="no training records on the official tasks"):
        report.run_report(folder, tmp_path / "out", tasks="official", figure=False)


def test_models_filter_keeps_only_the_named_models(tmp_path):
    store_dir = tmp_path / "store"
    for model, seed in [("transformer", 0), ("performer", 0), ("local", 0)]:
        write_record(train(model, "listops_tiny", seed, 0.5), store_dir)
    report.run_report(
        store_dir, tmp_path / "out", tasks="tiny", models=["transformer", "performer"], figure=False
    )
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "transformer" in board and "performer" in board and "| local |" not in board
    with pytest.raises(ConfigError, match="no records of the models"):
        report.run_report(store_dir, tmp_path / "out2", tasks="tiny", models=["reformer"])


def test_settings_protocol_and_date_filters(tmp_path):
    quick = {"variant": "transformer[trainer.num_steps=20]", "setting": "aaaa111122"}
    folder, _ = store(
        tmp_path,
        [
            train("transformer", "listops_tiny", 0, 0.5, setting="bbbb333344"),
            train("transformer", "listops_tiny", 0, 0.1, started="2026-03-05T10:00:00", **quick),
            train("performer", "listops_tiny", 0, 0.4, protocol="transnormer"),
        ],
    )

    def labels(**filters):
        out = tmp_path / "out"
        report.run_report(folder, out, tasks="tiny", figure=False, curves=False, **filters)
        rows = csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text()))
        return sorted((r["protocol"], r["row"]) for r in rows)

    assert len(labels()) == 3
    assert labels(settings=["transformer[trainer.num_steps=20]"]) == [
        ("unspecified", "transformer[trainer.num_steps=20]")
    ]
    assert labels(settings=["bbbb33"]) == [("unspecified", "transformer")]
    assert labels(protocol="transnormer") == [("transnormer", "performer")]
    assert labels(since="2026-03-05") == [("unspecified", "transformer[trainer.num_steps=20]")]
    assert len(labels(until="2026-03-05")) == 3  # a bare date keeps the whole day
    assert len(labels(until="2026-03-04")) == 2
    with pytest.raises(ConfigError, match="protocols there: transnormer, unspecified"):
        labels(protocol="lra_official")
    with pytest.raises(ConfigError, match="bbbb333344"):
        labels(settings=["nothing"])
    with pytest.raises(ConfigError, match="not an ISO date"):
        labels(since="last week")


def test_reference_csvs_name_a_source_for_every_row():
    # results/reference/*.csv are no longer read by lra-report (the published numbers are in
    # lra/report/published_data); while the files stay, every row still names its source.
    with open(REPO / "results/reference/figure1_paper.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 11 and all(r["source"] for r in rows)
    drawn = [r["model"] for r in rows if r["lra_average"] and r["train_steps_per_sec"]]
    assert drawn == ["transformer", "flash", "transnormer_t2"]
    with open(REPO / "results/reference/lra_paper_scores.csv", newline="") as handle:
        scores = list(csv.DictReader(handle))
    assert scores and all(r["source"] for r in scores)


def test_report_config_lives_beside_lra_trains():
    from omegaconf import OmegaConf

    from lra.cli import CONFIG_DIR

    assert report.CONFIG_DIR == CONFIG_DIR and (Path(CONFIG_DIR) / "report.yaml").is_file()
    cfg = OmegaConf.load(Path(CONFIG_DIR) / "report.yaml")
    assert list(cfg.results_dir) == ["results/runs", "results/bench"]
    assert cfg.figure == "auto" and cfg.show_published is True and "reference_csv" not in cfg
    for key in ("models", "settings", "protocols", "since", "until"):
        assert key in cfg and cfg[key] is None


# The chain load -> aggregate -> render -> orchestrate; each module imports only earlier ones.
CHAIN = [
    ["load"],
    ["leaderboard", "efficiency"],
    ["figure_data", "compare", "table2"],
    ["tables", "figure", "latex"],
    ["curves"],
    ["main"],
]


def test_report_modules_import_one_way():
    """Inside lra.report: load -> aggregate -> render -> main, never backwards."""
    rank = {m: i for i, layer in enumerate(CHAIN) for m in layer}
    for module, level in rank.items():
        tree = ast.parse((REPO / "lra" / "report" / f"{module}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "lra.report":
                    imported |= {a.name for a in node.names}
                elif node.module.startswith("lra.report."):
                    imported.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                imported |= {
                    a.name.split(".")[2] for a in node.names if a.name.startswith("lra.report.")
                }
        later = {m for m in imported if m in rank and rank[m] >= level and m != module}
        assert not later, f"lra.report.{module} imports {later}, which are not earlier in the chain"
        assert imported or module == "load", f"lra.report.{module}: no lra.report import seen"


def run_cli(*args, cwd):
    code = "from lra.report.main import report_main; report_main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


# Any import of JAX or its libraries fails in the child: the report must not need them.
NO_JAX = """
import importlib.abc, sys
class NoJax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError(f"{name} is blocked: lra-report must run without JAX")
sys.meta_path.insert(0, NoJax())
from lra.report.main import report_main
report_main()
"""


def test_report_runs_where_jax_cannot_be_imported(official, tmp_path):
    folder, _ = official
    args = [f"results_dir=[{folder}]", f"out_dir={tmp_path / 'o'}", "protocols=unspecified"]
    out = subprocess.run(
        [sys.executable, "-c", NO_JAX, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "o" / "leaderboard.md").is_file()
    blocked = subprocess.run(
        [sys.executable, "-c", NO_JAX.replace("from lra.report.main", "import jax\nfrom lra")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "is blocked" in blocked.stderr  # the blocker itself works


def test_cli_on_empty_results_dir_fails_clearly_then_reports(official, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_cli(f"results_dir={empty}", f"out_dir={tmp_path / 'o1'}", cwd=tmp_path)
    assert out.returncode == 2
    assert "no training records" in out.stderr and str(empty) in out.stderr
    assert "lra-train -m experiment=figure1" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o1").exists()

    folder, _ = official
    out = run_cli(
        f"results_dir=[{folder}]",
        f"out_dir={tmp_path / 'o2'}",
        "tasks=official",
        "protocols=unspecified",
        "since=2025-01-01",
        "until=2026-12-31",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o2" / "leaderboard.md").is_file() and "wrote " in out.stdout
    assert (tmp_path / "o2" / "figure1.png").is_file()
    assert not (tmp_path / "outputs").exists()  # no Hydra output folder
    filters = json.loads((tmp_path / "o2" / "sources.json").read_text())["filters"]
    assert filters["protocol"] == "unspecified" and filters["since"] == "2025-01-01"
