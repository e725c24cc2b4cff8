"""The report's tables as text: ``leaderboard.md``, ``leaderboard.csv``, ``efficiency.md``
and the trace ``sources.json`` (render step; see :mod:`lra.report.load` for the chain).

* **Leaderboard**: one table per protocol, each headed by its protocol name; one row per
  setting (:mod:`lra.report.leaderboard`), one column per task. A cell is the mean and sample
  standard deviation over seeds of ``test_accuracy`` in percent, with the seed count. The
  last column is the parameter count relative to the Transformer's (same task, same
  protocol; min-max over the row's tasks), ``!`` when over LRA's 1.10x budget. Marks:
  ``†`` older records superseded, ``‡`` validation = test split. Footnotes list, per row of a
  model with several settings, the config keys that differ. The CSV has one line per row
  with a ``protocol`` column and mean, std, n and setting per task.
* **Efficiency**: steps/sec and peak memory per model and length, relative to the
  Transformer, one table per benchmark setting (:mod:`lra.report.efficiency`).
* **Sources**: for every cell, the record files, seeds, code versions, config hashes and
  settings it came from, and the records it superseded.
"""

import csv
import io
import json
from collections import defaultdict

from lra.report.compare import (
    RULES_NOTE,
    Comparison,
    Published,
    measured_six50,
    unmatched_lines,
)
from lra.report.efficiency import EfficiencyTable, softmax_path
from lra.report.leaderboard import PARAM_BUDGET, Cell, Leaderboard, Row
from lra.report.load import BASELINE, MIB, TINY_NOTE, record_name
from lra.report.stats_tables import (
    interval_text,
    legend,
    marks_text,
    missing_text,
    pairwise_markdown,
    rank_text,
    seeds_markdown,
)
from lra.report.table2 import Table2
from lra.report.uncertainty import AVG5, AVG6, BoardStats

SUPERSEDED_MARK = "†"
VAL_TEST_MARK = "‡"
BUDGET_MARK = "!"
VAL_TEST_NOTE = "validation = test split: selection saw test data"


