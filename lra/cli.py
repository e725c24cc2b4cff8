"""Command-line entry points: ``lra-train``, ``lra-data``, ``lra-bench``, ``lra-eval``,
``lra-smoke`` (Hydra apps) and ``lra-check-attention`` (plain arguments: one mechanism).

``lra-train`` and ``lra-data`` compose ``configs/config.yaml``, ``lra-bench``
composes ``configs/bench.yaml``, each with the ``model``, ``task`` and
``trainer`` groups, so every override (``task=listops``, ``seed=3``,
``trainer.num_steps=10``, ``data_dir=...``) and Hydra's ``--help`` and ``-m``
(multirun) work the same way in all of them; ``lra-eval`` composes
``configs/eval.yaml``. Before an app starts, the command line's config is
checked against the typed schema (:mod:`lra.config.schema`): an unknown key, a
value of the wrong type or a missing value is one ``error:`` line and exit
status 2, before Hydra, JAX or any data starts; each app checks its job's config
again (in a sweep, a failing job's row). A user-facing error (:class:`LRAError`) prints one line,
``error: <what is wrong and what to do>``, and exits with status 2; a run stopped
by a signal prints one line saying how to resume and exits with 128 + the
signal number; a second Ctrl-C exits at once with 130. In ``lra-train -m`` a
failing job is written down and the sweep goes on (:mod:`lra.run.sweep`).
"""

import argparse
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from lra.config import schema

# lra.run.cluster and lra.device.measure import JAX: they are imported where used, so that
# the config check (lra.config.schema) answers before JAX is even imported.
from lra.config.compose import CONFIG_DIR
from lra.run import sweep
from lra.run.exit_status import report_errors
from lra.run.signals import rerun_command, terminate_raises_interrupt

log = logging.getLogger("lra.cli")


def _mib(num_bytes) -> str:
    return "n/a" if num_bytes is None else f"{num_bytes / 2**20:.1f} MiB"


