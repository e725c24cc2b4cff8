"""The lra-train and lra-data console scripts, run as a user would run them."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN

BIN = Path(sys.executable).parent


def cli(name, *args, cwd):
    script = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert script, f"{name} is not installed; run pip install -e '.[test]'"
    return subprocess.run(
        [str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def records_in(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_help_lists_the_config_groups(tmp_path):
    out = cli("lra-train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    for group in ("model:", "task:", "trainer:"):
        assert group in out.stdout


def test_lra_data_prepares_once(tmp_path):
    args = ["task=listops_tiny", f"data_dir={tmp_path / 'data'}", "num_workers=1", *SMALL_DATA]
    first = cli("lra-data", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    tsv_folder = tmp_path / "data" / "listops_tiny"
    folder = tmp_path / "data" / "prepared" / "listops_tiny"
    assert "listops_tiny data ready in " + str(folder) in first.stdout
    names = sorted(p.name for p in tsv_folder.iterdir())
    assert {"basic_train.tsv", "basic_val.tsv", "basic_test.tsv"} <= set(names)
    assert (folder / "meta.json").is_file() and (folder / "train.tokens0.npy").is_file()
    stamps = [
        (f / n).stat().st_mtime_ns
        for f, n in [(tsv_folder, "basic_train.tsv"), (folder, "meta.json")]
    ]
    second = cli("lra-data", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert [
        (f / n).stat().st_mtime_ns
        for f, n in [(tsv_folder, "basic_train.tsv"), (folder, "meta.json")]
    ] == stamps


def test_train_with_overrides_prints_summary_and_writes_record(listops_tiny_dir, tmp_path):
    out = cli(
        "lra-train",
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={tmp_path / 'records'}",
        "seed=5",
        *SMALL_DATA,
        *SMALL_RUN,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    [record] = records_in(tmp_path / "records")
    assert record["seed"] == 5 and record["config"]["trainer"]["num_steps"] == 4
    assert "test accuracy" in out.stdout and "steps/sec" in out.stdout
    assert str(tmp_path / "records") in out.stdout


def test_multirun_over_two_seeds_leaves_two_records(listops_tiny_dir, tmp_path):
    out = cli(
        "lra-train",
        "-m",
        "seed=0,1",
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={tmp_path / 'records'}",
        *SMALL_DATA,
        *SMALL_RUN,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(r["seed"] for r in records_in(tmp_path / "records")) == [0, 1]


@pytest.mark.parametrize("group", ["model", "task"])
def test_unknown_group_option_lists_the_available_ones(tmp_path, group):
    out = cli("lra-train", f"{group}=no_such_thing", cwd=tmp_path)
    assert out.returncode != 0
    assert f"Could not find '{group}/no_such_thing'" in out.stderr
    assert "Available options" in out.stderr


def test_missing_data_prints_the_lra_data_command(tmp_path):
    out = cli("lra-train", f"data_dir={tmp_path / 'nothing'}", cwd=tmp_path)
    assert out.returncode == 2
    assert f"lra-data task=listops_tiny data_dir={tmp_path / 'nothing'}" in out.stderr
    assert "Traceback" not in out.stderr


def test_malformed_tsv_row_names_file_and_line(listops_tiny_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(listops_tiny_dir, data)
    shutil.rmtree(data / "prepared")  # read the TSVs as they are, as from an official archive
    val = data / "listops_tiny" / "basic_val.tsv"
    lines = val.read_text().splitlines()
    lines[3] = "( [MAX 2 9 ] )\tnot-a-label"
    val.write_text("\n".join(lines) + "\n")
    out = cli("lra-train", f"data_dir={data}", f"results_dir={tmp_path / 'r'}", cwd=tmp_path)
    assert out.returncode == 2
    assert str(val) in out.stderr and "line 4" in out.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())


def test_unwritable_results_dir_is_one_clear_error(listops_tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = cli(
        "lra-train", f"data_dir={listops_tiny_dir}", f"results_dir={blocker / 'r'}", cwd=tmp_path
    )
    assert out.returncode == 2
    assert "not writable" in out.stderr and "results_dir=" in out.stderr
    assert "Traceback" not in out.stderr
