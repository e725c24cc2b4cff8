"""TransNormer's Figure 1 reproduced from the results store.

Figure 1 of "The Devil in Linear Transformer" (Qin et al., EMNLP 2022, p. 7025)
plots each model as one circle: LRA score on the y axis, training speed in
steps per second on the x axis, circle area proportional to peak memory. The
paper's speed scripts ran the Text task at length 2048 (REFERENCE.md sec. 6),
so :data:`DEFAULT_LENGTH` is 2048.

Here, for each model:

* x = median training steps/sec of its benchmark record at ``length``, from
  the benchmark setting (task, batch, precision, device) with the most models
  measured at that length;
* y = its LRA average from the leaderboard (official tasks), or, for the tiny
  set, the mean test accuracy over the tiny tasks that every model has (labelled
  as tiny-task CPU numbers, not LRA scores);
* circle area = peak memory of the same benchmark record.

Models lacking a score or a speed are listed as missing in the caption, never
plotted at 0. Optionally the values the paper reports
(``results/reference/figure1_paper.csv``) are drawn as hollow grey circles,
labelled as reported in TransNormer, with the length their speed refers to.
Drawn with matplotlib's Agg canvas (no pyplot, no display needed).
"""

import csv
import io
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lra.report import MIB, TINY_NOTE, EfficiencyTable, Leaderboard, record_name, write_atomic

DEFAULT_LENGTH = 2048
REFERENCE_LEGEND = "reported in TransNormer (Qin et al. 2022)"
MAX_AREA = 2500.0  # points^2 of the largest circle
MIN_AREA = 30.0


@dataclass
class Point:
    model: str
    x: float
    y: float
    memory_bytes: float | None
    x_record: dict
    y_records: list[dict]


@dataclass
class Figure1:
    figure: Figure
    length: int
    points: list[Point]
    missing: dict[str, str]
    y_label: str
    caption: str
    table: EfficiencyTable | None
    tiny: bool = False
    reference: list[dict] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [p.model for p in self.points]

    def sources(self, root=None) -> dict:
        return {
            "length": self.length,
            "setting": None if self.table is None else self.table.setting,
            "y": self.y_label,
            "points": {
                p.model: {
                    "x_record": record_name(p.x_record, root),
                    "y_records": [record_name(r, root) for r in p.y_records],
                    "code_versions": sorted(
                        {str(r.get("code_version")) for r in [p.x_record, *p.y_records]}
                    ),
                }
                for p in self.points
            },
            "missing": self.missing,
            "reference": [
                {"model": r["model"], "source": r.get("source", "")} for r in self.reference
            ],
        }


def read_reference_csv(path: str | Path) -> list[dict]:
    """Rows of the reference CSV with ``lra_average``/``train_steps_per_sec``/... as floats."""
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            for key in ("lra_average", "train_steps_per_sec", "peak_memory_mb"):
                try:
                    row[key] = float(row.get(key) or "")
                except ValueError:
                    row[key] = None
            rows.append(row)
    return rows


def _pick_table(tables, length) -> EfficiencyTable | None:
    scored = [
        (sum(t.value(m, length, "train_steps_per_sec") is not None for m in t.models), -i, t)
        for i, t in enumerate(tables)
        if length in t.lengths
    ]
    return max(scored, key=lambda s: s[:2])[2] if scored else None


def _scores(lb: Leaderboard):
    """``({model: (y, records)}, {model: why missing}, y label)``."""
    scores, missing = {}, {}
    if lb.tiny:
        common = [t for t in lb.tasks if lb.rows and all(t in r.cells for r in lb.rows)]
        label = f"Mean test accuracy (%) over {', '.join(common) or 'no common task'} ({TINY_NOTE})"
        for row in lb.rows:
            if common:
                recs = [rec for t in common for rec in row.cells[t].records]
                scores[row.model] = (sum(row.cells[t].mean for t in common) / len(common), recs)
            else:
                missing[row.model] = "no tiny task has results for every model"
        return scores, missing, label
    label = "LRA score (mean test accuracy over ListOps, Text, Retrieval, Image, Pathfinder, %)"
    for row in lb.rows:
        if row.average is None:
            lacking = [t for t in lb.tasks if t not in row.cells]
            missing[row.model] = f"no LRA average (no results for {', '.join(lacking)})"
        else:
            recs = [rec for t in lb.tasks for rec in row.cells[t].records]
            scores[row.model] = (row.average, recs)
    return scores, missing, label


