"""``lra-tune`` (issue 39): equal budgets on the validation split, a study shared by workers.

All on the small listops_tiny run of conftest (a few steps of a one-layer model): a 4-trial
study in this process, two processes on one study, a worker killed mid-trial, the storages
(journal, SQLite, PostgreSQL where CI starts one) and two workers as SLURM jobs.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SLURM, SMALL_DATA, SMALL_RUN
from hydra import compose, initialize_config_dir

from lra.config.compose import CONFIG_DIR
from lra.errors import ConfigError

optuna = pytest.importorskip("optuna")

BIN = Path(sys.executable).parent
TINY = ["task=listops_tiny", *SMALL_DATA, *SMALL_RUN]


def tune_config(data_dir, results_dir, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(
            config_name="tune",
            overrides=[*TINY, f"data_dir={data_dir}", f"results_dir={results_dir}", *overrides],
        )


def run_tune(data_dir, results_dir, *overrides: str) -> dict:
    from lra.tune.main import tune

    return tune(tune_config(data_dir, results_dir, *overrides))


def lra_tune(data_dir, results_dir, *overrides: str, background=False, cwd=None):
    command = [
        str(BIN / "lra-tune"),
        *TINY,
        f"data_dir={data_dir}",
        f"results_dir={results_dir}",
        *overrides,
    ]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    if background:
        return subprocess.Popen(command, cwd=cwd or results_dir, start_new_session=True, **pipes)
    return subprocess.run(command, cwd=cwd or results_dir, timeout=600, **pipes)


def journal_study(results_dir: Path):
    [journal] = (results_dir / "tune").glob("*.journal")
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    [summary] = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def records(results_dir: Path, kind: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*/record.json"))]
    return [r for r in found if r["kind"] == kind]


def budget_trials(study) -> list:
    return [t for t in study.get_trials() if not t.user_attrs.get("over_budget")]


# ---------------------------------------------------------------- one study, in this process


@pytest.fixture(scope="module")
def four_trials(listops_tiny_dir, tmp_path_factory):
    """A 4-trial study with one final seed; the names of the data files it opened."""
    import lra.data.store as data_store

    results = tmp_path_factory.mktemp("tuned")
    opened = []
    load = np.load

    def guarded(path, *args, **kw):
        opened.append(Path(path).name)
        if Path(path).name.startswith("test.") and not final_runs_started:
            raise PermissionError(f"a trial opened the test split: {path}")
        return load(path, *args, **kw)

    final_runs_started = False
    import lra.tune.final as final

    run_finals = final.run_finals

    def finals_marked(*args, **kw):
        nonlocal final_runs_started
        final_runs_started = True
        opened.append("<finals>")
        return run_finals(*args, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(data_store.np, "load", guarded)
    mp.setattr(final, "run_finals", finals_marked)
    try:
        result = run_tune(listops_tiny_dir, results, "tune.n_trials=4", "tune.final_seeds=1")
    finally:
        mp.undo()
    return results, result, opened


def test_a_4_trial_study_runs_4_trials_and_picks_the_best_by_validation_accuracy(four_trials):
    results, result, _ = four_trials
    study = journal_study(results)
    trials = budget_trials(study)
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    trial_records = {r["run_dir"]: r for r in records(results, "trial")}
    assert len(trial_records) == 4
    for t in trials:  # each trial's value is its run's selected validation accuracy
        assert t.value == trial_records[t.user_attrs["run_dir"]]["val_accuracy"]
    best = max(trials, key=lambda t: (t.value, -t.number))
    assert result["best"]["trial"] == best.number and result["best"]["value"] == best.value
    assert result["completed"] == 4 and result["pruned"] == result["failed"] == 0
    curve = [c["best"] for c in result["curve"]]
    assert curve == list(np.maximum.accumulate([t.value for t in trials]))


def test_trials_never_see_test(four_trials):
    results, _, opened = four_trials
    before_finals = opened[: opened.index("<finals>")]
    assert any(name.startswith("train.") for name in before_finals)
    assert any(name.startswith("val.") for name in before_finals)
    assert not any(name.startswith("test.") for name in before_finals)
    for record in records(results, "trial"):
        assert not [k for k in record if k.startswith("test")], record["run_key"]
        assert set(record["split_sizes"]) == {"train", "val"}
        assert set(record["predictions"]) == {"val"}
        assert record["config"]["trainer"]["evaluate_test"] is False


def test_the_final_runs_carry_the_tuning_block(four_trials):
    results, result, _ = four_trials
    [final] = records(results, "train")
    tuning = final["tuning"]
    assert tuning["study"] == result["study"] and tuning["n_trials"] == 4
    assert (tuning["completed"], tuning["pruned"], tuning["failed"]) == (4, 0, 0)
    assert tuning["best_value"] == result["best"]["value"]
    assert tuning["best_params"] == result["best"]["params"]
    assert tuning["search_hash"] == result["settings"]["search_hash"]
    assert tuning["storage"].endswith(".journal")
    assert final["variant"] == "transformer+tuned[n_trials=4]"
    assert final["protocol"] == "lra_official" and final["test_accuracy"] is not None
    for key, value in tuning["best_params"].items():  # the final run trained the chosen values
        node = final["config"]
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    # The best trial's run, retrained with its seed and a test pass: the same validation.
    assert final["val_accuracy"] == result["best"]["value"]


def test_a_finished_study_trains_nothing_when_rerun(four_trials, listops_tiny_dir):
    results, first, _ = four_trials
    before = sorted(p.stat().st_mtime_ns for p in results.glob("*/checkpoints/*"))
    again = run_tune(listops_tiny_dir, results, "tune.n_trials=4", "tune.final_seeds=1")
    assert again["best"] == first["best"] and again["finals"] == first["finals"]
    assert len(budget_trials(journal_study(results))) == 4
    assert sorted(p.stat().st_mtime_ns for p in results.glob("*/checkpoints/*")) == before


def test_a_study_file_names_the_trials_and_the_finals(four_trials):
    results, result, _ = four_trials
    path = Path(result["path"])
    data = json.loads(path.read_text())
    assert path.name == f"{result['study']}.study.json"
    assert [t["number"] for t in data["trials"]] == [0, 1, 2, 3]
    assert len(data["finals"]) == 1 and data["finals"][0]["test_accuracy"] is not None


# ---------------------------------------------------------------- pruning, and the study file


# Two learning rates too small to move the model off its start (it validates the same at every
# step) and three that, with no warm-up, throw its first step far off: on the grid, in the
# order tune.seed=0 shuffles it (0.3, 1e-9, 2e-9, 1.0, 3.0), the last two start below the
# median of the finished trials.
PRUNING_SPACE = """\
trainer.learning_rate:
  choices: [1.0e-9, 2.0e-9, 0.3, 1.0, 3.0]
  grid: [1.0e-9, 2.0e-9, 0.3, 1.0, 3.0]
