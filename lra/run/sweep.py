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
``lra-train -m`` exit non-zero.

A job stopped by a signal saves its checkpoint, writes an ``interrupted`` row and
ends the whole sweep (the scheduler wants the process gone); rerunning the sweep
command skips finished runs and resumes the interrupted one.

On SLURM (``hydra/launcher=slurm``) the launching process follows its jobs with
:func:`lra.run.cluster.follow_slurm_jobs`: one line each time their states change
(pending, running, requeued, done, failed), and ``squeue`` where ``sacct`` does not work.
"""

import json
import logging
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback

from lra.atomic import write_atomic
from lra.errors import LRAError
from lra.run.signals import Interrupted, rerun_command

STATUS_FILE = "job_status.json"
COLUMNS = ("job", "model", "task", "seed", "status", "test_accuracy", "steps_per_sec", "record")
log = logging.getLogger("lra.run.sweep")

#: Failed jobs of the last sweep that ended in this process (read by ``lra-train``).
failed_jobs = 0


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
        rows = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{STATUS_FILE}")]
        return sorted(rows, key=lambda row: row["job"])

    def on_multirun_start(self, config, **kwargs) -> None:
        from lra.run.cluster import follow_slurm_jobs  # imports JAX: only for a sweep

        follow_slurm_jobs(config.hydra)  # SLURM: a quiet job watcher that shows the states
        for stale in Path(config.hydra.sweep.dir).glob(f"*/{STATUS_FILE}"):
            stale.unlink()  # rows of an earlier sweep into the same folder

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
        failed_jobs = sum(row["status"] == "failed" for row in rows)
        print(f"\nsweep summary ({sweep_dir / 'summary.md'}):\n{table}", flush=True)
