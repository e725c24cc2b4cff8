"""``lra-report``: the leaderboard, efficiency tables, Figure 1 and learning curves from the
records, written into one folder. This module only orchestrates; the work runs one way:

* load (:mod:`lra.report.load`): read the records from ``results_dir`` (one folder or a
  list, default ``[results/runs, results/bench]``), fill in what older records lack, apply
  the filters (``models``, ``settings``, ``protocol`` (config key ``protocols``),
  ``since``/``until``);
* aggregate, pure data: :mod:`lra.report.leaderboard` (one table per protocol, one row per
  setting, the parameter budget), :mod:`lra.report.efficiency` (benchmark tables),
  :mod:`lra.report.figure_data` (Figure 1's points);
* render: :mod:`lra.report.tables` (``leaderboard.{md,csv}``, ``efficiency.md``,
  ``sources.json``), :mod:`lra.report.figure` (``figure1.{png,svg,md}``), :mod:`lra.report.curves`
  (``curves.{png,svg}``).

Everything that can fail (no training records, no benchmark record for Figure 1's x axis,
a filter that keeps nothing) fails before any file is written, with an error that names
the folder and the command that makes the missing records.

A report covers either the official tasks or their tiny CPU variants
(``tasks="official"|"tiny"``; ``"auto"`` picks official when training records on official
tasks exist). Tiny-task numbers are labelled as such everywhere.
"""

import json
import sys
from pathlib import Path

from lra.atomic import write_atomic
from lra.config.compose import CONFIG_DIR
from lra.report.curves import learning_curves, write_curves
from lra.report.efficiency import efficiency
from lra.report.figure import draw_figure1, write_figure1
from lra.report.figure_data import DEFAULT_LENGTH, figure1_data
from lra.report.leaderboard import leaderboards
from lra.report.load import (
    common_root,
    describe_dirs,
    filter_records,
    load_records,
    require_train_records,
    resolve_task_set,
    results_dirs,
)
from lra.report.tables import efficiency_markdown, leaderboard_csv, leaderboard_markdown, sources
from lra.run.exit_status import report_errors

__all__ = ["CONFIG_DIR", "report_main", "run_report"]


def run_report(
    results_dir=None,
    out_dir="results",
    tasks: str = "auto",
    figure_length: int = DEFAULT_LENGTH,
    reference_csv=None,
    show_reference: bool = True,
    models=None,
    curves: bool = True,
    *,
    settings=None,
    protocol=None,
    since=None,
    until=None,
    figure: bool = True,
) -> list[Path]:
    """Read ``results_dir`` and write every report file into ``out_dir``; return their paths.

    ``results_dir``: a folder or a list of folders (None: ``results/runs`` and
    ``results/bench``). Filters (None keeps all): ``models`` (model names), ``settings``
    (setting hashes or variant names), ``protocol`` (a name or a list), ``since``/``until``
    (ISO dates, inclusive, against ``started_at``). ``figure`` draws Figure 1 (then
    benchmark records at ``figure_length`` are required); ``curves`` draws the learning
    curves, printing a note per record skipped.
    """
    folders = results_dirs(results_dir)
    records = filter_records(
        load_records(folders),
        models=models,
        settings=settings,
        protocol=protocol,
        since=since,
        until=until,
        where=f"results_dir {describe_dirs(folders)}",
    )
    task_set = resolve_task_set(records, tasks)
    require_train_records(records, folders, task_set)
    boards = leaderboards(records, task_set)
    tables = efficiency(records)
    fig = None
    if figure:
        reference = reference_csv if show_reference else None
        data = figure1_data(boards, tables, length=figure_length, reference_csv=reference)
        fig = draw_figure1(data)
    found = [learning_curves(lb) for lb in boards] if curves else []

    root = common_root(folders)
    out = Path(out_dir)
    written = [
        write_atomic(out / "leaderboard.md", leaderboard_markdown(boards)),
        write_atomic(out / "leaderboard.csv", leaderboard_csv(boards)),
        write_atomic(out / "efficiency.md", efficiency_markdown(tables, boards[0].tiny)),
    ]
    if fig is not None:
        written += write_figure1(fig, out)
    trace = sources(boards, tables, fig, root)
    for lb, learned in zip(boards, found, strict=False):
        stem = "curves" if len(boards) == 1 else f"curves_{lb.protocol}"
        written += write_curves(learned, out, stem)
        for note in learned.notes(root):
            print(note, flush=True)
    if found:
        traces = {lb.protocol: c.trace(root) for lb, c in zip(boards, found, strict=True)}
        trace["curves"] = next(iter(traces.values())) if len(traces) == 1 else traces
    trace["results_dir"] = [str(f) for f in folders]
    trace["filters"] = {
        "tasks": task_set,
        "models": models,
        "settings": settings,
        "protocol": protocol,
        "since": since,
        "until": until,
    }
    text = json.dumps(trace, indent=2, sort_keys=True, default=str)
    written.append(write_atomic(out / "sources.json", text + "\n"))
    return written


def _plain(value):
    """A config value as plain Python (lists for ListConfig), None for null/empty."""
    if value is None:
        return None
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return value if value != "" else None


def _report(cfg) -> None:
    for path in run_report(
        _plain(cfg.get("results_dir")),
        cfg.out_dir,
        tasks=str(cfg.tasks),
        figure_length=int(cfg.figure_length),
        reference_csv=cfg.reference_csv,
        show_reference=bool(cfg.show_reference),
        models=_plain(cfg.get("models")) or None,
        curves=bool(cfg.get("curves", True)),
        settings=_plain(cfg.get("settings")) or None,
        protocol=_plain(cfg.get("protocols")),
        since=_plain(cfg.get("since")),
        until=_plain(cfg.get("until")),
        figure=bool(cfg.get("figure", True)),
    ):
        print(f"wrote {path}", flush=True)


def _checked_report(cfg) -> None:
    from lra.config import schema

    schema.validate(cfg)
    _report(cfg)


def report_main():
    """``lra-report``: leaderboard, efficiency table, Figure 1 and sources from the store."""
    import hydra

    taken = [a for a in sys.argv[1:] if a.split("=")[0].lstrip("+~") == "protocol"]
    if taken:
        print(
            f"error: {taken[0]}: the protocol filter of lra-report is protocols=<name> "
            "(protocol=... names the config group configs/protocol/ to Hydra)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)

    from lra.config import schema

    schema.check_command_line("report")

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="report")
    def _report_app(cfg):
        return report_errors(_checked_report, cfg)

    _report_app()