trainer.warmup_steps: {value: 0}
"""


def pruned_study(data_dir, results: Path, *pruning: str) -> tuple[object, list[dict]]:
    """The 5-point grid of PRUNING_SPACE as a 5-trial study validating at each of 4 steps,
    under ``pruner``; the study, and what its study file held each time it was written."""
    import lra.tune.worker as worker

    seen, write = [], worker.write_summary

    def watched(*args, **kw):
        path, data = write(*args, **kw)
        seen.append(json.loads(Path(path).read_text()))  # what is on disk, not what was meant
        return path, data

    space = results / "pruning-space.yaml"
    space.parent.mkdir(parents=True, exist_ok=True)
    space.write_text(PRUNING_SPACE)
    mp = pytest.MonkeyPatch()
    mp.setattr(worker, "write_summary", watched)
    try:
        run_tune(
            data_dir,
            results,
            "tune.n_trials=5",
            "tune.final_seeds=0",
            "tune.sampler=grid",
            "tune.seed=0",
            f"tune.search={space}",
            *pruning,
            "trainer.eval_every=1",
        )
    finally:
        mp.undo()
    return journal_study(results), seen


@pytest.fixture(scope="module")
def median_pruned(listops_tiny_dir, tmp_path_factory):
    results = tmp_path_factory.mktemp("median")
    pruning = ["tune.pruner=median", "tune.prune_startup_trials=2", "tune.prune_warmup=0.5"]
    return results, *pruned_study(listops_tiny_dir, results, *pruning)


def _stopped_where_pruned(trial, num_steps: int = 4) -> None:
    """A pruned trial's run stopped at its last report: no later step trained, no record."""
    folder = Path(trial.user_attrs["run_dir"])
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").open()]
    last = max(trial.intermediate_values)
    assert last < num_steps or trial.state.name == "COMPLETE"
    assert max(steps) == last, (trial.number, steps, last)
    assert not (folder / "record.json").exists()