def figure1(
    lb: Leaderboard,
    tables: list[EfficiencyTable],
    *,
    length: int = DEFAULT_LENGTH,
    reference_csv: str | Path | None = None,
) -> Figure1:
    """Build Figure 1 (see the module docstring); nothing is written until :func:`write_figure1`."""
    length = int(length)
    table = _pick_table(tables, length)
    scores, missing, y_label = _scores(lb)
    models = set(scores) | set(missing) | set(table.models if table else [])
    points = []
    for model in sorted(models):
        if model not in scores and model not in missing:
            missing[model] = "no training records"
        status = table.status(model, length) if table else None
        speed = table.value(model, length, "train_steps_per_sec") if table else None
        if status is not None and status != "ok":
            why = f"{status.upper()} at length {length}"
        elif speed is None:
            why = f"no benchmark speed at length {length}"
        else:
            why = None
        if why:
            missing[model] = f"{missing[model]}; {why}" if model in missing else why
            continue
        if model in missing:
            continue
        memory = table.value(model, length, "peak_memory_bytes")
        rec = table.cells[(model, length)]
        points.append(Point(model, speed, scores[model][0], memory, rec, scores[model][1]))

    notes = []
    reference = []
    if reference_csv is not None:
        if lb.tiny:
            notes.append("Paper values not drawn: tiny-task accuracies are not LRA scores.")
        elif not Path(reference_csv).is_file():
            notes.append(f"Reference CSV {reference_csv} not found; paper values not drawn.")
        else:
            rows = read_reference_csv(reference_csv)
            notes.append(
                f"Hollow circles: values reported in TransNormer ({reference_csv}), drawn at a "
                "fixed size (their memory is not stated in the text)."
            )
            reference = [r for r in rows if r["lra_average"] and r["train_steps_per_sec"]]
            left = [r.get("paper_label") or r["model"] for r in rows if r not in reference]
            if left:
                notes.append(
                    "Paper values without both an LRA score and a speed in the text, not drawn: "
                    + ", ".join(left)
                    + "."
                )
    fig = _draw(points, reference, lb, table, length, y_label)
    caption = _caption(points, missing, notes, table, length, lb)
    fig.axes[0].text(
        0.0,
        -0.12,
        "\n".join(textwrap.fill(p, 110) for p in caption.split("\n")),
        transform=fig.axes[0].transAxes,
        va="top",
        fontsize=7,
    )
    return Figure1(fig, length, points, missing, y_label, caption, table, lb.tiny, reference)


