"""Performance profiles, rliable-style: ``profiles.{png,svg,pdf}``.

Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice"
(NeurIPS 2021), Sec. 4: a model's performance profile is the fraction of its runs scoring
above ``tau``, for every ``tau``: here a run is one seed on one of the five tasks of the
average (each seed's test accuracy, percent), so a curve shows the spread of a model's
runs where a mean would hide it; a curve that lies above another everywhere dominates it.
The fraction is the empirical survival function (:func:`scipy.stats.ecdf`). One figure per
protocol, one line per leaderboard row with all five tasks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from scipy import stats

from lra.report.figure import save_figure
from lra.report.load import TINY_NOTE

TAUS = np.linspace(0.0, 100.0, 401)


def runs_of(board) -> dict[str, np.ndarray]:
    """``{row label: the seed accuracies (percent) of its cells on the five tasks}``, for
    the rows that have all five."""
    out = {}
    for row in board.rows:
        if all(t in row.cells for t in board.tasks):
            out[row.label] = np.array([v for t in board.tasks for v in row.cells[t].values])
    return out


def profile(scores: np.ndarray, taus: np.ndarray = TAUS) -> np.ndarray:
    """The fraction of ``scores`` strictly above each of ``taus``."""
    return stats.ecdf(scores).sf.evaluate(taus)


def draw_profiles(board):
    runs = runs_of(board)
    if not runs:
        return None
    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = colormaps["tab20"](np.linspace(0, 1, max(len(runs), 2)))
    for (label, scores), color in zip(runs.items(), colors, strict=False):
        ax.step(TAUS, profile(scores), where="post", color=color, label=f"{label} ({len(scores)})")
    tiny = f" ({TINY_NOTE})" if board.tiny else ""
    ax.set_xlabel(f"test accuracy tau (%) over {', '.join(board.tasks)}{tiny}")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_title(f"Performance profiles, protocol {board.protocol} (runs = seeds x tasks)")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2, title="model (runs)", title_fontsize=7)
    fig.tight_layout()
    return fig


def write_profiles(boards, out_dir) -> list[Path]:
    """``profiles.{png,svg,pdf}`` (``profiles_<protocol>`` with several protocols)."""
    written = []
    for board in boards:
        fig = draw_profiles(board)
        if fig is None:
            continue
        stem = "profiles" if len(boards) == 1 else f"profiles_{board.protocol}"
        written += save_figure(fig, out_dir, stem)
    return written