def test_the_median_pruner_prunes_below_the_median_of_finished_trials(median_pruned):
    """Optuna's rule, recomputed: after 2 finished trials (tune.prune_startup_trials) and from
    step 2 of 4 on (tune.prune_warmup=0.5), a trial whose best validation accuracy so far is
    below the median of the finished trials' accuracies at that step is pruned."""
    _, study, _ = median_pruned
    trials = budget_trials(study)
    assert len(trials) == 5
    finished: list[dict] = []
    for t in sorted(trials, key=lambda t: t.number):
        expected = None  # the step it should be pruned at
        for step in sorted(t.intermediate_values):
            best = max(v for s, v in t.intermediate_values.items() if s <= step)
            at_step = [f[step] for f in finished if step in f]
            ready = len(finished) >= 2 and step >= 2
            if ready and at_step and best < np.percentile(at_step, 50):
                expected = step
                break
        if expected is None:
            assert t.state.name == "COMPLETE", (t.number, t.intermediate_values, finished)
            assert sorted(t.intermediate_values) == [1, 2, 3, 4]
            finished.append(dict(t.intermediate_values))
        else:
            assert t.state.name == "PRUNED", (t.number, t.intermediate_values, finished)
            assert max(t.intermediate_values) == expected
            _stopped_where_pruned(t)
    assert sum(t.state.name == "PRUNED" for t in trials) >= 1, "no trial was pruned"


def test_the_grid_sampler_tries_each_point_once_and_ends_with_the_budget(median_pruned):
    _, study, _ = median_pruned
    tried = [t.user_attrs["overrides"]["trainer.learning_rate"] for t in budget_trials(study)]
    assert sorted(tried) == [1e-9, 2e-9, 0.3, 1.0, 3.0]


def test_the_hyperband_pruner_stops_trials_early(listops_tiny_dir, tmp_path):
    study, _ = pruned_study(
        listops_tiny_dir, tmp_path, "tune.pruner=hyperband", "tune.prune_warmup=0"
    )
    assert study.user_attrs["settings"]["pruner"] == "hyperband"
    trials = budget_trials(study)
    assert len(trials) == 5
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert pruned, [t.intermediate_values for t in trials]
    for t in pruned:
        _stopped_where_pruned(t)
    for t in trials:
        if t.state.name == "COMPLETE":
            assert sorted(t.intermediate_values) == [1, 2, 3, 4]


def test_the_study_file_is_rewritten_after_every_trial(median_pruned):
    results, study, seen = median_pruned
    trials = sorted(budget_trials(study), key=lambda t: t.number)
    assert [len(s["trials"]) for s in seen] == [1, 2, 3, 4, 5]  # one write per trial ended
    for n, snapshot in enumerate(seen):  # each write: the trials ended so far, as they ended
        assert [t["state"] for t in snapshot["trials"]] == [t.state.name for t in trials[: n + 1]]
        assert snapshot["pruned"] == sum(t.state.name == "PRUNED" for t in trials[: n + 1])
    [path] = (results / "tune").glob("*.study.json")
    assert json.loads(path.read_text()) == seen[-1]


# ---------------------------------------------------------------- the search space


def test_every_shipped_search_space_respects_the_schema():
    from lra.tune.search import load_space

    models = {  # protocol=authors has the state-space mixers' own settings only
        "lra_official": ("transformer", "transnormer_t2", "s4d", "s5", "lru", "mamba"),
        "transnormer": ("transformer", "transnormer_t2", "s4d", "s5", "lru", "mamba"),
        "authors": ("s4d", "s5", "lru"),
    }
    for protocol, names in models.items():
        for model in names:
            with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
                cfg = compose("config", [f"model={model}", "task=listops", f"protocol={protocol}"])
            space = load_space("auto", cfg)  # raises on a key or range the schema refuses
            keys = set(space.searched_keys)
            assert {"trainer.learning_rate", "trainer.weight_decay", "task.arch.dropout"} <= keys
            if model in ("s4d", "s5", "mamba"):
                assert any(k.startswith("trainer.param_groups.ssm") for k in keys), model


