"""The report (leaderboard, efficiency, Figure 1, sources) from records with known values."""

import csv
import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lra import figure, report
from lra.errors import ConfigError
from lra.results import read_records, write_record

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
OFFICIAL = report.OFFICIAL_TASKS


def train(model, task, seed, acc, started="2026-01-01T00:00:00+00:00", version="v1"):
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
    }


def bench(model, length, speed=None, eval_speed=None, memory=None, status="ok", task="text"):
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
    }
    if status == "ok":
        record.update(
            train_steps_per_sec=speed,
            train_steps_per_sec_windows=[speed, speed],
            eval_steps_per_sec=eval_speed,
            eval_steps_per_sec_windows=[eval_speed],
            peak_memory_bytes=memory,
            memory_source="device_peak_bytes_in_use",
        )
    return record


def store(tmp_path, records):
    folder = tmp_path / "runs"
    for r in records:
        write_record(r, folder)
    return folder, read_records(folder)


def full_row(model, accs, seed=0):
    return [train(model, t, seed, a) for t, a in zip(OFFICIAL, accs, strict=True)]


@pytest.fixture
def official(tmp_path):
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


def test_leaderboard_means_stds_counts_and_empty_cells(official):
    _, records = official
    lb = report.leaderboard(records)
    assert lb.task_set == "official" and lb.tasks == OFFICIAL and lb.pathx == "pathx"
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
    assert [r.model for r in lb.rows] == ["cosformer", "transformer", "performer"]

    rows = list(csv.DictReader(io.StringIO(report.leaderboard_csv(lb))))
    by_model = {r["model"]: r for r in rows}
    assert float(by_model["transformer"]["listops_mean"]) == pytest.approx(60.0)
    assert float(by_model["transformer"]["listops_std"]) == pytest.approx(10.0)
    assert by_model["transformer"]["listops_n"] == "3"
    assert by_model["transformer"]["text_std"] == ""
    assert float(by_model["transformer"]["lra_average"]) == pytest.approx(60.0)
    assert by_model["performer"]["image_mean"] == by_model["performer"]["image_n"] == ""
    assert by_model["performer"]["lra_average"] == ""
    assert by_model["cosformer"]["pathx_mean"] == ""
    assert float(by_model["transformer"]["pathx_mean"]) == pytest.approx(50.0)

    md = report.leaderboard_markdown(lb)
    assert "60.00 ± 10.00 (n=3)" in md
    assert "1 older record(s)" in md and "†" in md
    perf_line = next(line for line in md.splitlines() if line.startswith("| performer"))
    cells = [c.strip() for c in perf_line.strip("|").split("|")]
    assert cells[4] == "" and cells[6] == "" and cells[7] == ""  # image, average, Path-X
    assert " 0.00" not in perf_line


def test_task_set_auto_and_tiny_labels(tmp_path):
    _, records = store(tmp_path, [train("transformer", "listops_tiny", 0, 0.5)])
    lb = report.leaderboard(records)
    assert lb.task_set == "tiny" and lb.tasks[0] == "listops_tiny"
    assert report.TINY_NOTE in report.leaderboard_markdown(lb)
    assert "tiny_average" in report.leaderboard_csv(lb)
    assert report.leaderboard(records, "official").rows == []
    with pytest.raises(ConfigError):
        report.leaderboard(records, "everything")


def test_efficiency_relative_to_transformer_and_oom(official):
    _, records = official
    [table] = report.efficiency(records)
    assert table.lengths == [1024, 2048] and table.models[0] == "transformer"
    assert table.relative("performer", 1024, "train_steps_per_sec") == pytest.approx(2.5)
    assert table.relative("performer", 1024, "eval_steps_per_sec") == pytest.approx(1.5)
    assert table.relative("performer", 1024, "peak_memory_bytes") == pytest.approx(0.5)
    assert table.status("transformer", 2048) == "oom"
    assert table.relative("performer", 2048, "train_steps_per_sec") is None
    md = report.efficiency_markdown([table])
    assert "| transformer | 10.00 | OOM |" in md
    assert "25.00 (2.50x)" in md and "30.00 (1.50x)" in md and "50.0 (0.50)" in md
    assert "NVIDIA H200" in md and "batch size 20" in md and "fp32" in md
    assert "device_peak_bytes_in_use" in md
    assert table.slope("performer") == pytest.approx(1.0)  # 50 -> 100 MiB over 1024 -> 2048


