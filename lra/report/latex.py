"""The report's tables as LaTeX, ready for a paper (render step; issue 31, part 3).

``leaderboard.tex`` and ``efficiency.tex`` are complete documents (``article`` with
``booktabs``, ``graphicx`` and ``geometry``) that ``pdflatex`` compiles as they are; each
table is one ``table`` float whose ``tabular`` can be copied into a paper. Tables use
booktabs rules only (``\\toprule``, ``\\midrule``, ``\\bottomrule``; no vertical rules).

* Leaderboard (one table per protocol): one row per leaderboard row; a cell is
  ``mean $\\pm$ std`` over seeds with the seed count as a subscript ``$_{n=3}$`` (no std for
  one seed); the best mean of each column in ``\\textbf``; the two averages (LRA's five-task
  average, the six-task average with FAIL = 50). With published numbers (official tasks), a
  second block under a ``\\midrule`` holds, per model present, the published row of the first
  source (:func:`lra.report.compare.source_order`), labelled with it, never bolded.
* Efficiency: the LRA paper's Table 2 form (:mod:`lra.report.table2`): training speed and
  peak memory relative to the Transformer at 1K-4K; the best per column in bold (highest
  speed, lowest memory); the published Table 2 rows in a second block.

Text is escaped (``_ % & # $ { } ~ ^ \\``); numbers have two decimals.
"""

from lra.report.compare import Comparison, measured_six50
from lra.report.leaderboard import Leaderboard
from lra.report.load import TINY_NOTE
from lra.report.table2 import Table2

PREAMBLE = r"""\documentclass{article}
\usepackage[T1]{fontenc}
\usepackage{booktabs}
\usepackage{graphicx}
\usepackage[margin=1.5cm,landscape]{geometry}
\begin{document}
"""
END = "\\end{document}\n"
_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
TASK_NAMES = {
    "listops": "ListOps",
    "text": "Text",
    "retrieval": "Retrieval",
    "image": "Image",
    "pathfinder": "Pathfinder",
    "pathx": "Path-X",
}


def escape(text) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_ESCAPES.get(ch, ch) for ch in str(text))


def task_name(task: str) -> str:
    base = task.removesuffix("_tiny")
    name = TASK_NAMES.get(base, base)
    return escape(name + (" (tiny)" if task != base else ""))


def bold(text: str, on: bool) -> str:
    return f"\\textbf{{{text}}}" if on else text


def _mean_std(mean, std, n) -> str:
    if mean is None:
        return "--"
    text = f"{mean:.2f}" + ("" if std is None else f" $\\pm$ {std:.2f}")
    return text + ("" if n is None else f"$_{{n={n}}}$")


def _tabular(columns: int, head: list[str], blocks: list[list[list[str]]]) -> list[str]:
    lines = [f"\\begin{{tabular}}{{l{'r' * (columns - 1)}}}", "\\toprule"]
    lines.append(" & ".join(head) + " \\\\")
    for block in blocks:
        if not block:
            continue
        lines.append("\\midrule")
        lines += [" & ".join(cells) + " \\\\" for cells in block]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return lines


def _float(caption: str, tabular: list[str]) -> list[str]:
    return [
        "\\begin{table}[ht]",
        "\\centering",
        f"\\caption{{{caption}}}",
        "\\resizebox{\\textwidth}{!}{%",
        *tabular,
        "}",
        "\\end{table}",
        "",
    ]


def _published_cell(value) -> str:
    if value is None:
        return "--"
    return escape(value) if isinstance(value, str) else f"{value:.2f}"


