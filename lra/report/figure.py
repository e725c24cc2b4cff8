"""TransNormer's Figure 1 drawn (render step; the points come from :mod:`lra.report.figure_data`).

One circle per model: y = score, x = training steps/sec, circle area proportional to peak
memory. What the figure shows is on it:

* error bars: y = the score's 95% interval over seeds and test examples (the leaderboard's
  stratified bootstrap, asymmetric), or the sample standard deviation over seeds for a
  model whose records carry no predictions; x = min-max of the speed over the benchmark's
  timed windows;
* a legend with one entry per model (and one for the published points when drawn), and a
  second legend of three reference circles with their memory, so sizes can be read;
* point labels placed beside their circles where they overlap no other label (checked
  with the renderer's text extents); a label that finds no free place is left out, the
  legend still names the model;
* a caption under the plot naming the protocol, the task set, the device and sequence
  length of the benchmark, what the error bars are, the models not drawn and why.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no display needed).
"""

import io
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from lra.atomic import write_atomic
from lra.report.figure_data import (
    DEFAULT_LENGTH,
    REFERENCE_LEGEND,
    Figure1Data,
    Point,
    figure1_data,
)
from lra.report.load import MIB, TINY_NOTE

MAX_AREA = 2500.0  # points^2 of the largest circle
MIN_AREA = 30.0
LEGEND_FONT = 7.0
LABEL_FONT = 8.0
# Label directions around a circle: (dx, dy) unit offset, horizontal and vertical alignment.
DIRECTIONS = (
    (1, 0, "left", "center"),
    (0.71, 0.71, "left", "bottom"),
    (0.71, -0.71, "left", "top"),
    (0, 1, "center", "bottom"),
    (0, -1, "center", "top"),
    (-0.71, 0.71, "right", "bottom"),
    (-1, 0, "right", "center"),
    (-0.71, -0.71, "right", "top"),
)
GAPS = (3.0, 12.0, 24.0)  # points between the circle's edge and its label, tried in order

__all__ = ["DEFAULT_LENGTH", "Figure1", "figure1", "draw_figure1", "save_figure", "write_figure1"]


@dataclass
class Figure1:
    figure: Figure
    data: Figure1Data
    caption: str
    unlabelled: list[str] = field(default_factory=list)

    @property
    def points(self) -> list[Point]:
        return self.data.points

    @property
    def labels(self) -> list[str]:
        return self.data.labels

    @property
    def missing(self) -> dict[str, str]:
        return self.data.missing

    @property
    def length(self) -> int:
        return self.data.length

    @property
    def tiny(self) -> bool:
        return self.data.tiny

    @property
    def y_label(self) -> str:
        return self.data.y_label

    @property
    def reference(self) -> list[dict]:
        return self.data.reference

    def sources(self, root=None) -> dict:
        return self.data.sources(root)


# ---------------------------------------------------------------- circle sizes


def circle_area(memory_bytes, biggest) -> float:
    """Marker area (points^2) of a circle: proportional to memory, at least :data:`MIN_AREA`."""
    if not memory_bytes or not biggest:
        return MIN_AREA
    return max(MIN_AREA, MAX_AREA * float(memory_bytes) / float(biggest))


def _nice_floor(value: float) -> float:
    """The largest round number (1, 1.5, 2, 3, 4, 5, 6 or 8 times a power of ten) <= ``value``."""
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (8, 6, 5, 4, 3, 2, 1.5, 1) if m * power <= value * (1 + 1e-9))


def memory_scale(biggest_bytes: float) -> list[float]:
    """Three round memory values (bytes) for the circle-size legend, largest first."""
    top = _nice_floor(biggest_bytes / MIB)
    values = [top, _nice_floor(top / 4), _nice_floor(top / 16)]
    return [v * MIB for v in dict.fromkeys(values)]


def memory_text(value_bytes: float) -> str:
    mib = value_bytes / MIB
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


# ---------------------------------------------------------------- drawing


def _colors(n: int):
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _legend_label(p: Point) -> str:
    return p.label + (f" ({p.n_seeds} seeds)" if p.n_seeds > 1 else "")


def _errorbars(ax, p: Point, color) -> None:
    xerr = [[p.x - p.x_low], [p.x_high - p.x]]
    has_x = p.x_high > p.x_low
    if p.y_interval is not None:
        yerr = [[p.y - p.y_interval[0]], [p.y_interval[1] - p.y]]
    else:
        yerr = [[p.y_std], [p.y_std]] if p.y_std is not None else None
    if not has_x and yerr is None:
        return
    ax.errorbar(
        [p.x],
        [p.y],
        xerr=xerr if has_x else None,
        yerr=yerr,
        fmt="none",
        ecolor=color,
        elinewidth=1.2,
        capsize=3,
        zorder=3,
        label=f"_errorbar {p.label}",
    )