def test_memory_slope_recovers_power_laws(tmp_path):
    lengths = [256, 512, 1024, 2048, 4096]
    assert report.memory_slope(lengths, [3e3 * n for n in lengths]) == pytest.approx(1.0)
    assert report.memory_slope(lengths, [7.0 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert report.memory_slope([1024], [5.0]) is None
    _, records = store(
        tmp_path,
        [bench("linear", n, 1.0, 1.0, 1000 * n) for n in lengths]
        + [bench("quadratic", n, 1.0, 1.0, 3 * n * n) for n in lengths[:-1]]
        + [bench("quadratic", 4096, status="oom")],
    )
    [table] = report.efficiency(records)
    assert table.slope("linear") == pytest.approx(1.0)
    assert table.slope("quadratic") == pytest.approx(2.0)


def write_reference(path):
    rows = [
        ("transformer", "Transformer", "57.37", "15.34", "1K", "", "paper"),
        ("flash", "FLASH", "61.31", "20.49", "1K", "", "paper"),
        ("cosformer", "cosFormer", "62.11", "", "", "", "paper"),
    ]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "model",
                "paper_label",
                "lra_average",
                "train_steps_per_sec",
                "speed_length",
                "peak_memory_mb",
                "source",
            ]
        )
        writer.writerows(rows)
    return path


def collection(fig, gid):
    return next(c for c in fig.axes[0].collections if c.get_gid() == gid)


def test_figure1_one_circle_per_model_missing_listed_and_reference(official, tmp_path):
    _, records = official
    lb, tables = report.leaderboard(records), report.efficiency(records)
    ref = write_reference(tmp_path / "ref.csv")
    fig1 = figure.figure1(lb, tables, length=2048, reference_csv=ref)
    assert fig1.labels == ["cosformer"]  # the only model with both a score and a speed at 2048
    assert len(collection(fig1.figure, "measured").get_offsets()) == 1
    assert "OOM at length 2048" in fig1.missing["transformer"]
    assert "no LRA average" in fig1.missing["performer"]
    assert "no training records" in fig1.missing["linformer"]
    assert len(collection(fig1.figure, "reference").get_offsets()) == 2
    assert "cosFormer" in fig1.caption  # paper row without a speed, named as not drawn
    for model in ("transformer", "performer", "linformer"):
        assert model in fig1.caption

    fig2 = figure.figure1(lb, tables, length=1024)
    assert sorted(fig2.labels) == ["transformer"]
    assert not [c for c in fig2.figure.axes[0].collections if c.get_gid() == "reference"]
    point = fig2.points[0]
    assert (point.x, point.y, point.memory_bytes) == (10.0, pytest.approx(60.0), 100 * MIB)

    out = tmp_path / "out"
    paths = figure.write_figure1(fig1, out)
    png, svg = out / "figure1.png", out / "figure1.svg"
    assert png in paths and svg in paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    texts = " ".join(el.text or "" for el in ET.parse(svg).getroot().iter())
    assert "cosformer" in texts and "Transformer" in texts  # measured and paper labels


