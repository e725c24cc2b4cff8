"""lra-plan (issue 40): a sweep's cells measured once each, their fit, projected wall time and
device-hours, without the data; the report's plan against the records; a sweep's progress."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN, train_small

from lra.config.sweep import group_cells, sweep_jobs
from lra.errors import ConfigError
from lra.plan import main as plan_main
from lra.plan.output import PLAN_FIELDS, totals, wall_seconds
from lra.plan.split_sizes import SPLIT_SIZES

ROOT = Path(__file__).resolve().parents[1]
# The plan's timing kept short: one warm-up step, one window of one step.
FAST = ["plan.warmup_steps=1", "plan.windows=1", "plan.steps_per_window=1"]


def _plan(tmp_path, *args, isolate=False):
    out = tmp_path / "plan"
    argv = [*args, *SMALL_RUN, f"results_dir={tmp_path / 'runs'}", f"out_dir={out}", *FAST]
    plan = plan_main.make_plan([*argv, f"plan.isolate={str(isolate).lower()}"])
    return plan, out


def test_sweep_expands_as_hydra_does_and_seeds_are_counted_not_measured():
    jobs = sweep_jobs(["experiment=figure1_tiny", "seed=0,1,2", "task=text_tiny,image_tiny"])
    assert len(jobs) == 11 * 2 * 3  # the experiment's 11 models; the command line's tasks
    cells = group_cells(jobs)
    assert len(cells) == 22 and all(c.seeds == [0, 1, 2] for c in cells)
    assert cells[0].name == "model=transformer task=text_tiny experiment=figure1_tiny"
    ranged = group_cells(sweep_jobs(["model=transformer,cosformer", "seed=range(2)"]))
    assert [(c.name, c.seeds) for c in ranged] == [
        ("model=transformer", [0, 1]),
        ("model=cosformer", [0, 1]),
    ]
    # Hydra's own settings (the launcher) and the folders are not part of a cell's name.
    launched = group_cells(sweep_jobs(["hydra/launcher=slurm", "results_dir=/x", "seed=3"]))
    assert [(c.name, c.seeds) for c in launched] == [("(defaults)", [3])]
    with pytest.raises(ConfigError, match="cannot read the sweep's overrides"):
        sweep_jobs(["model=transformer,,"])


def test_a_2x2_sweep_with_two_seeds_plans_4_cells_without_opening_data(tmp_path, monkeypatch):
    import lra.data.store
    import lra.data.tasks

    def no_data(*args, **kwargs):
        raise AssertionError("lra-plan opened task data")

    monkeypatch.setattr(lra.data.tasks, "load_task", no_data)
    monkeypatch.setattr(lra.data.store, "load_split", no_data, raising=False)
    missing = tmp_path / "no-data-here"
    plan, out = _plan(
        tmp_path,
        "model=transformer,cosformer",
        "task=listops_tiny,text_tiny",
        "seed=0,1",
        f"data_dir={missing}",
    )
    assert not missing.exists()
    assert plan["complete"] is True and plan["cells_planned"] == 4
    cells = plan["cells"]
    assert len(cells) == 4 and all(cell["seeds"] == [0, 1] for cell in cells)
    assert [(c["model"], c["task"]) for c in cells] == [
        ("transformer", "listops_tiny"),
        ("transformer", "text_tiny"),
        ("cosformer", "listops_tiny"),
        ("cosformer", "text_tiny"),
    ]
    written = json.loads((out / "plan.json").read_text())
    assert written["total_device_hours"] == pytest.approx(
        sum(c["device_hours"] for c in written["cells"])
    )
    for cell in written["cells"]:
        for key in PLAN_FIELDS:
            assert key in cell, key
        assert cell["fits"] is True and cell["steps_per_sec"] > 0
        assert 0 < cell["compiled_memory_bytes"] < cell["device_memory_bytes"]
        parts = cell["projected_parts"]
        assert parts["train"] == pytest.approx(4 / cell["steps_per_sec"])  # SMALL_RUN: 4 steps
        assert cell["projected_seconds"] == pytest.approx(
            sum(v for k, v in parts.items() if k != "total")
        )
        assert cell["device_hours"] == pytest.approx(2 * cell["projected_seconds"] / 3600)
        assert cell["stages"][0]["checkpoint_seconds"] > 0
    md = (out / "plan.md").read_text()
    assert "| model=cosformer task=text_tiny trainer.num_steps=4 " in md
    assert "device-hours over 8 runs" in md
    assert not list((tmp_path / "runs").glob("*"))  # no run folder, no checkpoint left behind


def test_a_cell_that_does_not_fit_is_marked_with_the_preflights_suggestion(tmp_path):
    # The small run's step needs about 3 MB; allow 2 (remat=true: only grad_accum is searched).
    plan, out = _plan(tmp_path, "task=listops_tiny", "trainer.remat=true", "memory_gb=0.002")
    (cell,) = plan["cells"]
    assert cell["fits"] is False and cell["projected_seconds"] is None
    assert "these overrides fit (compiled and measured): trainer.grad_accum=" in cell["advice"]
    assert plan["not_fitting"] == [cell["name"]]
    assert "Cells that do not fit (1)" in (out / "plan.md").read_text()
    fitting = cell["advice"].split("trainer.grad_accum=")[1].split(" ")[0]
    again, _ = _plan(
        tmp_path,
        "task=listops_tiny",
        "trainer.remat=true",
        f"trainer.grad_accum={fitting}",
        "memory_gb=0.002",
    )
    assert again["cells"][0]["fits"] is True and again["not_fitting"] == []


def test_a_self_pretraining_cell_is_both_stages_in_a_fresh_process(tmp_path):
    plan, _ = _plan(
        tmp_path,
        "task=listops_tiny",
        "pretrain=masked",
        "pretrain.num_steps=3",
        isolate=True,
    )
    (cell,) = plan["cells"]
    assert [s["stage"] for s in cell["stages"]] == ["pretrain", "finetune"]
    pretrain, finetune = (s["projected"] for s in cell["stages"])
    assert pretrain["test"] == 0 and finetune["test"] > 0  # pretraining never sees test
    assert pretrain["train"] == pytest.approx(3 / cell["stages"][0]["train_steps_per_sec"])
    assert cell["projected_seconds"] == pytest.approx(pretrain["total"] + finetune["total"])


def test_budget_and_wall_time_on_parallel_jobs():
    def cell(name, seconds, seeds=1, fits=True):
        hours = None if seconds is None else seconds * seeds / 3600
        return {
            "name": name,
            "seeds": list(range(seeds)),
            "fits": fits,
            "projected_seconds": seconds,
            "device_hours": hours,
        }

    cells = [cell("a", 3600, 2), cell("b", 1800), cell("c", None, fits=False), cell("d", 3600)]
    assert wall_seconds(cells, 1) == 3.5 * 3600
    # Two workers: a | a, then b on the first to free up, then d on the other.
    assert wall_seconds(cells, 2) == 2 * 3600
    assert wall_seconds(cells, 3) == 1.5 * 3600  # a | a | b, then d after b
    top = totals(cells, 2, budget_hours=2.6)
    assert top["total_device_hours"] == 3.5 and top["wall_hours"] == 2
    assert top["in_budget"] == ["a", "b"] and top["budget_device_hours"] == 2.5
    assert top["not_fitting"] == ["c"]
    assert [c["in_budget"] for c in cells] == [True, True, False, False]


def test_bad_plan_options_are_one_line_each():
    for arg, message in [
        ("jobs=two", "jobs takes a int"),
        ("budget_hours=-1", "budget_hours must be above 0"),
        ("plan.isolate=maybe", "plan.isolate takes a bool"),
    ]:
        with pytest.raises(ConfigError, match=message):
            plan_main.split_arguments([arg])
    options, overrides = plan_main.split_arguments(["jobs=4", "model=flash", "out_dir=x"])
    assert options["jobs"] == 4 and options["out_dir"] == "x" and overrides == ["model=flash"]


def test_split_sizes_agree_with_the_committed_tiny_records():
    seen = {}
    for path in (ROOT / "results" / "cpu-tiny" / "runs").glob("*/record.json"):
        record = json.loads(path.read_text())
        seen[record["task"]] = (record["split_sizes"]["val"], record["split_sizes"]["test"])
    assert len(seen) == 6
    for task, sizes in seen.items():
        assert SPLIT_SIZES[task] == sizes, task


def test_report_compares_the_plan_with_the_records(tmp_path, listops_tiny_dir):
    from lra.report.main import run_report

    common = ["task=listops_tiny", *SMALL_DATA, f"data_dir={listops_tiny_dir}"]
    plan, out = _plan(tmp_path, *common, "seed=0,1")
    results = tmp_path / "runs"
    for seed in (0, 1):
        train_small(listops_tiny_dir, results, f"seed={seed}")
    written = run_report(results, tmp_path / "report", tasks="tiny", figure=False, plan=out)
    assert tmp_path / "report" / "plan_check.md" in written
    (row,) = list(__import__("csv").DictReader((tmp_path / "report" / "plan_check.csv").open()))
    assert row["runs_found"] == "2" and row["seeds_planned"] == "2"
    assert float(row["train_ratio"]) > 0 and float(row["wall_ratio"]) > 0
    assert float(row["projected_train_seconds"]) == pytest.approx(
        plan["cells"][0]["projected_parts"]["train"]
    )
    md = (tmp_path / "report" / "plan_check.md").read_text()
    assert "over 1 cells" in md and "median" in md and "worst" in md
    with pytest.raises(ConfigError, match="no such file"):
        run_report(results, tmp_path / "r2", tasks="tiny", figure=False, plan=tmp_path / "nope")


def test_lra_plan_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "from lra.plan.main import plan_main; plan_main()", "jobs=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.strip() == "error: jobs=0: jobs must be above 0"
    assert not (tmp_path / "plan.json").exists()


def test_device_names_a_tpu_topology_and_libtpu_is_an_extra():
    import importlib.util

    from lra.plan.tpu import CHIPS, parse_device, roofline_seconds, tpu_devices

    assert parse_device("tpu:v5e:2x2") == ("v5e", "v5e:2x2")
    assert parse_device("tpu:v4:2x2x1") == ("v4", "v4:2x2x1")
    for bad in ("gpu:h100", "tpu:v9:2x2", "tpu:v5e"):
        with pytest.raises(ConfigError, match="device=tpu:<generation>:<topology>"):
            parse_device(bad)
    # The roofline: the slower of compute and HBM traffic, per device (a v4 chip is 2 devices).
    v5e = CHIPS["v5e"]
    assert roofline_seconds(197e12, 0.0, v5e, 1) == pytest.approx(1.0)
    assert roofline_seconds(1.0, 819e9, v5e, 1) == pytest.approx(1.0)
    assert roofline_seconds(275e12, 0.0, CHIPS["v4"], 2) == pytest.approx(2.0)
    if importlib.util.find_spec("libtpu") is None:  # the development install: no libtpu
        with pytest.raises(ConfigError, match=r"pip install 'lra-harness\[tpu-aot\]'"):
            tpu_devices("v5e:2x2")


def test_a_plan_cut_short_keeps_the_cells_it_measured_and_resumes(tmp_path, monkeypatch):
    from lra.record import store

    measured, interrupt = [], [True]

    def plan_cell(cell, options):  # the first cell measured, the second one never ends
        if measured and interrupt[0]:
            raise KeyboardInterrupt
        measured.append(cell.name)
        stage = {"stage": "train", "device": "cpu", "platform": "cpu", "device_count": 1}
        return {
            "name": cell.name,
            "overrides": cell.overrides,
            "seeds": cell.seeds,
            "steps_per_sec": 10.0,
            "compiled_memory_bytes": 2**20,
            "device_memory_bytes": 2**30,
            "fits": True,
            "projected_seconds": 36.0,
            "device_hours": 0.01 * len(cell.seeds),
            "stages": [stage],
        }

    monkeypatch.setattr(plan_main, "plan_cell", plan_cell)
    monkeypatch.setattr(store, "code_version", lambda: "v1")
    sweep = ["model=transformer,cosformer", f"out_dir={tmp_path}"]
    with pytest.raises(KeyboardInterrupt):
        plan_main.make_plan([*sweep, "seed=0,1"])
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["complete"] is False and plan["cells_planned"] == 2
    assert [c["name"] for c in plan["cells"]] == ["model=transformer"]
    assert plan["total_device_hours"] == pytest.approx(0.02)
    assert "**Incomplete: 1 of 2 cells planned**" in (tmp_path / "plan.md").read_text()

    # The rerun (three seeds now) measures only the cell the first one did not reach.
    interrupt[0] = False
    plan = plan_main.make_plan([*sweep, "seed=0,1,2"])
    assert measured == ["model=transformer", "model=cosformer"]
    assert plan["complete"] is True
    first, second = plan["cells"]
    assert first["reused"] is True and first["seeds"] == [0, 1, 2]
    assert first["device_hours"] == pytest.approx(36.0 * 3 / 3600)
    assert "reused" not in second
    # Another code version, other timing options, or plan.resume=false: all measured again.
    for argv, version in [([], "v2"), (["plan.resume=false"], "v2"), (["plan.windows=3"], "v2")]:
        monkeypatch.setattr(store, "code_version", lambda v=version: v)
        measured.clear()
        plan_main.make_plan([*sweep, "seed=0", *argv])
        assert measured == ["model=transformer", "model=cosformer"], argv


def _dies_by(config, options):  # a measurement whose process dies by options["signal"]
    import os
    import signal

    os.kill(os.getpid(), getattr(signal, options["signal"]))


def _refuses(config, options):
    raise ConfigError("a user error inside the measuring process")


def test_a_measuring_process_that_dies_is_reported_as_what_killed_it():
    from lra.plan.measure import measure_isolated

    crashed = measure_isolated({}, {"signal": "SIGSEGV"}, _dies_by)
    assert crashed["crashed"] is True and crashed["exitcode"] == -11 and not crashed["fits"]
    assert crashed["advice"].startswith("the measuring process crashed (SIGSEGV, twice)")
    killed = measure_isolated({}, {"signal": "SIGKILL"}, _dies_by)
    assert killed["crashed"] is False and "out of memory" in killed["advice"]
    with pytest.raises(ConfigError, match="a user error inside"):
        measure_isolated({}, {}, _refuses)
    entry = {"name": "a", "seeds": [0], **crashed, "device_hours": None, "projected_seconds": None}
    plan = totals([entry], 1, None)
    assert plan["crashed"] == ["a"] and plan["not_fitting"] == []


def test_a_plan_whose_first_cell_crashed_still_names_its_device():
    crashed = {
        "name": "a",
        "seeds": [0],
        "fits": False,
        "crashed": True,
        "projected_seconds": None,
        "device_hours": None,
        "stages": [{}],
    }
    fits = {
        "name": "b",
        "seeds": [0],
        "fits": True,
        "projected_seconds": 60.0,
        "device_hours": 1 / 60,
        "stages": [{"device": "TPU v5 lite", "platform": "tpu", "device_count": 4}],
    }
    options, _ = plan_main.split_arguments([])
    plan = plan_main._plan([], options, [crashed, fits], 2, "now", "v1", 0.0)
    assert plan["device"]["description"] == "TPU v5 lite" and plan["device"]["device_count"] == 4


# ---------------------------------------------------------------- tuning plans (lra-tune)


def test_a_tuning_plan_prices_each_seeds_study_and_is_lent_to_another_budget(tmp_path, monkeypatch):
    """``tune.n_trials=4 tune.final_seeds=2 seed=0,1``: two studies of 4 validation-only trials
    (no test pass) and 2 final runs each; a rerun at another budget re-prices the cell."""
    from lra.record import store

    monkeypatch.setattr(store, "code_version", lambda: "v1")  # the rerun may lend its cell
    sweep = ["task=listops_tiny", "seed=0,1", "tune.n_trials=4", "tune.final_seeds=2"]
    plan, out = _plan(tmp_path, *sweep, "tune.pruner=median")
    [cell] = plan["cells"]
    study, run = cell["tuning"], cell["projected_seconds"]
    parts = cell["projected_parts"]
    assert parts["test"] > 0  # a final run is an ordinary run, with its test pass
    assert study["trial_seconds"] == pytest.approx(run - parts["test"])
    assert study["study_seconds"] == pytest.approx(4 * study["trial_seconds"] + 2 * run)
    assert cell["device_hours"] == pytest.approx(2 * study["study_seconds"] / 3600)
    assert plan["runs"] == 2 * (4 + 2)
    assert plan["tune"] == {"n_trials": 4, "final_seeds": 2, "other": {"tune.pruner": "median"}}
    text = (out / "plan.md").read_text()
    assert (
        "| Per trial | Per study |" in text
        and "Tuning plan: each cell is one lra-tune study" in text
    )

    measured = []
    monkeypatch.setattr(plan_main, "plan_cell", lambda *a: measured.append(a) or {})
    again, _ = _plan(tmp_path, "task=listops_tiny", "seed=0", "tune.n_trials=8")
    [lent] = again["cells"]
    assert not measured and lent["reused"] is True
    assert lent["tuning"]["final_seeds"] == 3  # lra-tune's default
    assert lent["tuning"]["study_seconds"] == pytest.approx(8 * study["trial_seconds"] + 3 * run)
    plain, _ = _plan(tmp_path, "task=listops_tiny", "seed=0")  # a plain plan: lent as a run
    assert not measured and "tuning" not in plain["cells"][0] and plain["runs"] == 1
    assert plain["cells"][0]["device_hours"] == pytest.approx(run / 3600)


def test_a_tuning_plans_wall_time_runs_the_finals_after_the_last_trial():
    study = {"n_trials": 3, "final_seeds": 2, "trial_seconds": 3600, "final_seconds": 7200}
    cell = {"name": "a", "seeds": [0], "fits": True, "projected_seconds": 7200, "tuning": study}
    cell["device_hours"] = 7.0
    assert wall_seconds([cell], 1) == 7 * 3600
    # Two workers: trials 1 | 2, then 3 (ends at 2 h); the finals wait for it: 2-4 h | 2-4 h.
    assert wall_seconds([cell], 2) == 4 * 3600
    assert totals([cell], 2, None)["runs"] == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune.n_trial=4"], "tune.n_trial=4: lra-tune has no tune.n_trial"),
        (["tune.final_seeds=2"], "a tuning plan needs its budget, tune.n_trials=N"),
        (["tune.n_trials=0"], "tune.n_trials takes an int of at least 1"),
        (["tune.n_trials=4", "tune.final_seeds=-1"], "tune.final_seeds takes an int of at least 0"),
    ],
)
def test_bad_tuning_plan_options_are_one_line_each(args, message):
    with pytest.raises(ConfigError, match=message):
        plan_main.split_arguments(args)


def test_a_tuning_plan_refuses_self_pretraining_as_lra_tune_does(tmp_path):
    with pytest.raises(ConfigError, match="lra-tune tunes single-stage runs"):
        _plan(tmp_path, "task=listops_tiny", "pretrain=masked", "tune.n_trials=2")
    assert not (tmp_path / "plan" / "plan.json").exists()