def _model_legend(ax, points, colors, data) -> Legend:
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            linestyle="none",
            markersize=7,
            markerfacecolor=c,
            markeredgecolor="black",
            alpha=0.8,
        )
        for c in colors
    ]
    labels = [_legend_label(p) for p in points]
    if data.reference:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                linestyle="none",
                markersize=7,
                markerfacecolor="none",
                markeredgecolor="0.45",
            )
        )
        lengths = sorted({str(r.get("speed_length") or "?") for r in data.reference})
        same = lengths == [str(data.length)]
        labels.append(
            f"{REFERENCE_LEGEND};\ntheir speed at length {', '.join(lengths)}"
            + ("" if same else f", not {data.length}")
            + "\n"
            + "\n".join(sorted({f"{r['source']}: {r['citation']}" for r in data.reference}))
        )
    legend = ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=LEGEND_FONT,
        title="Model",
        title_fontsize=LEGEND_FONT + 1,
    )
    legend.set_gid("models")
    return legend


def _memory_legend(ax, biggest) -> Legend | None:
    if not biggest:
        return None
    values = memory_scale(biggest)
    sizes = [math.sqrt(circle_area(v, biggest)) for v in values]  # diameters in points
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            linestyle="none",
            markersize=d,
            markerfacecolor="0.85",
            markeredgecolor="black",
            alpha=0.6,
        )
        for d in sizes
    ]
    # Circles are centred on their label's line; rows (and the title) spaced by the largest
    # diameter keep them clear of each other and of the title.
    span = max(sizes) / LEGEND_FONT  # the largest circle, in font sizes
    legend = Legend(
        ax,
        handles,
        [memory_text(v) for v in values],
        loc="upper left",
        bbox_to_anchor=(1.02, 0.0),
        borderaxespad=0.0,
        fontsize=LEGEND_FONT,
        title="Peak memory (circle area)",
        title_fontsize=LEGEND_FONT + 1,
        handlelength=span,
        labelspacing=span,
        borderpad=0.8,
    )
    legend.set_gid("memory")
    ax.add_artist(legend)
    # add_artist clips to the axes, which would keep the legend out of the saved (tight) box
    legend.set_clip_on(False)
    return legend


def _stack_below(ax, upper: Legend, lower: Legend, renderer) -> None:
    """Anchor ``lower`` just under ``upper`` (both right of the axes)."""
    bottom = upper.get_window_extent(renderer).y0
    y = ax.transAxes.inverted().transform((0.0, bottom - 10.0))[1]
    lower.set_bbox_to_anchor((1.02, y), transform=ax.transAxes)


def _bar_boxes(ax, points) -> list[Bbox]:
    """Display boxes of the error bars (a few pixels thick), to keep labels off them."""
    boxes = []
    for p in points:
        if p.x_high > p.x_low:
            (x0, y0), (x1, _) = ax.transData.transform([(p.x_low, p.y), (p.x_high, p.y)])
            boxes.append(Bbox.from_extents(x0, y0 - 3, x1, y0 + 3))
        if p.y_std is not None:
            (x0, y0), (_, y1) = ax.transData.transform([(p.x, p.y - p.y_std), (p.x, p.y + p.y_std)])
            boxes.append(Bbox.from_extents(x0 - 3, y0, x0 + 3, y1))
    return boxes


def place_labels(ax, items, renderer, marks=()) -> list[str]:
    """Annotate each ``(text, (x, y), radius in points, style)`` beside its circle.

    Tries the eight directions at growing gaps; takes the first place inside the axes (where
    no other text is: titles, ticks, legends and caption lie outside) that overlaps no label
    placed so far, preferring one that covers the fewest circles and ``marks`` (display
    boxes, e.g. error bars). Returns the texts that found no place (not drawn; the legend
    still names them).
    """
    scale = ax.figure.dpi / 72.0
    frame = ax.get_window_extent(renderer)
    taken = []
    centers = [ax.transData.transform(xy) for _, xy, _, _ in items]
    circles = [
        Bbox.from_extents(cx - r * scale, cy - r * scale, cx + r * scale, cy + r * scale)
        for (cx, cy), (_, _, r, _) in zip(centers, items, strict=True)
    ] + list(marks)
    left_out = []

    def label(text, xy, offset, ha, va, style, leader=None):
        return ax.annotate(
            text,
            xy,
            xytext=offset,
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=LABEL_FONT,
            arrowprops=leader,
            **style,
        )

    for text, xy, radius, style in items:
        best = None
        for gap in GAPS:
            for dx, dy, ha, va in DIRECTIONS:
                offset = ((radius + gap) * dx, (radius + gap) * dy)
                note = label(text, xy, offset, ha, va, style)
                box = note.get_window_extent(renderer)
                note.remove()
                padded = box.padded(2.0)
                inside = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
                if not inside or any(padded.overlaps(b) for b in taken):
                    continue
                covers = sum(padded.overlaps(c) for c in circles)
                if best is None or covers < best[0]:
                    best = (covers, offset, ha, va, box, gap)
                if covers == 0:
                    break
            if best is not None and best[0] == 0:
                break
        if best is None:
            left_out.append(text)
            continue
        _, offset, ha, va, box, gap = best
        leader = None
        if gap > GAPS[0]:  # a label set further out gets a thin line to its circle
            leader = {
                "arrowstyle": "-",
                "color": "0.55",
                "lw": 0.5,
                "shrinkA": 1,
                "shrinkB": radius,
            }
        label(text, xy, offset, ha, va, style, leader)
        taken.append(box)
    return left_out


