"""Sweeps that finish: one job's failure is written down and the sweep goes on.

In ``lra-train -m``, :func:`run_job` wraps each job: a user error or an exception
is logged (the message, and for an unexpected exception its traceback, land in
Hydra's per-job log file) and the job returns a ``failed`` row instead of raising,
so the remaining jobs still run. Every job writes its row to ``job_status.json``
in its Hydra job folder, whichever launcher ran it.

:class:`SweepSummary`, a Hydra callback (``hydra.callbacks`` in ``config.yaml``),
collects the rows when the sweep ends, prints a table (model, task, seed, status,
test accuracy, steps/s, record), writes it as ``summary.md`` and ``summary.json``
into the sweep folder, and records the number of failed jobs, which makes
``lra-train -m`` exit non-zero. After each job a line gives the sweep's progress: jobs ended
out of the total, device-hours spent and an ETA (:mod:`lra.run.progress`).

A job stopped by a signal saves its checkpoint, writes an ``interrupted`` row and
ends the whole sweep (the scheduler wants the process gone); rerunning the sweep
command skips finished runs and resumes the interrupted one.

On SLURM (``hydra/launcher=slurm``) the launching process follows its jobs with
:func:`lra.run.cluster.follow_slurm_jobs`: one line each time their states change
(pending, running, requeued, done, failed), and ``squeue`` where ``sacct`` does not work.
A job that ends there without a result (``scancel``, a time limit, out of memory, ...) is
handed over by :func:`lra.run.cluster.end_jobs_with_rows` (:data:`cluster_ends`) and
becomes its row, ``cancelled`` or ``failed``, with one line: what happened, the SLURM job
id, and that rerunning the same command resumes it. Every row that is not ``done`` or
``skipped`` makes ``lra-train -m`` exit 1.
"""

import json
import logging
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback

from lra.atomic import write_atomic
from lra.errors import LRAError
from lra.run import progress
from lra.run.signals import Interrupted, rerun_command

STATUS_FILE = "job_status.json"
COLUMNS = ("job", "model", "task", "seed", "status", "test_accuracy", "steps_per_sec", "record")
log = logging.getLogger("lra.run.sweep")

#: Jobs of the last sweep that ended in this process neither done nor skipped (read by
#: ``lra-train``, which then exits 1).
failed_jobs = 0
#: Jobs of the running sweep that ended on the cluster without a result, by job number:
#: (``lra.run.cluster.ClusterEnd``: ``state``, ``slurm_job``, ``reason``, ``log``;
#: the job's overrides).
cluster_ends: dict = {}


def _row(cfg, status: str, record: dict | None = None, error: str = "") -> dict:
    hydra = HydraConfig.get()
    record = record or {}
    return {
        "job": int(hydra.job.num),
        "model": cfg.model.name,
        "task": cfg.task.name,
        "seed": int(cfg.seed),
        "status": status,
        "test_accuracy": record.get("test_accuracy"),
        "steps_per_sec": record.get("train_steps_per_sec"),
        "record": record.get("record_path", ""),
        "error": error,
        "overrides": list(hydra.overrides.task),
    }


def _write_row(row: dict) -> None:
    folder = Path(HydraConfig.get().runtime.output_dir)
    write_atomic(folder / STATUS_FILE, json.dumps(row, indent=2) + "\n")
    sweep_dir = HydraConfig.get().sweep.dir
    if note := progress.line(sweep_dir, read_rows(Path(sweep_dir))):
        log.info(note)


def read_rows(sweep_dir: Path) -> list[dict]:
    """The rows the sweep's jobs have written so far, by job number."""
    rows = {}
    for path in sweep_dir.glob(f"*/{STATUS_FILE}"):
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # written atomically: only an unreadable disk gets here
        rows[row["job"]] = row
    return [rows[job] for job in sorted(rows)]