def _draw(points, reference, lb, table, length, y_label) -> Figure:
    fig = Figure(figsize=(9, 6.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    memories = [p.memory_bytes for p in points if p.memory_bytes]
    biggest = max(memories) if memories else 1.0
    if points:
        colors = matplotlib.colormaps["tab20"].resampled(max(len(points), 2))
        sizes = [
            max(MIN_AREA, MAX_AREA * p.memory_bytes / biggest) if p.memory_bytes else MIN_AREA
            for p in points
        ]
        measured = ax.scatter(
            [p.x for p in points],
            [p.y for p in points],
            s=sizes,
            c=[colors(i) for i in range(len(points))],
            alpha=0.6,
            edgecolors="black",
            linewidths=0.8,
            label="measured by this harness",
        )
        measured.set_gid("measured")
        for p in points:
            ax.annotate(p.model, (p.x, p.y), xytext=(6, 6), textcoords="offset points", fontsize=8)
    if reference:
        lengths = sorted({str(r.get("speed_length") or "?") for r in reference})
        ref = ax.scatter(
            [r["train_steps_per_sec"] for r in reference],
            [r["lra_average"] for r in reference],
            s=120,
            facecolors="none",
            edgecolors="0.45",
            linestyle="--",
            label=f"{REFERENCE_LEGEND}; their speed at length {', '.join(lengths)}"
            + ("" if lengths == [str(length)] else f", not {length}"),
        )
        ref.set_gid("reference")
        for r in reference:
            ax.annotate(
                r.get("paper_label") or r["model"],
                (r["train_steps_per_sec"], r["lra_average"]),
                xytext=(6, -10),
                textcoords="offset points",
                fontsize=7,
                color="0.4",
                style="italic",
            )
    if points or reference:
        legend = ax.legend(loc="best", fontsize=7)
        for handle in legend.legend_handles:
            handle.set_sizes([60.0])
    ax.margins(0.15)
    where = ""
    if table is not None:
        s = table.setting
        where = f", {s['task']}, batch {s['batch_size']}, {s['precision']}, {s['device']}"
    ax.set_xlabel(f"Training speed (steps per sec) at length {length}{where}")
    ax.set_ylabel(textwrap.fill(y_label, 60))
    title = "TransNormer Figure 1 reproduction: score vs training speed, circle area = peak memory"
    if lb.tiny:
        title = f"{title}\n({TINY_NOTE})"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def _caption(points, missing, notes, table, length, lb) -> str:
    tiny = f" ({TINY_NOTE})" if lb.tiny else ""
    parts = [
        f"Figure 1 reproduction{tiny}: one circle per model; x = median training steps/sec at "
        f"length {length}; y = {'mean over common tiny tasks' if lb.tiny else 'LRA average'}; "
        "circle area proportional to peak memory of the benchmark step."
    ]
    if table is not None and points:
        biggest = max((p.memory_bytes or 0) for p in points)
        sources = ", ".join(table.memory_sources) or "n/a"
        parts.append(f"Largest circle = {biggest / MIB:.1f} MiB (memory source: {sources}).")
    if missing:
        parts.append(
            "Missing (not plotted): " + "; ".join(f"{m}: {why}" for m, why in missing.items()) + "."
        )
    parts += notes
    return "\n".join(parts)


def save_figure(figure, out_dir, stem: str) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.svg`` atomically, text kept as text, reproducibly
    (no date or software stamp, a fixed SVG id salt)."""
    written = []
    rc = {"svg.fonttype": "none", "svg.hashsalt": f"lra-{stem}"}
    for fmt, meta in (("png", {"Software": None}), ("svg", {"Date": None})):
        buf = io.BytesIO()
        with matplotlib.rc_context(rc):
            figure.savefig(buf, format=fmt, dpi=150, bbox_inches="tight", metadata=meta)
        written.append(write_atomic(Path(out_dir) / f"{stem}.{fmt}", buf.getvalue()))
    return written


def write_figure1(fig1: Figure1, out_dir) -> list[Path]:
    """Write ``figure1.png``, ``figure1.svg`` (text kept as text) and ``figure1.md``."""
    out = Path(out_dir)
    written = save_figure(fig1.figure, out, "figure1")
    lines = [
        "# Figure 1" + (f" ({TINY_NOTE})" if fig1.tiny else ""),
        "",
        "![Figure 1](figure1.png)",
        "",
        fig1.caption.replace("\n", "\n\n"),
        "",
        f"| Model | train steps/sec at {fig1.length} | y | peak memory (MiB) |",
        "|---|---|---|---|",
    ]
    for p in fig1.points:
        mem = "" if p.memory_bytes is None else f"{p.memory_bytes / MIB:.1f}"
        lines.append(f"| {p.model} | {p.x:.2f} | {p.y:.2f} | {mem} |")
    lines += ["", f"y: {fig1.y_label}. Records behind every point: sources.json.", ""]
    written.append(write_atomic(out / "figure1.md", "\n".join(lines)))
    return written