def test_suggested_values_stay_in_their_ranges(listops_tiny_dir, tmp_path):
    from lra.tune.main import context
    from lra.tune.search import suggest

    ctx = context(tune_config(listops_tiny_dir, tmp_path, "model=s4d"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    lr = ctx.base["trainer"]["learning_rate"]
    for _ in range(20):
        values = suggest(study.ask(), ctx.space)
        assert 0.1 * lr <= values["trainer.learning_rate"] <= 10 * lr
        assert 0.0 <= values["task.arch.dropout"] == values["task.arch.attention_dropout"] <= 0.3
        assert 0 <= values["trainer.warmup_steps"] <= round(0.2 * ctx.base["trainer"]["num_steps"])
        assert 1e-4 <= values["trainer.param_groups.ssm.learning_rate"] <= 1e-2
        assert values["trainer.param_groups.ssm.weight_decay"] == 0.0


def test_a_trial_draws_its_values_by_its_number_whoever_asks_first(listops_tiny_dir, tmp_path):
    """Two workers asking at once (two trials RUNNING before either draws) draw two settings, and
    trial k draws the same values however the asks interleave."""
    from lra.tune.main import context
    from lra.tune.worker import draw

    def asked(folder: Path, count: int):
        ctx = context(tune_config(listops_tiny_dir, folder, "tune.sampler=random"))
        return ctx, [ctx.study.ask() for _ in range(count)]

    ctx, (first, second) = asked(tmp_path / "together", 2)
    late = draw(ctx, ctx.study, second)  # the second asker draws first
    early = draw(ctx, ctx.study, first)
    assert early != late
    alone_ctx, (alone,) = asked(tmp_path / "alone", 1)
    assert draw(alone_ctx, alone_ctx.study, alone) == early


def _search_file(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return f"tune.search={path}"


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("tune.n_trials=0", "tune.n_trials: expected an int"),
        (
            "tune.storage=sqlite:////no/such/dir/x.db",
            "tune.storage=sqlite:////no/such/dir/x.db: cannot open",
        ),
        ("tune.sampler=grid tune.n_trials=30", "tune.n_trials=30 exceeds the grid's 24 points"),
    ],
)
def test_bad_input_is_one_line_before_any_trial(listops_tiny_dir, tmp_path, override, words):
    out = lra_tune(listops_tiny_dir, tmp_path, *override.split())
    assert out.returncode == 2, out.stdout
    [line] = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    assert words in line
    assert not list(tmp_path.glob("*/record.json")) and not list(tmp_path.glob("*/config.json"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("trainer.learning_rat: {low: 0.001, high: 0.1}\n", "is not a config key of the harness"),
        (
            "task.arch.dropout: {low: 0.0, high: 1.5}\n",
            "task.arch.dropout=1.5 (an end of its range) breaks the schema",
        ),
        (
            "trainer.learning_rate: {low: 0.0, high: 0.1, log: true}\n",
            "a log range needs low above 0",
        ),
    ],
)
def test_a_bad_search_space_is_one_line(listops_tiny_dir, tmp_path, text, words):
    from lra.tune.main import context

    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        context(tune_config(listops_tiny_dir, tmp_path, _search_file(tmp_path, text)))


# ---------------------------------------------------------------- workers and storages


def test_two_processes_on_one_study_run_4_trials_in_all(listops_tiny_dir, tmp_path):
    procs = [
        lra_tune(
            listops_tiny_dir, tmp_path, "tune.n_trials=4", "tune.final_seeds=1", background=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    trials = budget_trials(journal_study(tmp_path))
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == 4  # none trained twice
    assert len(records(tmp_path, "trial")) == 4 and len(records(tmp_path, "train")) == 1
    workers = {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2, workers  # both took trials


def test_a_worker_killed_mid_trial_then_rerun_completes_4_trials_none_twice(
    listops_tiny_dir, tmp_path
):
    slow = ["trainer.num_steps=200", "trainer.eval_every=100", "trainer.checkpoint_every=20"]
    proc = lra_tune(
        listops_tiny_dir, tmp_path, "tune.n_trials=4", "tune.final_seeds=0", *slow, background=True
    )
    deadline = time.monotonic() + 300

    def mid_trial() -> Path | None:  # a trial's run folder with a checkpoint and no record
        for folder in tmp_path.glob("*-s0-*"):
            saved = folder / "checkpoints"
            steps = [p for p in saved.iterdir() if p.name.isdigit()] if saved.is_dir() else []
            if steps and not (folder / "record.json").exists():  # a finished save: its step
                return folder
        return None

    while (folder := mid_trial()) is None:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no trial got to a checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    study = journal_study(tmp_path)
    assert [t.state.name for t in budget_trials(study)].count("RUNNING") == 1
    out = lra_tune(listops_tiny_dir, tmp_path, "tune.n_trials=4", "tune.final_seeds=0", *slow)
    assert out.returncode == 0, out.stdout
    assert "its worker is gone; resuming its run folder" in out.stdout
    trials = budget_trials(journal_study(tmp_path))
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == 4
    resumed = json.loads((folder / "record.json").read_text())
    assert resumed["resumed_from"], "the killed trial was trained again from step 0"


def test_a_sqlite_storage_holds_the_study(listops_tiny_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    result = run_tune(
        listops_tiny_dir, tmp_path, "tune.n_trials=2", "tune.final_seeds=0", f"tune.storage={url}"
    )
    study = optuna.load_study(study_name=result["study"], storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert result["storage"] == url and not list((tmp_path / "tune").glob("*.journal"))


def test_a_postgresql_storage_holds_the_study(listops_tiny_dir, tmp_path):
    url = os.environ.get("LRA_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "CI starts PostgreSQL (scripts/postgres_local.sh) and sets LRA_TEST_POSTGRES_URL"
            )
        pytest.skip(
            "no PostgreSQL here: sudo bash scripts/postgres_local.sh starts one and "
            "prints the LRA_TEST_POSTGRES_URL to set"
        )
    name = f"pg-{os.getpid()}-{time.time_ns()}"
    result = run_tune(
        listops_tiny_dir,
        tmp_path,
        "tune.n_trials=2",
        "tune.final_seeds=0",
        f"tune.storage={url}",
        f"tune.study={name}",
    )
    study = optuna.load_study(study_name=name, storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert result["completed"] == 2


# ---------------------------------------------------------------- SLURM


@pytest.mark.xdist_group("slurm")
@pytest.mark.usefixtures("slurm_node")
def test_two_slurm_workers_share_one_study(listops_tiny_dir, tmp_path):
    """``lra-tune -m hydra/launcher=slurm tune.worker=0,1``: two SLURM jobs on one study."""
    records_dir = tmp_path / "records"
    command = [
        str(BIN / "lra-tune"),
        "-m",
        *SLURM,
        *TINY,
        f"data_dir={listops_tiny_dir}",
        f"results_dir={records_dir}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "trainer.num_steps=100",
        "trainer.eval_every=50",
        "tune.n_trials=4",
        "tune.final_seeds=1",
        "tune.worker=0,1",
    ]
    env = {**os.environ, "LRA_SLURM_POLL_S": "1"}
    out = subprocess.run(
        command, cwd=tmp_path, env=env, timeout=600, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    trials = budget_trials(journal_study(records_dir))
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == 4  # none trained twice
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both jobs took trials
    assert len(records(records_dir, "train")) == 1  # the final run, trained once
    rows = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/job_status.json")]
    assert sorted(r["status"] for r in rows) in (["done", "done"], ["done", "skipped"])


def test_missing_data_stops_the_worker_and_spends_no_trial(listops_tiny_dir, tmp_path):
    from lra.errors import DataError

    one = ["tune.n_trials=1", "tune.final_seeds=0"]
    with pytest.raises(DataError, match="prepare it with: lra-data task=listops_tiny"):
        run_tune(tmp_path / "no-data", tmp_path, *one)
    study = journal_study(tmp_path)
    assert [t.state.name for t in study.trials] == ["RUNNING"]  # not FAIL: the budget is kept
    result = run_tune(listops_tiny_dir, tmp_path, *one)  # the same study: data_dir is no setting
    assert result["completed"] == 1 and result["failed"] == 0
    assert [t.state.name for t in journal_study(tmp_path).trials] == ["COMPLETE"]