def test_figure1_tiny_uses_common_tasks(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops_tiny", 0, 0.5),
            train("transformer", "text_tiny", 0, 0.7),
            train("performer", "listops_tiny", 0, 0.4),
            bench("transformer", 512, 5.0, 9.0, 4 * MIB, task="listops_tiny"),
            bench("performer", 512, 6.0, 9.0, 2 * MIB, task="listops_tiny"),
        ],
    )
    lb, tables = report.leaderboard(records), report.efficiency(records)
    fig1 = figure.figure1(lb, tables, length=512, reference_csv=tmp_path / "absent.csv")
    ys = {p.model: p.y for p in fig1.points}
    assert ys == {"transformer": pytest.approx(50.0), "performer": pytest.approx(40.0)}
    assert "listops_tiny" in fig1.y_label and "text_tiny" not in fig1.y_label
    assert report.TINY_NOTE in fig1.y_label and report.TINY_NOTE in fig1.caption
    assert len(collection(fig1.figure, "measured").get_offsets()) == 2


def test_run_report_writes_everything_with_sources(official, tmp_path):
    folder, records = official
    out = tmp_path / "report"
    ref = write_reference(tmp_path / "ref.csv")
    paths = report.run_report(folder, out, figure_length=2048, reference_csv=ref)
    names = {p.name for p in paths}
    assert names == {
        "leaderboard.md",
        "leaderboard.csv",
        "efficiency.md",
        "figure1.png",
        "figure1.svg",
        "figure1.md",
        "sources.json",
    }
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    trace = json.loads((out / "sources.json").read_text())
    files = {Path(r["path"]).name for r in records}
    cell = trace["leaderboard"]["transformer"]["listops"]
    assert len(cell["records"]) == 3 and set(cell["records"]) <= files
    assert cell["seeds"] == [0, 1, 2] and cell["code_versions"] == ["v1"]
    assert len(trace["leaderboard"]["performer"]["text"]["superseded"]) == 1
    eff = trace["efficiency"][0]["cells"]["performer"]["1024"]
    assert eff["records"][0] in files and eff["status"] == "ok"
    assert trace["figure1"]["points"]["cosformer"]["x_record"] in files
    assert set(trace["figure1"]["points"]["cosformer"]["y_records"]) <= files


def test_reference_csvs_name_a_source_for_every_row():
    rows = figure.read_reference_csv(REPO / "results/reference/figure1_paper.csv")
    assert len(rows) == 11 and all(r["source"] for r in rows)
    drawn = [r["model"] for r in rows if r["lra_average"] and r["train_steps_per_sec"]]
    assert drawn == ["transformer", "flash", "transnormer_t2"]
    with open(REPO / "results/reference/lra_paper_scores.csv", newline="") as handle:
        scores = list(csv.DictReader(handle))
    assert scores and all(r["source"] for r in scores)


def test_report_config_lives_beside_lra_trains():
    from lra.cli import CONFIG_DIR

    assert report.CONFIG_DIR == CONFIG_DIR and (Path(CONFIG_DIR) / "report.yaml").is_file()


def run_cli(*args, cwd):
    code = "from lra.report import report_main; report_main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cli_on_empty_results_dir_fails_clearly_then_reports(official, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_cli(f"results_dir={empty}", f"out_dir={tmp_path / 'o1'}", cwd=tmp_path)
    assert out.returncode == 2
    assert "no training or benchmark records" in out.stderr and str(empty) in out.stderr
    assert "lra-train" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o1").exists()

    folder, _ = official
    out = run_cli(
        f"results_dir={folder}", f"out_dir={tmp_path / 'o2'}", "tasks=official", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o2" / "leaderboard.md").is_file() and "wrote " in out.stdout
    assert not (tmp_path / "outputs").exists()  # no Hydra output folder


def test_models_filter_keeps_only_the_named_models(tmp_path):
    store = tmp_path / "store"
    for model, seed in [("transformer", 0), ("performer", 0), ("local", 0)]:
        write_record(train(model, "listops_tiny", seed, 0.5), store)
    report.run_report(store, tmp_path / "out", tasks="tiny", models=["transformer", "performer"])
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "transformer" in board and "performer" in board and "| local |" not in board
    with pytest.raises(ConfigError, match="no records of the models"):
        report.run_report(store, tmp_path / "out2", tasks="tiny", models=["reformer"])