def _y_error_text(data: Figure1Data) -> str:
    with_interval = [p.label for p in data.points if p.y_interval is not None]
    std = (
        "sample std over seeds of the per-seed score (seeds that ran every one of those "
        "tasks; none for one seed)"
    )
    if not with_interval:
        return f"error bar = {std}."
    text = (
        "error bar = 95% interval over seeds and test examples (the leaderboard's stratified "
        "bootstrap, tasks resampled then averaged; docs/statistics.md)"
    )
    without = [p.label for p in data.points if p.y_interval is None]
    if without:
        text += f"; without per-example predictions ({', '.join(without)}): {std}"
    return text + "."


def _rounds_text(data: Figure1Data) -> str:
    rounds = sorted({p.rounds for p in data.points})
    counts = (
        "-".join(str(r) for r in (rounds[0], rounds[-1])) if len(rounds) > 1 else str(rounds[0])
    )
    return f"{counts} benchmark round(s), each a fresh process"


def caption_text(data: Figure1Data) -> str:
    """The caption: protocol, task set, device, length, error bars, missing models, notes."""
    s = data.table.setting if data.table is not None else {}
    tiny = f", {TINY_NOTE}" if data.tiny else ""
    y_what = "mean test accuracy over the tasks every model has" if data.tiny else "LRA average"
    parts = [
        f"Protocol: {data.protocol}. Task set: {data.task_set} ({', '.join(data.y_tasks)}{tiny}).",
        f"y = {y_what}; " + _y_error_text(data),
        f"x = median training steps/sec at sequence length {data.length} on "
        f"{s.get('task', '?')} (batch {s.get('batch_size', '?')}, {s.get('precision', '?')}) on "
        f"{data.device} ({s.get('platform', '?')}), from lra-bench; error bar = min-max over "
        f"the timed windows, pooled over {_rounds_text(data)}.",
    ]
    memories = [p.memory_bytes for p in data.points if p.memory_bytes]
    if memories:
        sources = ", ".join(data.table.memory_sources) or "n/a"
        parts.append(
            f"Circle area proportional to peak memory of the benchmark step (largest "
            f"{max(memories) / MIB:.1f} MiB; source: {sources})."
        )
    else:
        parts.append("No peak memory in the benchmark records: all circles drawn small.")
    if data.missing:
        parts.append(
            "Not drawn: "
            + "; ".join(f"{m}: {why}" for m, why in sorted(data.missing.items()))
            + "."
        )
    parts += data.notes
    return "\n".join(parts)


