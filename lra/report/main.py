"""``lra-report``: the leaderboard, efficiency tables, Figure 1 and learning curves from the
records, written into one folder. This module only orchestrates; the work runs one way:

* load (:mod:`lra.report.load`): read the records from ``results_dir`` (one folder or a
  list, default ``[results/runs, results/bench]``), fill in what older records lack, apply
  the filters (``models``, ``settings``, ``protocol`` (config key ``protocols``),
  ``since``/``until``);
* aggregate, pure data: :mod:`lra.report.leaderboard` (one table per protocol, one row per
  setting, the parameter budget), :mod:`lra.report.efficiency` (benchmark tables),
  :mod:`lra.report.figure_data` (Figure 1's points);
* compare, pure data: :mod:`lra.report.compare` (the published numbers beside the
  leaderboard, :mod:`lra.report.published`'s data), :mod:`lra.report.table2` (the LRA
  paper's Table 2 form);
* render: :mod:`lra.report.tables` (``leaderboard.{md,csv}``, ``efficiency.{md,csv}``,
  ``sources.json``), :mod:`lra.report.latex` (``leaderboard.tex``, ``efficiency.tex``),
  :mod:`lra.report.figure` (``figure1.{png,svg,pdf,md}``), :mod:`lra.report.curves`
  (``curves.{png,svg,pdf}``), :mod:`lra.report.tuning` (``tuning.{md,csv}`` and the
  equal-budget figure ``tuning.{png,svg,pdf}`` from ``lra-tune``'s ``*.study.json`` files
  in the results folders; written only when such a file exists; the figure not with
  ``figure=false``).

What cannot be reported at all (no training records, a filter that keeps nothing) fails
before any file is written, with an error that names the folder and the command that makes
the missing records. Figure 1 (``figure``): ``auto`` (the default) draws it when benchmark
records allow, and otherwise writes everything else and prints what the figure lacks and
the ``lra-bench`` command that makes it; ``true`` makes that an error (exit status 2,
nothing written); ``false`` never draws it.

A report covers either the official tasks or their tiny CPU variants
(``tasks="official"|"tiny"``; ``"auto"`` picks official when training records on official
tasks exist). Tiny-task numbers are labelled as such everywhere.
"""

import json
import sys
from pathlib import Path

from lra.atomic import write_atomic
from lra.config.compose import CONFIG_DIR
from lra.errors import ConfigError, DataError
from lra.report import uncertainty
from lra.report.compare import compare, published_points
from lra.report.curves import learning_curves, write_curves
from lra.report.efficiency import efficiency
from lra.report.figure import draw_figure1, write_figure1
from lra.report.figure_data import DEFAULT_LENGTH, figure1_data
from lra.report.latex import efficiency_latex, leaderboard_latex
from lra.report.leaderboard import leaderboards
from lra.report.load import (
    common_root,
    describe_dirs,
    filter_records,
    load_records,
    relative_to_root,
    require_train_records,
    resolve_task_set,
    results_dirs,
)
from lra.report.plan_check import load_plan, plan_check, plan_check_csv, plan_check_markdown
from lra.report.profiles import write_profiles
from lra.report.published import load_published
from lra.report.stats import BOOTSTRAP_RESAMPLES
from lra.report.stats_tables import pairwise_csv
from lra.report.table2 import table2
from lra.report.tables import (
    efficiency_csv,
    efficiency_markdown,
    leaderboard_csv,
    leaderboard_markdown,
    sources,
)
from lra.report.tuning import load_studies, tuning_csv, tuning_markdown, write_tuning_figure
from lra.run.exit_status import report_errors

__all__ = ["CONFIG_DIR", "report_main", "run_report"]
FIGURE_CHOICES = ("auto", True, False)


def figure_choice(value) -> str | bool:
    """``figure`` as ``"auto"``, True (required) or False (never); strings as Hydra gives them."""
    text = str(value).strip().lower()
    choice = {"auto": "auto", "true": True, "false": False}.get(text)
    if choice is None:
        raise ConfigError(f"figure={value!r}: one of auto, true (required), false (never)")
    return choice