def _rate(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _accuracy_line(record: dict) -> str:
    selected = (
        f"val {record['val_accuracy']:.4f} at step {record['selected_step']}, "
        f"selection={record['selection']}"
    )
    if record.get("test_accuracy") is None:  # trainer.evaluate_test=false: validation only
        return f"  val accuracy    {record['val_accuracy']:.4f}  ({selected}; no test pass)"
    return (
        f"  test accuracy   {record['test_accuracy']:.4f}  "
        f"({selected}; majority class {record['test_majority_rate']:.4f})"
    )


def summarize(record: dict) -> str:
    """The lines ``lra-train`` prints at the end of a run."""
    return "\n".join(
        [
            f"{record['model']} on {record['task']} (seed {record['seed']}, {record['device']})",
            _accuracy_line(record),
            f"  train steps/sec {_rate(record['train_steps_per_sec'])}   "
            f"eval steps/sec {_rate(record['eval_steps_per_sec'])}",
            f"  peak memory     {_mib(record['peak_memory_bytes'])} ({record['memory_source']})",
            f"  record          {record['record_path']}",
        ]
        + (
            [f"  pretraining     {record['pretrain_record_path']} (init {record['init']['kind']})"]
            if record.get("pretrain_record_path")
            else []
        )
    )


def _on_own_gpu(train):
    """``train``, preceded by taking this process's own GPU under the joblib launcher
    (:func:`lra.run.cluster.pin_local_gpu`, before JAX starts); a failure is the job's row."""

    def job(cfg):
        from lra.run import cluster

        cluster.pin_local_gpu()
        return train(cfg)

    return job


def _checked(train):
    """``train``, preceded by checking the job's config against the schema (a sweep job's
    schema error is its failed row, like any other user error of the job)."""

    def job(cfg):
        schema.validate(cfg)
        return train(cfg)

    return job


def _train(cfg):
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if not multirun:
        schema.validate(cfg)
    from lra.train.loop import train_and_evaluate

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # no TPU-probe noise
    if multirun:
        return sweep.run_job(cfg, _checked(_on_own_gpu(train_and_evaluate)), summarize)
    record = train_and_evaluate(cfg)
    log.info(summarize(record))
    return record.get("test_accuracy", record.get("val_accuracy"))


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _data(cfg):
    schema.validate(cfg)
    from lra.data.tasks import prepare_task, resolve_data_dir

    data_dir = resolve_data_dir(cfg.data_dir)
    with terminate_raises_interrupt():  # SIGTERM stops the generators' workers like Ctrl-C
        folder = prepare_task(
            cfg.task, data_dir, num_workers=cfg.get("num_workers"), rebuild=bool(cfg.rebuild)
        )
    print(f"{cfg.task.name} data ready in {folder} ({_mib(_folder_bytes(folder))})", flush=True)


def bench_line(record: dict) -> str:
    """One line per benchmarked length, as ``lra-bench`` prints it."""
    head = f"{record['model']} L={record['length']} B={record['batch_size']}"
    if record["status"] != "ok":
        return f"{head}: {record['status'].upper()} ({record.get('error', '')})"
    return (
        f"{head}: train {_rate(record.get('train_steps_per_sec'))} steps/s, "
        f"eval {_rate(record.get('eval_steps_per_sec'))} steps/s, "
        f"memory {_mib(record['peak_memory_bytes'])} ({record['memory_source']}), "
        f"{(record.get('flops_per_step') or 0) / 1e9:.1f} GFLOP/step"
    )


def _bench(cfg):
    schema.validate(cfg)
    from lra.measure.bench import run_benchmark

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    run_benchmark(cfg, on_record=lambda record: print(bench_line(record), flush=True))


def _eval(cfg):
    schema.validate(cfg)
    from lra.train.evaluate import evaluate_run

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    out = evaluate_run(cfg.run, cfg.split, cfg.checkpoint, cfg.data_dir)
    which = "best-validation parameters" if out["best"] else "parameters"
    print(f"{cfg.run}: {which} of the checkpoint at step {out['step']}", file=sys.stderr)
    print(f"{out['split']} accuracy {out['accuracy']:.4f}", flush=True)
    written, same = out["predictions"], out["predictions"]["same_as_run"]
    agrees = {True: ", the same as the run's", False: ", NOT the run's", None: ""}[same]
    print(f"predictions: {written['file']} (SHA-256 {written['sha256'][:12]}...{agrees})")


def _smoke(cfg):
    schema.validate(cfg)
    from lra.measure.smoke import run_smoke

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if any(r.problem is not None for r in run_smoke(cfg)):
        sys.exit(1)


def _app(config_name: str, body):
    """The Hydra app that composes ``configs/<config_name>.yaml`` and runs ``body(cfg)`` in
    the error wrapper (:func:`lra.run.exit_status.report_errors`)."""

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def app(cfg):
        return report_errors(body, cfg)

    return app


_train_app = _app("config", _train)
_data_app = _app("config", _data)
_bench_app = _app("bench", _bench)
_eval_app = _app("eval", _eval)
_smoke_app = _app("smoke", _smoke)


def _configure_cpu_memory_analysis():
    from lra.device import measure

    measure.configure_cpu_memory_analysis()


def train_main():
    """``lra-train``: train and evaluate one model on one task, write a record.

    After a sweep (``-m``) with a failed job, exits with status 1.
    """
    schema.check_command_line("config")
    _configure_cpu_memory_analysis()
    try:
        _train_app()
    except KeyboardInterrupt:  # the second Ctrl-C
        print(
            "interrupted: stopped at once; rerun the same command to resume from the last "
            f"checkpoint: {rerun_command()}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(130)  # at once: do not wait for background threads
    if sweep.failed_jobs:
        sys.exit(1)


def eval_main():
    """``lra-eval``: evaluate the saved model of a run folder on one split."""
    schema.check_command_line("eval")
    _configure_cpu_memory_analysis()  # XLA's flags as lra-train's: the same program, same logits
    _eval_app()


def smoke_main():
    """``lra-smoke``: a few training steps of each chosen model on each tiny task, as a table;
    exits 1 if a loss is not finite or listops_tiny does not beat its majority class."""
    schema.check_command_line("smoke")
    _configure_cpu_memory_analysis()
    _smoke_app()


def data_main():
    """``lra-data``: prepare the data of one task into ``data_dir``."""
    schema.check_command_line("config")
    try:
        _data_app()
    except KeyboardInterrupt:
        print(
            "interrupted: finished work is kept; rerun the same command to go on: "
            f"{rerun_command()}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(130)


def bench_main():
    """``lra-bench``: speed and memory of one model over sequence lengths, as records."""
    schema.check_command_line("bench")
    _configure_cpu_memory_analysis()
    _bench_app()


def _option(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option takes KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(v) for v in text.split(","))
    except ValueError:
        lengths = ()
    if len(lengths) < 2 or any(n < 2 for n in lengths) or len(set(lengths)) != len(lengths):
        raise argparse.ArgumentTypeError(
            f"--lengths takes two or more different comma-separated lengths, got {text!r}"
        )
    return lengths


def _check_all_attention(lengths, out: Path | None) -> int:
    from lra.atomic import write_atomic
    from lra.measure import conformance_table
    from lra.models import ATTENTION_NAMES

    def show(line):
        print(line, flush=True)

    for line in conformance_table.HEAD:
        show(line)
    text, passed = conformance_table.conformance_table(ATTENTION_NAMES, lengths, on_row=show)
    if out is not None:
        write_atomic(out, conformance_table.preamble(lengths) + text)
        print(f"wrote {out}", flush=True)
    return 0 if passed else 1


def check_attention_main(argv=None):
    """``lra-check-attention NAME_OR_PATH``: the conformance checks of one mechanism.

    Prints one line per check and exits 0 if none failed, 1 if one did, 2 if the mechanism
    cannot be loaded (unknown name, import error, wrong signature, name clash). With
    ``--all``: one table row per built-in mechanism (:mod:`lra.measure.conformance_table`),
    also written to ``--out``; exits 1 if any mechanism fails.
    """
    from lra.measure import conformance
    from lra.models import RegistryError

    parser = argparse.ArgumentParser(
        prog="lra-check-attention",
        description=check_attention_main.__doc__.splitlines()[0].split(": ", 1)[1],
        epilog="examples: lra-check-attention performer; "
        "lra-check-attention my_pkg.attention:MyAttention --option num_features=64; "
        "lra-check-attention --all --out results/cpu/conformance.md",
    )
    parser.add_argument(
        "mechanism",
        nargs="?",
        help="a built-in name, a name installed through the lra.attention entry point, "
        "or an import path package.module:ClassName",
    )
    parser.add_argument(
        "--all", action="store_true", help="every built-in mechanism, as one markdown table"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="with --all: also write the table to this file"
    )
    parser.add_argument(
        "--option",
        action="append",
        type=_option,
        default=[],
        metavar="KEY=VALUE",
        help="an option of the mechanism's constructor (YAML value); repeat for more",
    )
    parser.add_argument(
        "--lengths",
        type=_lengths,
        default=conformance.MEMORY_LENGTHS,
        help="sequence lengths of the memory-class check (default: 1024,2048,4096)",
    )
    args = parser.parse_args(argv)
    if args.all == (args.mechanism is not None):
        parser.error("give one mechanism or --all")
    if args.all and args.option:
        parser.error("--option applies to one mechanism, not to --all")
    if args.out and not args.all:
        parser.error("--out writes the table of --all")
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if args.all:
        sys.exit(_check_all_attention(args.lengths, args.out))
    try:
        report = conformance.check_attention(
            args.mechanism, dict(args.option), memory_lengths=args.lengths
        )
    except RegistryError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(report.text(), flush=True)
    sys.exit(0 if report.passed else 1)