def fmt(value, digits=2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def signed(value, digits=2) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def spread_caption(comp) -> str:
    """What the ``±`` beside published values means, when any is shown."""
    kinds = sorted(
        {p.spread_kind for r in comp.rows.values() for ps in r.tasks.values() for p in ps} - {""}
    )
    return f" ± beside a published value: the source's {'; '.join(kinds)}." if kinds else ""


def published_text(p: Published | None, measured: float | None, numbers: dict) -> str:
    """``36.37 [1] (+0.13)``: the published value (``± spread`` where the source prints one),
    its source's number, measured - published."""
    if p is None:
        return ""
    mark = numbers.setdefault(p.source, len(numbers) + 1)
    value = p.value if isinstance(p.value, str) else f"{p.value:.2f}"
    if p.spread is not None:
        value += f" ± {p.spread:.2f}"
    diff = p.diff(measured)
    return f"{value} [{mark}]" + ("" if diff is None else f" ({diff:+.2f})")


# ---------------------------------------------------------------- leaderboard


def cell_text(cell: Cell | None, st: BoardStats | None = None, label="", task="") -> str:
    """``53.70 [50.6, 56.8] (n=3) *`` with the cell's 95% interval and marks
    (:mod:`lra.report.stats_tables`); without predictions ``53.70 ± 1.20 (n=3)``."""
    if cell is None:
        return ""
    interval = interval_text(st, label, task)
    std = f" ± {cell.std:.2f}" if cell.std is not None and not interval else ""
    marks = (SUPERSEDED_MARK if cell.superseded else "") + (VAL_TEST_MARK if cell.val_test else "")
    marks += marks_text(st, label, task)
    return f"{cell.mean:.2f}{interval or std} (n={cell.n})" + (f" {marks}" if marks else "")


def average_text(value: float | None, st: BoardStats | None, label: str, column: str) -> str:
    if value is None:
        return ""
    marks = marks_text(st, label, column)
    return f"{value:.2f}{interval_text(st, label, column)}" + (f" {marks}" if marks else "")


def params_text(row: Row) -> str:
    """``1.02x``, or ``0.98-1.23x !`` over the row's tasks; empty without a Transformer."""
    if not row.params_ratio:
        return ""
    lo, hi = min(row.params_ratio.values()), max(row.params_ratio.values())
    text = f"{hi:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"
    return text + (f" {BUDGET_MARK}" if row.over_budget else "")


def _value(text: str) -> str:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return str(text)
    return value if isinstance(value, str) else json.dumps(value)


def differs_text(row: Row) -> str:
    """``key=value`` per differing key; ``(task, ...)`` after values that hold on some tasks."""
    by_key: dict = defaultdict(lambda: defaultdict(list))
    for task, values in row.differs.items():
        for key, value in values.items():
            by_key[key][_value(value)].append(task)
    parts = []
    for key in sorted(by_key):
        values = by_key[key]
        everywhere = len(values) == 1 and len(next(iter(values.values()))) == len(row.differs)
        for value, tasks in values.items():
            parts.append(f"{key}={value}" + ("" if everywhere else f" ({', '.join(tasks)})"))
    return "; ".join(parts)


def _table_markdown(
    lb: Leaderboard,
    heading: str,
    comp: Comparison | None = None,
    st: BoardStats | None = None,
    resamples: int = 0,
) -> list[str]:
    avg_label = "Tiny avg (not LRA)" if lb.tiny else "LRA avg (5)"
    six_label = "Tiny avg (6)" if lb.tiny else "Avg (6, FAIL=50)"
    show = comp is not None and not lb.tiny and comp.any_published
    pub_col = "published [source] (Δ)"
    ranked = st is not None and bool(st.ranks)
    head = ["Model"] + (["Rank (95%)"] if ranked else [])
    for t in lb.tasks:
        head += [t, f"{t} {pub_col}"] if show else [t]
    head += [avg_label] + ([f"LRA avg (5) {pub_col}"] if show else [])
    head += [lb.pathx] + ([f"{lb.pathx} {pub_col}"] if show else [])
    head += [six_label] + ([f"Avg (6) {pub_col}"] if show else [])
    head.append("Params vs Transformer")
    lines = [
        heading,
        "",
        f"Checkpoint selection: {', '.join(lb.selections) or 'n/a'}. "
        f"Device(s): {', '.join(lb.devices) or 'n/a'}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    numbers = comp.numbers() if show else {}  # source id -> its number, in source order

    for row in lb.rows:
        mine = comp.rows.get(row.label) if show else None
        values = [row.label] + ([rank_text(st, row.label)] if ranked else [])
        for t in (*lb.tasks, "avg", lb.pathx, "six"):
            if t == "avg":
                values.append(average_text(row.average, st, row.label, AVG5))
                if show:
                    first = mine.first_average("lra5")
                    values.append(published_text(first, row.average, numbers))
                continue
            if t == "six":
                six = measured_six50(row, lb)
                values.append(average_text(six, st, row.label, AVG6))
                if show:
                    values.append(published_text(mine.first_average("six50"), six, numbers))
                continue
            cell = row.cells.get(t)
            values.append(cell_text(cell, st, row.label, t))
            if show:
                mean = None if cell is None else cell.mean
                values.append(published_text(mine.first(t), mean, numbers))
        values.append(params_text(row))
        lines.append("| " + " | ".join(values) + " |")
    if show and numbers:
        lines.append("")
        cites = {
            p.source: p.citation for r in comp.rows.values() for ps in r.tasks.values() for p in ps
        }
        cites.update(
            {p.source: p.citation for r in comp.rows.values() for p in (*r.lra5, *r.six50)}
        )
        lines.append(
            "Published [source], the first source with a number (all sources: sources.json): "
            + "; ".join(f"[{n}] {s}: {cites.get(s, s)}" for s, n in numbers.items())
            + ". Δ = measured - published, percentage points."
            + spread_caption(comp)
        )
    lines.append("")
    if text := legend(st, resamples):
        lines += [text, ""]
    lines += missing_text(st)
    notes = []
    over = [r.label for r in lb.rows if r.over_budget]
    if over:
        notes.append(
            f"{BUDGET_MARK} More than {PARAM_BUDGET:.2f}x the Transformer's parameters on at "
            f"least one task ({', '.join(over)}). LRA compares models at about the "
            f"Transformer's size (within {PARAM_BUDGET:.1f}x, Tay et al. 2021), so these rows "
            "are not like for like."
        )
    if lb.baselines:
        bases = sorted(set(lb.baselines.values()))
        notes.append(
            "Params: parameter count relative to the Transformer row "
            f"{', '.join(bases)} on the same task and protocol (min-max over the row's tasks)."
        )
    elif lb.rows:
        notes.append(f"Params: empty, no {BASELINE} row with a parameter count in this table.")
    if any(r.val_test for r in lb.rows):
        notes.append(f"{VAL_TEST_MARK} {VAL_TEST_NOTE} (val_source=test in the records).")
    superseded = sum(len(c.superseded) for r in lb.rows for c in r.cells.values())
    if superseded:
        notes.append(
            f"{SUPERSEDED_MARK} {superseded} older record(s) with the same model, task, setting "
            "and seed were superseded by the newest one (by started_at); sources.json lists them."
        )
    several = [r for r in lb.rows if len(lb.rows_of(r.model)) > 1]
    if several:
        notes.append(
            "Models with several settings: one row each, never averaged together. Keys whose "
            "values differ from the model's other settings on the same task:"
        )
        bullets = []
        for row in several:
            what = differs_text(row) or "no config in the records to compare"
            hashes = ", ".join(f"{t} {s}" for t, s in row.settings.items())
            bullets.append(f"- {row.label}: {what} (settings: {hashes})")
        notes[-1] += "\n\n" + "\n".join(bullets)
    for note in notes:  # one paragraph each
        lines += [note, ""]
    return lines + pairwise_markdown(lb, st) + seeds_markdown(lb, st)


def leaderboard_markdown(
    boards: list[Leaderboard] | Leaderboard,
    comparisons: list[Comparison] | None = None,
    board_stats: list[BoardStats] | None = None,
    resamples: int = 0,
) -> str:
    """``leaderboard.md``: one table per protocol, each headed by its protocol name; with
    ``comparisons`` (one per board, :func:`lra.report.compare.compare`), the published numbers
    beside the measured ones and the published rows no model matches."""
    boards = [boards] if isinstance(boards, Leaderboard) else list(boards)
    comps = list(comparisons) if comparisons is not None else [None] * len(boards)
    first = boards[0]
    tiny = f" ({TINY_NOTE})" if first.tiny else ""
    avg_label = "Tiny avg (not LRA)" if first.tiny else "LRA avg"
    lines = [
        f"# Leaderboard{tiny}",
        "",
        f"Test accuracy (%) per task{tiny}: mean over seeds (n = seeds) with its 95% interval "
        "[low, high] where the records carry predictions (see below), else ± the sample "
        "standard deviation over seeds. Records share a cell only when model, task and "
        "setting (the hash of the resolved config less seed, paths, logging and device "
        "layout) agree; a model with several settings has one row per setting (label: the "
        "variant, naming what was overridden; @hash where settings share a variant). One "
        "table per protocol; nothing "
        f"is averaged across settings or protocols. {avg_label} = mean of the five task means "
        f"({', '.join(first.tasks)}), empty unless all five exist; {first.pathx} is reported "
        "separately and is not in the average. Empty cell = no record.",
        "",
        RULES_NOTE,
    ]
    if first.tiny and comparisons is not None:
        lines += ["", comps[0].note]
    lines.append("")
    all_stats = list(board_stats) if board_stats is not None else [None] * len(boards)
    for lb, comp, st in zip(boards, comps, all_stats, strict=True):
        lines += _table_markdown(lb, f"## Protocol: {lb.protocol}", comp, st, resamples)
    if first.other_tasks:
        lines += [
            f"Records on tasks outside this set, not shown: {', '.join(first.other_tasks)}.",
            "",
        ]
    unmatched = comps[0].unmatched if comps and comps[0] is not None else []
    if unmatched:
        lines += [
            "## Published rows not matched",
            "",
            "Published rows whose model label the alias table (lra/report/published.py, "
            "ALIASES) maps to no harness model; listed, never guessed:",
            "",
            *[f"- {line}" for line in unmatched_lines(unmatched)],
            "",
        ]
    lines.append("Record files, seeds, settings and code versions behind every cell: sources.json.")
    return "\n".join(lines) + "\n"


def leaderboard_csv(
    boards: list[Leaderboard] | Leaderboard,
    comparisons: list[Comparison] | None = None,
    board_stats: list[BoardStats] | None = None,
) -> str:
    """CSV, one line per row with its protocol; mean, std, n and setting per task; the
    six-task average; with ``comparisons``, per task and average the first published value,
    its source and measured - published (empty on tiny tasks); with ``board_stats`` (one per
    board), per task and average its seeds and 95% interval, and the row's rank interval
    (empty without predictions)."""
    boards = [boards] if isinstance(boards, Leaderboard) else list(boards)
    comps = list(comparisons) if comparisons is not None else [None] * len(boards)

    def columns(cell):
        if cell is None:
            return ["", "", "", ""]
        std = "" if cell.std is None else repr(round(cell.std, 6))
        return [repr(round(cell.mean, 6)), std, str(cell.n), cell.setting]

    def number(value):
        if value is None:
            return ""
        return value if isinstance(value, str) else repr(round(value, 6))

    def beside(p: Published | None, measured):
        if p is None:
            return ["", "", ""]
        return [number(p.value), p.source, number(p.diff(measured))]

    first = boards[0]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["protocol", "row", "model", "variant"]
    for t in (*first.tasks, first.average_name, first.pathx):
        part = ("mean", "std", "n", "setting")
        head += [t] if t == first.average_name else [f"{t}_{p}" for p in part]
    head += ["params_ratio_max", "params_over_budget", "val_source", "differs"]
    six_name = first.six_average_name
    head.append(six_name)
    if comparisons is not None:
        for t in (*first.tasks, first.pathx, "lra_average", "six_average_fail50"):
            head += [f"{t}_published", f"{t}_published_source", f"{t}_diff"]
    interval_columns = (*first.shown, first.average_name, six_name)
    for t in interval_columns:
        head += [f"{t}_n_seeds", f"{t}_ci_low", f"{t}_ci_high"]
    head += ["rank", "rank_low", "rank_high"]
    writer.writerow(head)
    all_stats = list(board_stats) if board_stats is not None else [None] * len(boards)
    for lb, comp, st in zip(boards, comps, all_stats, strict=True):
        for row in lb.rows:
            values = [lb.protocol, row.label, row.model, row.variant]
            for t in lb.tasks:
                values += columns(row.cells.get(t))
            values.append("" if row.average is None else repr(round(row.average, 6)))
            values += columns(row.cells.get(lb.pathx))
            ratio = row.max_params_ratio
            values += [
                "" if ratio is None else repr(round(ratio, 6)),
                "" if ratio is None else str(row.over_budget).lower(),
                "|".join(sorted({s for c in row.cells.values() for s in c.val_sources})),
                differs_text(row),
            ]
            six = measured_six50(row, lb)
            values.append(number(six))
            if comparisons is not None:
                mine = comp.rows.get(row.label) if comp is not None and not lb.tiny else None
                for t in (*lb.tasks, lb.pathx):
                    cell = row.cells.get(t)
                    p = mine.first(t) if mine else None
                    values += beside(p, None if cell is None else cell.mean)
                values += beside(mine.first_average("lra5") if mine else None, row.average)
                values += beside(mine.first_average("six50") if mine else None, six)
            for column in (*lb.shown, AVG5, AVG6):
                interval = None if st is None else st.interval(row.label, column)
                n = None if interval is None else st.n_seeds(row.label, column)
                values += ["" if n is None else str(n), *map(number, interval or (None, None))]
            rank = (st.ranks.get(row.label) if st is not None else None) or (None, None, None)
            values += ["" if r is None else str(r) for r in rank]
            writer.writerow(values)
    return out.getvalue()


# ---------------------------------------------------------------- efficiency


def _speed_cell(table, model, length, key) -> str:
    status = table.status(model, length)
    if status is None:
        return ""
    if status != "ok":
        return status.upper()
    value, rel = table.value(model, length, key), table.relative(model, length, key)
    if value is None:
        return ""
    return f"{value:.2f}" + ("" if model == table.baseline or rel is None else f" ({rel:.2f}x)")


def _memory_cell(table, model, length) -> str:
    status = table.status(model, length)
    if status is None:
        return ""
    if status != "ok":
        return status.upper()
    value = table.value(model, length, "peak_memory_bytes")
    rel = table.relative(model, length, "peak_memory_bytes")
    if value is None:
        return ""
    same = model == table.baseline or rel is None
    return f"{value / MIB:.1f}" + ("" if same else f" ({rel:.2f})")


def relative_text(value, digits=2) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else f"{value:.{digits}f}"


def _table2_markdown(t2: Table2, note: str) -> list[str]:
    s = t2.setting
    cols = [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in t2.lengths]
    lines = [
        f"### LRA Table 2 form: {s['task']}, batch size {s['batch_size']}, {s['precision']}, "
        f"device {s['device']}, protocol {s['protocol']}{note}",
        "",
        f"Relative to {t2.baseline} measured in the same setting (= 1.00). Speed: training "
        "steps/sec over the Transformer's (higher is faster); memory: peak memory over the "
        "Transformer's (lower is less)."
        + (
            f" Published: Tay et al. 2021 (LRA), Table 2 ({t2.hardware}), its relative speed "
            "as printed in brackets, else its steps/sec over its Transformer's; its memory "
            "over its Transformer's."
            if t2.published
            else ""
        ),
        "",
    ]
    head = ["Model", *[f"speed {c}" for c in cols], *[f"memory {c}" for c in cols]]
    if t2.published:
        head += [f"published speed {c}" for c in cols] + [f"published memory {c}" for c in cols]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in t2.rows:
        m = t2.measured[row]
        cells = [relative_text(m["speed"][n]) for n in t2.lengths]
        cells += [relative_text(m["memory"][n]) for n in t2.lengths]
        if t2.published:
            p = t2.published.get(row, {})
            for metric in ("speed", "memory"):
                cells += [relative_text(p.get(metric, {}).get(n)) for n in t2.lengths]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def efficiency_markdown(
    tables: list[EfficiencyTable], tiny: bool = False, table2s: list[Table2] | None = None
) -> str:
    """``efficiency.md``: per benchmark setting the absolute tables, then (``table2s``) the
    LRA paper's Table 2 form with the published Table 2 beside it."""
    note = f" ({TINY_NOTE})" if tiny else ""
    lines = [f"# Efficiency{note}", ""]
    if not tables:
        lines.append(
            "No benchmark records (kind=bench) in the results store. Produce them with "
            "lra-bench -m model=<models> (it writes to results/bench, which lra-report reads)."
        )
        return "\n".join(lines) + "\n"
    lines += [
        "From benchmark records on synthetic full-length inputs. Steps/sec is the median over "
        "timed windows (the windows are in each record). In parentheses: relative to the "
        f"Transformer ({BASELINE}; on the plain softmax path when it was measured, a softmax "
        "model's row names the path that ran) at the same length, speed as x-times its "
        "steps/sec and memory "
        "as a fraction of its peak memory, as in the LRA paper's efficiency table. OOM = out of "
        "memory at that length. Slope = least-squares slope of log peak memory against log "
        "length over the lengths that ran (1 = linear, 2 = quadratic). One table per setting "
        "(task, batch, precision, device, protocol). Records: sources.json.",
        "",
    ]
    for t in tables:
        s = t.setting
        lines += [
            f"## {s['task']}, batch size {s['batch_size']}, {s['precision']}, "
            f"device {s['device']} ({s['platform']}), protocol {s['protocol']}{note}",
            "",
            f"Peak memory source: {', '.join(t.memory_sources) or 'n/a'}.",
            "",
        ]
        cols = [str(n) for n in t.lengths]
        for title, key in (
            ("Training steps per second", "train_steps_per_sec"),
            ("Inference steps per second", "eval_steps_per_sec"),
        ):
            lines += [f"### {title}", "", "| Model | " + " | ".join(cols) + " |"]
            lines.append("|" + "---|" * (len(cols) + 1))
            for m in t.models:
                cells = [_speed_cell(t, m, n, key) for n in t.lengths]
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += ["### Peak memory (MiB)", "", "| Model | " + " | ".join(cols) + " | Slope |"]
        lines.append("|" + "---|" * (len(cols) + 2))
        for m in t.models:
            cells = [_memory_cell(t, m, n) for n in t.lengths]
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {fmt(t.slope(m))} |")
        lines.append("")
        for t2 in table2s or []:
            if t2.setting == t.setting:
                lines += _table2_markdown(t2, note)
    return "\n".join(lines)


EFFICIENCY_CSV_KEYS = (
    "train_steps_per_sec",
    "eval_steps_per_sec",
    "peak_memory_bytes",
)


def efficiency_csv(tables: list[EfficiencyTable], table2s: list[Table2] | None = None) -> str:
    """``efficiency.csv``: one line per setting, row and length: the absolute values, the
    values relative to the setting's Transformer row, the softmax path, and the published
    Table 2 relative values (LRA paper) where the length has one."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = ("task", "batch_size", "precision", "device", "platform", "protocol")
    head = [*keys, "row", "model", "softmax_implementation", "length", "status"]
    head += [*EFFICIENCY_CSV_KEYS, "relative_to"]
    head += [f"relative_{k}" for k in EFFICIENCY_CSV_KEYS]
    head += ["published_relative_speed", "published_relative_memory", "published_source"]
    writer.writerow(head)
    by_setting = {json.dumps(t2.setting, sort_keys=True, default=str): t2 for t2 in table2s or []}
    for t in tables:
        t2 = by_setting.get(json.dumps(t.setting, sort_keys=True, default=str))
        for m in t.models:
            for n in t.lengths:
                rec = t.cells.get((m, n))
                if rec is None:
                    continue
                values = [t.setting.get(k) for k in keys]
                values += [m, rec["model"], softmax_path(rec) or "", n, rec.get("status", "ok")]
                values += [_num(t.value(m, n, k)) for k in EFFICIENCY_CSV_KEYS]
                values.append(t.baseline)
                values += [_num(t.relative(m, n, k)) for k in EFFICIENCY_CSV_KEYS]
                published = (t2.published.get(m, {}) if t2 is not None else {}) or {}
                speed = published.get("speed", {}).get(n)
                memory = published.get("memory", {}).get(n)
                values += [_num(speed), _num(memory)]
                values.append("lra_paper" if speed is not None or memory is not None else "")
                writer.writerow(values)
    return out.getvalue()


def _num(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else repr(round(float(value), 6))


# ---------------------------------------------------------------- sources


def _trace(records, root) -> dict:
    return {
        "records": [record_name(r, root) for r in records],
        "seeds": [r.get("seed") for r in records],
        "code_versions": sorted({str(r.get("code_version")) for r in records}),
        "config_hashes": [r.get("config_hash") for r in records],
    }


def sources(
    boards,
    tables: list[EfficiencyTable],
    fig=None,
    root=None,
    comparisons: list[Comparison] | None = None,
    table2s: list[Table2] | None = None,
) -> dict:
    """The records behind every reported number: ``leaderboard[protocol][row][task]``,
    ``efficiency`` per setting, ``figure1`` (``fig`` has a ``sources(root)`` method); with
    ``comparisons``, every published number beside a row (all sources, in source order)
    under ``published`` and the unmatched published rows; ``table2`` the published Table 2."""
    boards = [boards] if isinstance(boards, Leaderboard) else list(boards)
    comps = list(comparisons) if comparisons is not None else [None] * len(boards)
    board = {}
    for lb, comp in zip(boards, comps, strict=True):
        table = {}
        for row in lb.rows:
            entry = {"model": row.model, "variant": row.variant}
            for task, cell in row.cells.items():
                entry[task] = {
                    **_trace(cell.records, root),
                    "setting": cell.setting,
                    "val_sources": cell.val_sources,
                    "num_params": cell.num_params,
                    "superseded": [record_name(r, root) for r in cell.superseded],
                }
            if row.average is not None:
                entry[lb.average_name] = {"mean_of": list(lb.tasks)}
            if row.params_ratio:
                entry["params_ratio"] = {
                    "relative_to": lb.baselines,
                    "ratios": row.params_ratio,
                    "over_budget": row.over_budget,
                }
            mine = comp.rows.get(row.label) if comp is not None else None
            if mine is not None and (mine.tasks or mine.lra5 or mine.six50):
                entry["published"] = {
                    **{t: [p.trace() for p in ps] for t, ps in mine.tasks.items()},
                    "lra_average": [p.trace() for p in mine.lra5],
                    "six_average_fail50": [p.trace() for p in mine.six50],
                }
            table[row.label] = entry
        board[lb.protocol] = table
    eff = []
    for t in tables:
        cells = defaultdict(dict)
        for (model, length), rec in sorted(t.cells.items()):
            cells[model][str(length)] = {
                **_trace([rec], root),
                "status": rec.get("status", "ok"),
                "superseded": [record_name(r, root) for r in t.superseded[(model, length)]],
            }
        eff.append({"setting": t.setting, "relative_to": t.baseline, "cells": dict(cells)})
    out = {
        "task_set": boards[0].task_set if boards else None,
        "leaderboard": board,
        "efficiency": eff,
    }
    if comps and comps[0] is not None:
        out["published_unmatched"] = unmatched_lines(comps[0].unmatched)
    if table2s:
        out["table2"] = [
            {
                "setting": t2.setting,
                "relative_to": t2.baseline,
                "lengths": list(t2.lengths),
                "published": {
                    row: {"label": t2.published_labels.get(row), "source": "lra_paper", **v}
                    for row, v in t2.published.items()
                },
            }
            for t2 in table2s
        ]
    if fig is not None:
        out["figure1"] = fig.sources(root)
    return out