def run_report(
    results_dir=None,
    out_dir="results",
    tasks: str = "auto",
    figure_length: int = DEFAULT_LENGTH,
    show_published: bool = True,
    models=None,
    curves: bool = True,
    *,
    settings=None,
    protocol=None,
    since=None,
    until=None,
    figure: str | bool = "auto",
    published_dir=None,
    reference: str | None = None,
    resolve_points: float = 1.0,
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
    plan=None,
) -> list[Path]:
    """Read ``results_dir`` and write every report file into ``out_dir``; return their paths.

    ``results_dir``: a folder or a list of folders (None: ``results/runs`` and
    ``results/bench``). Filters (None keeps all): ``models`` (model names), ``settings``
    (setting hashes or variant names), ``protocol`` (a name or a list), ``since``/``until``
    (ISO dates, inclusive, against ``started_at``). ``figure``: ``"auto"`` draws Figure 1
    when the records allow it and otherwise prints what it lacks and the ``lra-bench``
    command that makes it; True requires it (an error, nothing written, when it cannot be
    drawn); False never draws it. ``curves`` draws the learning curves, printing a note per
    record skipped. ``published_dir``: the folder of published-results YAML files (None: the
    package's, :mod:`lra.report.published`); ``show_published`` draws their points in Figure 1.
    Statistics (:mod:`lra.report.uncertainty`, from the runs' per-example predictions):
    ``reference`` is the row every model is compared with (None: the Transformer),
    ``resolve_points`` the difference the seeds-needed table is for, ``bootstrap_resamples``
    the bootstrap's replicates; ``pairwise.csv`` and ``profiles.{png,svg,pdf}`` are written
    with the leaderboard. ``plan``: an ``lra-plan`` plan.json (or its folder) whose projections
    are compared with the records (:mod:`lra.report.plan_check`: ``plan_check.{md,csv}``).
    ``lra-tune``'s studies (``*.study.json`` in the results folders, the ``models`` and
    ``protocol`` filters applied) give ``tuning.{md,csv}`` and, unless ``figure`` is False,
    ``tuning.{png,svg,pdf}`` (:mod:`lra.report.tuning`); no study, no tuning file.
    """
    figure = figure_choice(figure)
    planned = None if plan is None else load_plan(plan)  # a bad plan fails before any write
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
    studies = load_studies(folders, models=models, protocols=protocol)
    task_set = resolve_task_set(records, tasks)
    require_train_records(records, folders, task_set)
    boards = leaderboards(records, task_set)
    board_stats = [
        uncertainty.board_stats(
            lb,
            reference=reference,
            resolve_points=resolve_points,
            n_resamples=bootstrap_resamples,
        )
        for lb in boards
    ]
    tables = efficiency(records)
    scores, published_efficiency = load_published(published_dir)
    comparisons = [compare(lb, scores) for lb in boards]
    table2s = table2(tables, published_efficiency)
    fig, lacking = None, None
    if figure is not False:
        present = {r.model for lb in boards for r in lb.rows}
        points = (
            published_points(present, scores, published_efficiency, figure_length)
            if show_published
            else None
        )
        try:
            data = figure1_data(
                boards, tables, length=figure_length, published=points, board_stats=board_stats
            )
        except (DataError, ConfigError) as err:
            if figure is True:
                raise
            lacking = str(err)
        else:
            fig = draw_figure1(data)
    found = [learning_curves(lb) for lb in boards] if curves else []

    root = common_root(folders)
    out = Path(out_dir)
    tiny = boards[0].tiny
    written = [
        write_atomic(
            out / "leaderboard.md",
            leaderboard_markdown(boards, comparisons, board_stats, bootstrap_resamples),
        ),
        write_atomic(out / "leaderboard.csv", leaderboard_csv(boards, comparisons, board_stats)),
        write_atomic(out / "pairwise.csv", pairwise_csv(board_stats)),
        write_atomic(out / "leaderboard.tex", leaderboard_latex(boards, comparisons)),
        write_atomic(out / "efficiency.md", efficiency_markdown(tables, tiny, table2s)),
        write_atomic(out / "efficiency.csv", efficiency_csv(tables, table2s)),
        write_atomic(out / "efficiency.tex", efficiency_latex(table2s, tiny)),
    ]
    if fig is not None:
        written += write_figure1(fig, out)
    written += write_profiles(boards, out)
    if planned is not None:
        checked = plan_check(planned, records)
        written.append(write_atomic(out / "plan_check.md", plan_check_markdown(planned, checked)))
        written.append(write_atomic(out / "plan_check.csv", plan_check_csv(checked)))
    if studies:
        written.append(write_atomic(out / "tuning.md", tuning_markdown(studies)))
        written.append(write_atomic(out / "tuning.csv", tuning_csv(studies)))
        if figure is not False:
            written += write_tuning_figure(studies, out)
    trace = sources(boards, tables, fig, root, comparisons, table2s)
    if lacking is not None:
        trace["figure1"] = {"drawn": False, "why": lacking}
    for lb, learned in zip(boards, found, strict=False):
        stem = "curves" if len(boards) == 1 else f"curves_{lb.protocol}"
        written += write_curves(learned, out, stem)
        for note in learned.notes(root):
            print(note, flush=True)
    if found:
        traces = {lb.protocol: c.trace(root) for lb, c in zip(boards, found, strict=True)}
        trace["curves"] = next(iter(traces.values())) if len(traces) == 1 else traces
    if studies:
        trace["tuning"] = [relative_to_root(s["path"], root) or s["path"] for s in studies]
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
    if lacking is not None:
        print(
            f"figure1: not drawn (figure=auto; figure=true makes this an error): {lacking}",
            flush=True,
        )
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
        show_published=bool(cfg.show_published),
        models=_plain(cfg.get("models")) or None,
        curves=bool(cfg.get("curves", True)),
        settings=_plain(cfg.get("settings")) or None,
        protocol=_plain(cfg.get("protocols")),
        since=_plain(cfg.get("since")),
        until=_plain(cfg.get("until")),
        figure=figure_choice(cfg.get("figure", "auto")),
        reference=_plain(cfg.get("reference")),
        resolve_points=float(cfg.get("resolve_points", 1.0)),
        bootstrap_resamples=int(cfg.get("bootstrap_resamples", BOOTSTRAP_RESAMPLES)),
        plan=_plain(cfg.get("plan")),
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