def leaderboard_table(lb: Leaderboard, comp: Comparison | None = None) -> list[str]:
    """One protocol's leaderboard as a ``table`` float (see the module docstring)."""
    columns = [*lb.tasks, "avg5", lb.pathx, "avg6"]
    avg5 = "Tiny avg" if lb.tiny else "LRA avg (5)"
    avg6 = "Tiny avg (6)" if lb.tiny else "Avg (6, FAIL=50)"
    names = {"avg5": avg5, "avg6": avg6}
    head = ["Model", *[escape(names[c]) if c in names else task_name(c) for c in columns]]

    def measured(row, column):
        if column == "avg5":
            return row.average, None, None
        if column == "avg6":
            return measured_six50(row, lb), None, None
        cell = row.cells.get(column)
        return (None, None, None) if cell is None else (cell.mean, cell.std, cell.n)

    values = {(r.label, c): measured(r, c) for r in lb.rows for c in columns}
    best = {}
    for c in columns:
        means = [values[(r.label, c)][0] for r in lb.rows if values[(r.label, c)][0] is not None]
        best[c] = max(means) if means else None
    rows = []
    for r in lb.rows:
        cells = [escape(r.label)]
        for c in columns:
            mean, std, n = values[(r.label, c)]
            text = _mean_std(mean, std, n)
            cells.append(bold(text, mean is not None and mean == best[c]))
        rows.append(cells)
    published = []
    if comp is not None and not lb.tiny:
        for r in lb.rows:
            mine = comp.rows.get(r.label)
            if mine is None or not r.default:
                continue
            by_source: dict = {}
            for c in columns:
                if c == "avg5":
                    ps = mine.lra5
                elif c == "avg6":
                    ps = mine.six50
                else:
                    ps = mine.tasks.get(c, [])
                for p in ps:
                    by_source.setdefault((p.source, p.label), {}).setdefault(c, p.value)
            for (source, label), vals in list(by_source.items())[:1]:  # the first source
                cells = [f"{escape(label)} ({escape(source)})"]
                cells += [_published_cell(vals.get(c)) for c in columns]
                published.append(cells)
    protocol = escape(lb.protocol)
    caption = (
        f"Test accuracy (\\%), protocol {protocol}: mean $\\pm$ sample std over seeds "
        "($n$ = seeds); best per column in bold. LRA avg (5): ListOps, Text, Retrieval, "
        "Image, Pathfinder (Path-X left out); Avg (6, FAIL=50): all six, a failure counting "
        "as 50."
    )
    if lb.tiny:
        caption += f" {escape(TINY_NOTE)}; no published numbers beside them."
    elif published:
        caption += " Second block: published numbers, labelled by source."
    return _float(caption, _tabular(len(head), head, [rows, published]))


def leaderboard_latex(boards, comparisons: list[Comparison] | None = None) -> str:
    """``leaderboard.tex``: a document with one leaderboard table per protocol."""
    boards = [boards] if isinstance(boards, Leaderboard) else list(boards)
    comps = list(comparisons) if comparisons is not None else [None] * len(boards)
    body = []
    for lb, comp in zip(boards, comps, strict=True):
        body += leaderboard_table(lb, comp)
    return PREAMBLE + "\n".join(body) + END


def _length(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def table2_table(t2: Table2, tiny: bool = False) -> list[str]:
    """One benchmark setting in the LRA paper's Table 2 form as a ``table`` float."""
    cols = [_length(n) for n in t2.lengths]
    head = ["Model", *[f"Speed {c}" for c in cols], *[f"Memory {c}" for c in cols]]
    rows = []
    for row in t2.rows:
        cells = [escape(row)]
        for metric in ("speed", "memory"):
            for n in t2.lengths:
                v = t2.measured[row][metric][n]
                best = t2.best(metric, n)
                text = _published_cell(v)
                cells.append(bold(text, isinstance(v, float) and v == best))
        rows.append(cells)
    published = []
    for row in t2.rows:
        p = t2.published.get(row)
        if not p:
            continue
        label = t2.published_labels.get(row, row)
        cells = [f"{escape(label)} (lra\\_paper)"]
        for metric in ("speed", "memory"):
            cells += [_published_cell(p.get(metric, {}).get(n)) for n in t2.lengths]
        published.append(cells)
    s = t2.setting
    caption = (
        f"Efficiency relative to {escape(t2.baseline)} in the same setting ({escape(s['task'])}, "
        f"batch {escape(s['batch_size'])}, {escape(s['precision'])}, {escape(s['device'])}, "
        f"protocol {escape(s['protocol'])}): training steps/sec (higher is faster) and peak "
        "memory (lower is less) over the Transformer's; best per column in bold."
    )
    if tiny:
        caption += f" {escape(TINY_NOTE)}."
    if published:
        caption += (
            " Second block: Tay et al. 2021 (LRA), Table 2, as printed or over its Transformer's "
            f"({escape(t2.hardware)})."
        )
    return _float(caption, _tabular(len(head), head, [rows, published]))


def efficiency_latex(table2s: list[Table2], tiny: bool = False) -> str:
    """``efficiency.tex``: a document with one Table-2-form table per benchmark setting."""
    body = []
    for t2 in table2s:
        body += table2_table(t2, tiny)
    if not body:
        body = ["No benchmark records at 1K-4K (lra-bench writes them).", ""]
    return PREAMBLE + "\n".join(body) + END