def draw_figure1(data: Figure1Data) -> Figure1:
    """Draw the points of :func:`~lra.report.figure_data.figure1_data`;
    :func:`write_figure1` writes."""
    fig = Figure(figsize=(10, 6.5))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.08, 0.1, 0.6, 0.8))
    points = data.points
    colors = _colors(len(points))
    memories = [p.memory_bytes for p in points if p.memory_bytes]
    biggest = max(memories) if memories else None
    areas = [circle_area(p.memory_bytes, biggest) for p in points]
    measured = ax.scatter(
        [p.x for p in points],
        [p.y for p in points],
        s=areas,
        c=colors,
        alpha=0.6,
        edgecolors="black",
        linewidths=0.8,
        zorder=2,
    )
    measured.set_gid("measured")
    for p, color in zip(points, colors, strict=True):
        _errorbars(ax, p, color)
    if data.reference:
        ref = ax.scatter(
            [r["train_steps_per_sec"] for r in data.reference],
            [r["lra_average"] for r in data.reference],
            s=120,
            facecolors="none",
            edgecolors="0.45",
            linestyle="--",
            zorder=2,
        )
        ref.set_gid("published")
    ax.margins(0.15)
    ax.set_xlabel(f"Training speed (steps per sec) at length {data.length}, {data.device}")
    ax.set_ylabel(textwrap.fill(data.y_label, 60))
    title = (
        "TransNormer Figure 1 reproduction: score vs training speed (circle area = memory)\n"
        f"protocol {data.protocol}, {data.task_set} tasks, length {data.length}, {data.device}"
    )
    ax.set_title(title + (f"\n({TINY_NOTE})" if data.tiny else ""), fontsize=10)
    ax.grid(alpha=0.3)

    models = _model_legend(ax, points, colors, data)
    memory = _memory_legend(ax, biggest)
    fig.canvas.draw()  # lays out ticks and legends, so their extents below are final
    renderer = fig.canvas.get_renderer()
    if memory is not None:
        _stack_below(ax, models, memory, renderer)
        fig.canvas.draw()
    caption = caption_text(data)
    boxes = [ax.get_tightbbox(renderer), models.get_window_extent(renderer)]
    if memory is not None:
        boxes.append(memory.get_window_extent(renderer))
    width, height = fig.bbox.width, fig.bbox.height
    bottom = min(b.y0 for b in boxes) - 8.0
    fig.text(
        ax.get_tightbbox(renderer).x0 / width,
        bottom / height,
        "\n".join(textwrap.fill(p, 125) for p in caption.split("\n")),
        va="top",
        ha="left",
        fontsize=LEGEND_FONT,
        gid="caption",
    )
    items = [
        (p.label, (p.x, p.y), math.sqrt(a) / 2, {}) for p, a in zip(points, areas, strict=True)
    ]
    items += [
        (
            r["label"],
            (r["train_steps_per_sec"], r["lra_average"]),
            math.sqrt(120.0) / 2,
            {"color": "0.4", "style": "italic"},
        )
        for r in data.reference
    ]
    unlabelled = place_labels(ax, items, renderer, _bar_boxes(ax, points))
    return Figure1(fig, data, caption, unlabelled)


def figure1(
    boards,
    tables,
    *,
    length: int = DEFAULT_LENGTH,
    published: list[dict] | None = None,
) -> Figure1:
    """Build and draw Figure 1 from leaderboard(s) and efficiency tables."""
    return draw_figure1(figure1_data(boards, tables, length=length, published=published))


# ---------------------------------------------------------------- files


FORMATS = (
    ("png", {"Software": None}),
    ("svg", {"Date": None}),
    ("pdf", {"CreationDate": None, "Producer": None, "Creator": None}),
)


def save_figure(figure, out_dir, stem: str) -> list[Path]:
    """Write ``<stem>.png``, ``<stem>.svg`` and ``<stem>.pdf`` (vector, fonts embedded as
    TrueType) atomically, SVG text kept as text, reproducibly (no date or software stamp, a
    fixed SVG id salt)."""
    written = []
    rc = {"svg.fonttype": "none", "svg.hashsalt": f"lra-{stem}", "pdf.fonttype": 42}
    for fmt, meta in FORMATS:
        buf = io.BytesIO()
        with matplotlib.rc_context(rc):
            figure.savefig(buf, format=fmt, dpi=150, bbox_inches="tight", metadata=meta)
        written.append(write_atomic(Path(out_dir) / f"{stem}.{fmt}", buf.getvalue()))
    return written


def write_figure1(fig1: Figure1, out_dir) -> list[Path]:
    """Write ``figure1.png``, ``figure1.svg`` (text kept as text), ``figure1.pdf`` and
    ``figure1.md``."""
    out = Path(out_dir)
    written = save_figure(fig1.figure, out, "figure1")
    data = fig1.data
    lines = [
        "# Figure 1" + (f" ({TINY_NOTE})" if data.tiny else ""),
        "",
        "![Figure 1](figure1.png)",
        "",
        fig1.caption.replace("\n", "\n\n"),
        "",
        f"| Model | train steps/sec at {data.length} (min-max over windows) | y ± std over "
        "seeds (n) | peak memory (MiB) |",
        "|---|---|---|---|",
    ]
    for p in data.points:
        mem = "" if p.memory_bytes is None else f"{p.memory_bytes / MIB:.1f}"
        std = "" if p.y_std is None else f" ± {p.y_std:.2f}"
        lines.append(
            f"| {p.label} | {p.x:.2f} ({p.x_low:.2f}-{p.x_high:.2f}) | {p.y:.2f}{std} "
            f"(n={p.n_seeds}) | {mem} |"
        )
    if data.reference:
        lines += [
            "",
            "Published points (hollow): published LRA average and training steps/sec.",
            "",
            "| Point | source | steps/sec (length) | LRA average | hardware |",
            "|---|---|---|---|---|",
        ]
        for r in data.reference:
            lines.append(
                f"| {r['label']} | {r['citation']} | {r['train_steps_per_sec']:.2f} "
                f"({r.get('speed_length')}) | {r['lra_average']:.2f} | {r.get('hardware', '')} |"
            )
    lines += ["", f"y: {data.y_label}. Records behind every point: sources.json.", ""]
    written.append(write_atomic(out / "figure1.md", "\n".join(lines)))
    return written