def run_job(cfg, train, summarize) -> dict:
    """Run one sweep job with ``train(cfg) -> record``; return (and write) its status row."""
    try:
        record = train(cfg)
    except Interrupted as err:
        log.error(f"interrupted: {err}: {rerun_command()}")
        _write_row(_row(cfg, "interrupted", error=str(err)))
        err.hand_over()  # submitit's requeue, now that the checkpoint is saved
        raise SystemExit(err.exit_code) from None
    except LRAError as err:
        log.error(f"error: {err}")
        row = _row(cfg, "failed", error=str(err))
    except Exception as err:  # any other failure of this job must not end the sweep
        log.error(f"job failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
        row = _row(cfg, "failed", error=f"{type(err).__name__}: {str(err).splitlines()[0]}")
    else:
        log.info(summarize(record))
        row = _row(cfg, "skipped" if record.get("skipped") else "done", record)
    _write_row(row)
    return row


def _override(overrides: list[str], key: str):
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key]
    return values[-1] if values else None


def cluster_end_row(job: int, end, row: dict | None, overrides: list[str]) -> dict:
    """The row of sweep job ``job`` that ended on the cluster without a result (``end``, a
    ``ClusterEnd``), from the row the job wrote, if it did (``interrupted``: it saved a
    checkpoint on a signal), else from its ``overrides``; its error is one line."""
    if end.state == "CANCELLED":
        what = f"SLURM job {end.slurm_job} was cancelled"
    elif end.reason:
        what = f"SLURM job {end.slurm_job} failed ({end.reason})"
    else:
        what = f"SLURM job {end.slurm_job} ended {end.state}"
    if row is not None and row.get("status") in ("done", "skipped", "failed"):
        return row  # it finished (or failed) before SLURM ended it: its own row says it
    if row is not None and row.get("status") == "interrupted":
        error = f"{what}: {row['error']}"  # "stopped by ... at step N; checkpoint saved ..."
    else:
        seed = _override(overrides, "seed") or ""
        row = {
            "job": job,
            "model": _override(overrides, "model"),
            "task": _override(overrides, "task"),
            "seed": int(seed) if seed.isdigit() else None,
            "test_accuracy": None,
            "steps_per_sec": None,
            "record": "",
            "overrides": list(overrides),
        }
        error = (
            f"{what} (log: {end.log}); rerun the same command to resume it (from its last "
            "checkpoint, if it saved one)"
        )
    status = "cancelled" if end.state == "CANCELLED" else "failed"
    return {**row, "status": status, "error": error}


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def summary_table(rows: list[dict]) -> str:
    """The sweep's rows as a markdown table, then one line per failed job's error."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |" for row in rows]
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    lines.append("")
    lines.append(", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ".")
    lines += [f"job {row['job']} ({row['status']}): {row['error']}" for row in rows if row["error"]]
    return "\n".join(lines) + "\n"


class SweepSummary(Callback):
    """Prints and stores the table of a multirun's jobs; counts the failed ones."""

    def _rows(self, sweep_dir: Path) -> list[dict]:
        rows = {row["job"]: row for row in read_rows(sweep_dir)}
        for job, (end, overrides) in cluster_ends.items():
            rows[job] = cluster_end_row(job, end, rows.get(job), overrides)
        return [rows[job] for job in sorted(rows)]

    def on_multirun_start(self, config, **kwargs) -> None:
        from lra.run.cluster import follow_slurm_jobs  # imports JAX: only for a sweep

        cluster_ends.clear()
        follow_slurm_jobs(config.hydra)  # SLURM: a quiet job watcher that shows the states
        for stale in Path(config.hydra.sweep.dir).glob(f"*/{STATUS_FILE}"):
            stale.unlink()  # rows of an earlier sweep into the same folder
        progress.start(config.hydra.sweep.dir, list(config.hydra.overrides.task))

    def on_multirun_end(self, config, **kwargs) -> None:
        global failed_jobs
        sweep_dir = Path(config.hydra.sweep.dir)
        if str(config.hydra.launcher.get("_target_", "")).endswith("SlurmLauncher"):
            from lra.run.cluster import show_final_slurm_states

            show_final_slurm_states()
        rows = self._rows(sweep_dir)
        table = summary_table(rows)
        write_atomic(sweep_dir / "summary.md", table)
        write_atomic(sweep_dir / "summary.json", json.dumps(rows, indent=2) + "\n")
        failed_jobs = sum(row["status"] not in ("done", "skipped") for row in rows)
        print(f"\nsweep summary ({sweep_dir / 'summary.md'}):\n{table}", flush=True)
