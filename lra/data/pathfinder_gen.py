"""Pathfinder / Path-X image generator: seeded, parallel, resumable.

Source: the Pathfinder task of Linsley et al. 2018, "Learning long-range
spatial dependencies with horizontal gated recurrent units" (NeurIPS), as used
by Long-Range Arena (Tay et al. 2020): two marker discs; is there a path of
paddles between them? REFERENCE.md sections 2 and 4. The code is written for
this project from that description; the original generator's logic was read,
not copied.

Parameters (:func:`params_for`; lengths in output pixels):

==========================  =======  =======  =======
field                       32       64       128
==========================  =======  =======  =======
padding                     1        1        1
seed_distance               7        12       20
marker_radius               1.5      2.5      3
paddle_length               2        5        5
paddle_thickness            0.5      1        1.5
paddle_margins (per image)  (1,)     (1,)     (2, 3)
continuity                  1.0      1.8      1.8
snake_contrast              2.0      0.8      0.9
paddle_contrast             0.75     1.0      1.0
distractor_budget N         20       22       35
==========================  =======  =======  =======

Difficulty (:data:`DIFFICULTIES`) sets ``contour_length``, the number of
paddles of each target snake: 6, 9 or 14 (``curv_contour_length_14`` is the
LRA "hard" setting). Distractor snakes have ``contour_length // 3`` paddles.

Choices (where REFERENCE leaves room):

- Distractor count = ``N // (contour_length // 3)``, i.e. recomputed per
  difficulty, so the distractor paddle budget stays about N (REFERENCE's
  rising means 13 / 16 / 20 fit a constant distractor mass plus the longer
  targets). Measured mean pixel at 32 px: about 17.1 / 17.8 / 19.5; keeping
  the baseline count N // 2 at every difficulty gives 17.1 / 19.8 / 20.7. In
  hard 32-px images only about half of the distractors fit: the image is full.
- Margin at 128: REFERENCE says "2 or 3"; one of (2, 3) is drawn per image
  (the original drew the margin per image from a list) and recorded in field 9
  of the metadata line.
- Contrast: target paddles are drawn at ``snake_contrast * paddle_contrast``,
  distractor paddles at ``snake_contrast``, markers at 1.0 (as in the original
  generator); the image is then rescaled so its maximum is 255.
- Geometry is exact, not raster: snake ``s`` is a chain of steps
  ``Q_k -> Q_k+1`` of length ``paddle_length + 2 * margin``; the paddle of a
  step is its middle ``paddle_length`` (so paddles are separated by gaps of
  ``2 * margin``). Each step turns by ``d`` from the previous direction with
  weight ``cos(continuity * d) ** 2`` for ``|d| < pi / (2 * continuity)``
  (smooth continuation), over 32 jittered candidate angles, of which only
  those whose step keeps a clearance ``2 * margin + paddle_thickness`` from
  every other step already placed (other snakes, and this snake except the
  step before) and stays inside the padding are eligible. A snake with no
  eligible step is discarded: the target pair is then regrown from scratch, a
  distractor retried (8 tries each, then skipped: the image is "nearly full").
  Target snakes grow alternately; at a dead end the blocked snake may first
  retract its last step and grow again (at most ``contour_length`` retractions
  per pair), which makes 64 and 128 px about 3-4x faster than always
  regrowing the pair, with the same mean intensities. Measured CPU time per
  image (one core): 32 px 0.021 / 0.025 / 0.085 s (baseline / 9 / 14),
  64 px hard 0.11 s, 128 px hard 0.046 s.
- The first target tip is drawn in the central square at least
  ``2 * seed_distance`` from the border (as in the original), the second tip
  ``seed_distance`` away in a uniform direction. The four target tips must
  also keep ``marker_radius + clearance`` from the other target snake and
  ``2 * marker_radius + clearance`` from its tips (tested for all four tips,
  so acceptance never depends on the label); the two marked tips are then
  obstacles for distractors with the same clearance.
- Markers: the label is uniform; one disc on the seed tip of a uniformly chosen
  target snake, the other on the far tip of the same snake (label 1) or of the
  other one (label 0).
- Rendering: every paddle (round caps) and disc is drawn with a linear-ramp
  coverage on a 2x grid, combined by maximum, then 2x2 box-averaged.
- Since clearance > 2 * 0.71 + 1, the pixels within 0.71 px of the snakes'
  visible polylines (plus the marker discs) form one 4-connected component per
  snake, and different snakes never share or 4-touch a pixel: that mask,
  ``info["occupancy"]``, is an exact ground truth (flood-fill one marker;
  the other is reached iff label == 1).

Layout written by :func:`write_pathfinder` (the release archive's, REFERENCE
section 2): ``root/pathfinder{res}/{difficulty}/imgs/<b>/sample_<i>.png``
(8-bit grayscale, ``i`` restarts at 0 in every batch) and
``metadata/<b>.npy``, a TEXT file despite the suffix, one line per image:
``imgs/<b> sample_<i>.png <i> <label> <continuity> <contour_length>
<distractor_length> <paddle_length> <paddle_thickness> <margin> 1``, plus
``generator.json`` (params, seed, counts). Batch ``b`` draws from its own
generator seeded by ``SeedSequence(seed, spawn_key=(resolution,
contour_length, b))``, so the files depend on the arguments only, not on the
worker count or on interruptions. A batch's metadata file is written (via a
temporary file and ``os.replace``, as every PNG is) only after all its images;
it marks the batch complete. A rerun skips complete batches and regenerates
incomplete ones from scratch (stray temporary files of a killed batch are
removed). Do not run two writers on one folder at once.

Parallel runs use a ``spawn`` :class:`multiprocessing.pool.Pool` whose workers
ignore SIGINT and count every finished image in a shared counter; the parent
polls its results every :data:`_POLL_SECONDS`, so the progress bar moves per
image and Ctrl-C (or any exception in the parent) terminates the workers
within about a second, leaving the complete batches in place, then re-raises.
While the pool runs, SIGTERM (when its handler is the default one, in the main
thread) raises ``SystemExit(143)`` in the parent the same way, instead of
killing the parent alone and orphaning its workers.
A worker that dies (e.g. a script without an ``if __name__ == '__main__':``
guard, re-run by every spawned worker) raises DataError; an exception raised
in a worker is re-raised in the parent.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import shutil
import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from lra.atomic import atomic_file, write_atomic
from lra.data.workers import worker_count
from lra.errors import DataError

DIFFICULTIES = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}
RESOLUTIONS = (32, 64, 128)

#: Bump when a change would alter generated images; recorded in generator.json.
ALGORITHM_VERSION = 1
GENERATOR_FILE = "generator.json"

_FIELDS = (
    "padding seed_distance marker_radius paddle_length paddle_thickness paddle_margins "
    "continuity snake_contrast paddle_contrast distractor_budget"
).split()
_TABLE = {  # the module docstring's table, column by column
    32: dict(zip(_FIELDS, (1, 7.0, 1.5, 2, 0.5, (1,), 1.0, 2.0, 0.75, 20), strict=True)),
    64: dict(zip(_FIELDS, (1, 12.0, 2.5, 5, 1.0, (1,), 1.8, 0.8, 1.0, 22), strict=True)),
    128: dict(zip(_FIELDS, (1, 20.0, 3.0, 5, 1.5, (2, 3), 1.8, 0.9, 1.0, 35), strict=True)),
}

_NUM_DIRECTIONS = 32  # candidate angles per step
_MAX_TARGET_ATTEMPTS = 2000  # regrowths of the target pair before giving up
_DISTRACTOR_TRIES = 8  # placements tried per distractor before skipping it
_BACKTRACKS = 1  # step retractions per target step before regrowing the pair
_OCCUPANCY_RADIUS = 0.71  # > sqrt(2) / 2: a polyline's pixels are 4-connected
_POLL_SECONDS = 0.25  # how often the parent updates progress and checks its workers


class PathfinderSettingError(DataError, ValueError):
    """An unknown resolution or difficulty (also a ValueError)."""


@dataclass(frozen=True)
class PathfinderParams:
    """Generator parameters of one resolution and difficulty (see the module table)."""

    resolution: int
    contour_length: int
    padding: int
    seed_distance: float
    marker_radius: float
    paddle_length: int
    paddle_thickness: float
    paddle_margins: tuple[int, ...]
    continuity: float
    snake_contrast: float
    paddle_contrast: float
    distractor_budget: int
    distractor_length: int
    num_distractors: int
    antialias_scale: int = 2


def params_for(resolution: int, difficulty: str) -> PathfinderParams:
    """The :class:`PathfinderParams` of ``resolution`` (32, 64 or 128) and ``difficulty``
    (a key of :data:`DIFFICULTIES`); anything else raises PathfinderSettingError
    (a ValueError and DataError) naming the allowed values."""
    if resolution not in _TABLE:
        raise PathfinderSettingError(
            f"Pathfinder resolution {resolution!r} is not supported; use one of {RESOLUTIONS}"
        )
    if difficulty not in DIFFICULTIES:
        raise PathfinderSettingError(
            f"Pathfinder difficulty {difficulty!r} is unknown; use one of {sorted(DIFFICULTIES)}"
        )
    row = _TABLE[resolution]
    contour_length = DIFFICULTIES[difficulty]
    distractor_length = contour_length // 3
    return PathfinderParams(
        resolution=int(resolution),
        contour_length=contour_length,
        distractor_length=distractor_length,
        num_distractors=row["distractor_budget"] // distractor_length,
        **row,
    )


# ---------------------------------------------------------------------------
# Geometry


def _point_segment_d2(py, px, ay, ax, by, bx):
    """Squared distance from points ``(py, px)`` to segments ``a-b`` (coordinates as
    separate broadcastable arrays)."""
    dy, dx = by - ay, bx - ax
    qy, qx = py - ay, px - ax
    t = np.minimum(np.maximum((qy * dy + qx * dx) / np.maximum(dy * dy + dx * dx, 1e-12), 0.0), 1.0)
    ey, ex = qy - t * dy, qx - t * dx
    return ey * ey + ex * ex


def _point_segment_distance(p, a, b):
    """Distance from points ``p`` to segments ``a-b`` (all ``[..., 2]``, broadcast)."""
    return np.sqrt(
        _point_segment_d2(p[..., 0], p[..., 1], a[..., 0], a[..., 1], b[..., 0], b[..., 1])
    )


def _segment_d2(p1y, p1x, q1y, q1x, p2y, p2x, q2y, q2x):
    """Squared distance between segments ``p1-q1`` and ``p2-q2`` (coordinates as
    separate broadcastable arrays)."""
    d2 = np.minimum(
        np.minimum(
            _point_segment_d2(p1y, p1x, p2y, p2x, q2y, q2x),
            _point_segment_d2(q1y, q1x, p2y, p2x, q2y, q2x),
        ),
        np.minimum(
            _point_segment_d2(p2y, p2x, p1y, p1x, q1y, q1x),
            _point_segment_d2(q2y, q2x, p1y, p1x, q1y, q1x),
        ),
    )
    ry, rx = q1y - p1y, q1x - p1x
    sy, sx = q2y - p2y, q2x - p2x
    side_p2 = ry * (p2x - p1x) - rx * (p2y - p1y)
    side_q2 = ry * (q2x - p1x) - rx * (q2y - p1y)
    side_p1 = sy * (p1x - p2x) - sx * (p1y - p2y)
    side_q1 = sy * (q1x - p2x) - sx * (q1y - p2y)
    crossing = (side_p2 * side_q2 < 0) & (side_p1 * side_q1 < 0)
    return np.where(crossing, 0.0, d2)


class _Obstacles:
    """Placed steps and marker points, each with the clearance a new step must keep."""

    def __init__(self, capacity: int = 256):
        self.a = np.zeros((capacity, 2))
        self.b = np.zeros((capacity, 2))
        self.req = np.zeros(capacity)
        self.n = 0

    def add(self, a, b, req: float) -> int:
        if self.n == len(self.req):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
            self.b = np.concatenate([self.b, np.zeros_like(self.b)])
            self.req = np.concatenate([self.req, np.zeros_like(self.req)])
        self.a[self.n], self.b[self.n], self.req[self.n] = a, b, req
        self.n += 1
        return self.n - 1

    def clear(self, starts, ends, skip: int | None):
        """bool[K]: whether each candidate step ``starts[k] -> ends[k]`` keeps clear."""
        a, b, req = self.a[: self.n], self.b[: self.n], self.req[: self.n]
        # Only obstacles within reach of the candidates' bounding disc can block them.
        centre = (starts.min(0) + starts.max(0) + ends.min(0) + ends.max(0)) / 4
        spread = np.sqrt(
            np.maximum(((starts - centre) ** 2).sum(-1), ((ends - centre) ** 2).sum(-1)).max()
        )
        reach = np.maximum(spread + req, 0.0)
        near = _point_segment_d2(centre[0], centre[1], a[:, 0], a[:, 1], b[:, 0], b[:, 1]) < (
            reach * reach
        )
        if skip is not None:
            near[skip] = False
        if not near.any():
            return np.ones(len(ends), bool)
        a, b, req = a[near], b[near], req[near]
        d2 = _segment_d2(
            starts[:, 0, None],
            starts[:, 1, None],
            ends[:, 0, None],
            ends[:, 1, None],
            a[None, :, 0],
            a[None, :, 1],
            b[None, :, 0],
            b[None, :, 1],
        )
        return (d2 >= (req * req)[None]).all(1)


class _Snake:
    """One snake under construction: its step points, directions and step ids."""

    def __init__(self, tip):
        self.tip = np.asarray(tip, float)
        self.points: list[np.ndarray] = []  # Q_0 .. Q_n
        self.units: list[np.ndarray] = []  # direction of step k
        self.steps: list[int] = []  # obstacle index of step k
        self.angle = 0.0  # direction of the last step (radians, y = sin)

    def paddles(self, margin: float) -> np.ndarray:
        """float[n, 2, 2]: the drawn segment of each step, (y, x) points."""
        q = np.asarray(self.points)
        u = np.asarray(self.units)
        return np.stack([q[:-1] + margin * u, q[1:] - margin * u], 1)

    def polyline(self, margin: float) -> np.ndarray:
        """float[n + 1, 2]: visible polyline from the first to the last paddle tip."""
        q = np.array(self.points)
        q[0] = q[0] + margin * self.units[0]
        q[-1] = q[-1] - margin * self.units[-1]
        return q


class _Scene:
    def __init__(self, params: PathfinderParams, margin: int):
        self.p = params
        self.margin = float(margin)
        self.step = params.paddle_length + 2.0 * margin
        self.clearance = 2.0 * margin + params.paddle_thickness
        self.lo = float(params.padding)
        self.hi = float(params.resolution - 1 - params.padding)
        self.obstacles = _Obstacles()

    def retract(self, snake: _Snake) -> None:
        """Removes the last step of ``snake``."""
        self.obstacles.req[snake.steps.pop()] = -np.inf  # never blocks again
        snake.units.pop()
        snake.points.pop()
        if not snake.steps:
            snake.points.clear()
        else:
            u = snake.units[-1]
            snake.angle = float(np.arctan2(u[0], u[1]))

    def inside(self, pts):
        return ((pts >= self.lo) & (pts <= self.hi)).all(-1)

    def extend(self, snake: _Snake, rng: np.random.Generator) -> bool:
        """Adds one step to ``snake``; False if no candidate step is clear."""
        k = np.arange(_NUM_DIRECTIONS)
        if not snake.points:  # first step: any direction; the tip sits `margin` inside it
            angles = (k + rng.random()) * (2 * np.pi / _NUM_DIRECTIONS)
            weights = np.ones(_NUM_DIRECTIONS)
        else:
            c = self.p.continuity
            half = np.pi / (2 * c)
            turns = -half + (k + rng.random()) * (2 * half / _NUM_DIRECTIONS)
            angles = snake.angle + turns
            weights = np.cos(c * turns) ** 2
        units = np.stack([np.sin(angles), np.cos(angles)], -1)
        if snake.points:
            starts = np.broadcast_to(snake.points[-1], units.shape)
            skip = snake.steps[-1]
        else:
            starts = snake.tip - self.margin * units
            skip = None
        ends = starts + self.step * units
        valid = self.inside(ends) & self.inside(starts)
        if valid.any():
            valid[valid] = self.obstacles.clear(starts[valid], ends[valid], skip)
        cum = np.cumsum(weights * valid)
        if cum[-1] <= 0:
            return False
        i = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)
        if not snake.points:
            snake.points.append(starts[i].copy())
        snake.points.append(ends[i].copy())
        snake.units.append(units[i].copy())
        snake.angle = float(angles[i])
        snake.steps.append(self.obstacles.add(starts[i], ends[i], self.clearance))
        return True


def _grow_targets(scene: _Scene, rng: np.random.Generator) -> list[_Snake] | None:
    p = scene.p
    res = p.resolution
    lo, hi = 2 * p.seed_distance, res - 1 - 2 * p.seed_distance
    if lo > hi:
        lo, hi = scene.lo, scene.hi
    tip_a = rng.uniform(lo, hi, 2)
    for _ in range(100):
        phi = rng.uniform(0, 2 * np.pi)
        tip_b = tip_a + p.seed_distance * np.array([np.sin(phi), np.cos(phi)])
        if scene.inside(tip_b):
            break
    else:
        return None
    snakes = [_Snake(tip_a), _Snake(tip_b)]
    backtracks = _BACKTRACKS * p.contour_length
    while True:
        # Grow the shorter snake (the first on ties): the two alternate.
        snake = min(snakes, key=lambda s: len(s.steps))
        if len(snake.steps) == p.contour_length:
            break
        if scene.extend(snake, rng):
            continue
        if backtracks == 0 or not snake.steps:
            return None
        backtracks -= 1
        scene.retract(snake)
    # Marker discs on any tip must not touch the other snake or its tips.
    r = p.marker_radius
    for s, snake in enumerate(snakes):
        other = snakes[1 - s]
        q = np.asarray(other.points)
        line = snake.polyline(scene.margin)
        other_line = other.polyline(scene.margin)
        for tip in (line[0], line[-1]):
            if _point_segment_distance(tip, q[:-1], q[1:]).min() < r + scene.clearance:
                return None
            for other_tip in (other_line[0], other_line[-1]):
                if np.hypot(*(tip - other_tip)) < 2 * r + scene.clearance:
                    return None
    return snakes


def _grow_distractors(scene: _Scene, rng: np.random.Generator) -> list[_Snake]:
    p = scene.p
    placed = []
    for _ in range(p.num_distractors):
        for _ in range(_DISTRACTOR_TRIES):
            n0 = scene.obstacles.n
            snake = _Snake(rng.uniform(scene.lo, scene.hi, 2))
            if all(scene.extend(snake, rng) for _ in range(p.distractor_length)):
                placed.append(snake)
                break
            scene.obstacles.n = n0  # discard the partial snake
    return placed


# ---------------------------------------------------------------------------
# Rendering


def _box(lo_y, hi_y, lo_x, hi_x, scale: int, size: int):
    """Index ranges of the ``scale``-x grid cells whose centres lie in the box."""
    rows = (
        max(0, math.floor((lo_y + 0.5) * scale - 0.5)),
        min(size, math.ceil((hi_y + 0.5) * scale - 0.5) + 1),
    )
    cols = (
        max(0, math.floor((lo_x + 0.5) * scale - 0.5)),
        min(size, math.ceil((hi_x + 0.5) * scale - 0.5) + 1),
    )
    return rows, cols


def _segment_field(a, b, reach: float, scale: int, size: int):
    """Distances from the centres of a ``scale``-x grid to segment ``a-b`` over its
    bounding box grown by ``reach``; returns ``(rows, cols, dist)`` or None."""
    (r0, r1), (c0, c1) = _box(
        min(a[0], b[0]) - reach,
        max(a[0], b[0]) + reach,
        min(a[1], b[1]) - reach,
        max(a[1], b[1]) + reach,
        scale,
        size,
    )
    if r0 >= r1 or c0 >= c1:
        return None
    ys = (np.arange(r0, r1) + 0.5) / scale - 0.5
    xs = (np.arange(c0, c1) + 0.5) / scale - 0.5
    py = ys[:, None] - a[0]
    px = xs[None, :] - a[1]
    dy, dx = b[0] - a[0], b[1] - a[1]
    length2 = dy * dy + dx * dx
    t = np.clip((py * dy + px * dx) / length2, 0.0, 1.0) if length2 > 0 else 0.0
    return (r0, r1), (c0, c1), np.hypot(py - t * dy, px - t * dx)


def _draw(canvas, a, b, radius: float, value: float, scale: int) -> None:
    """Max-composites a round-capped stroke of half-width ``radius`` (output px)."""
    field = _segment_field(a, b, radius + 1.0 / scale, scale, canvas.shape[0])
    if field is None:
        return
    (r0, r1), (c0, c1), dist = field
    cover = np.clip((radius - dist) * scale + 0.5, 0.0, 1.0)
    np.maximum(canvas[r0:r1, c0:c1], value * cover, out=canvas[r0:r1, c0:c1])


def _mark(mask, a, b, radius: float) -> None:
    field = _segment_field(a, b, radius, 1, mask.shape[0])
    if field is not None:
        (r0, r1), (c0, c1), dist = field
        mask[r0:r1, c0:c1] |= dist <= radius


def generate_image(
    params: PathfinderParams, rng: np.random.Generator
) -> tuple[np.ndarray, int, dict]:
    """One Pathfinder image.

    Returns ``(image, label, info)``: ``image`` uint8[H, W] (H = W = resolution,
    0..255, max 255), ``label`` 1 if both markers sit on one snake else 0, and
    ``info`` with ``markers`` [(y, x), (y, x)] (float pixel coordinates, pixel
    centres at integers), ``marker_snakes`` (indices into ``paths``), ``paths``
    (float[n + 1, 2] visible polyline of every snake, the two targets first),
    ``target_paths`` (``paths[:2]``), ``paddles`` (float[n, 2, 2] per snake),
    ``occupancy`` (bool[H, W]: pixels within 0.71 px of a polyline or inside a
    marker disc; one 4-connected component per snake), ``margin`` (int),
    ``num_distractors`` (placed) and ``origin`` (the target with the seed marker).
    """
    margins = params.paddle_margins
    margin = int(margins[int(rng.integers(len(margins)))]) if len(margins) > 1 else margins[0]
    label = int(rng.integers(2))
    origin = int(rng.integers(2))
    for _ in range(_MAX_TARGET_ATTEMPTS):
        scene = _Scene(params, margin)
        targets = _grow_targets(scene, rng)
        if targets is not None:
            break
    else:
        raise RuntimeError(f"could not place two target snakes with {params}")
    end = origin if label == 1 else 1 - origin
    lines = [t.polyline(scene.margin) for t in targets]
    markers = [lines[origin][0], lines[end][-1]]
    for m in markers:
        scene.obstacles.add(m, m, params.marker_radius + scene.clearance)
    distractors = _grow_distractors(scene, rng)
    snakes = targets + distractors

    res, scale = params.resolution, params.antialias_scale
    canvas = np.zeros((res * scale, res * scale))
    half = params.paddle_thickness / 2
    target_value = params.snake_contrast * params.paddle_contrast
    paddles = [s.paddles(scene.margin) for s in snakes]
    for i, segs in enumerate(paddles):
        value = target_value if i < 2 else params.snake_contrast
        for a, b in segs:
            _draw(canvas, a, b, half, value, scale)
    for m in markers:
        _draw(canvas, m, m, params.marker_radius, 1.0, scale)
    small = canvas.reshape(res, scale, res, scale).mean((1, 3))
    image = np.round(small * (255.0 / small.max())).astype(np.uint8)

    occupancy = np.zeros((res, res), bool)
    paths = lines + [s.polyline(scene.margin) for s in distractors]
    for line in paths:
        for a, b in zip(line[:-1], line[1:], strict=True):
            _mark(occupancy, a, b, _OCCUPANCY_RADIUS)
    for m in markers:
        _mark(occupancy, m, m, params.marker_radius)
    info = {
        "markers": [tuple(float(v) for v in m) for m in markers],
        "marker_snakes": (origin, end),
        "paths": paths,
        "target_paths": paths[:2],
        "paddles": paddles,
        "occupancy": occupancy,
        "margin": margin,
        "num_distractors": len(distractors),
        "origin": origin,
    }
    return image, label, info


# ---------------------------------------------------------------------------
# Writing the official layout


def _batch_rng(seed: int, params: PathfinderParams, batch: int) -> np.random.Generator:
    key = (params.resolution, params.contour_length, batch)
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=key))


def _metadata_line(batch: int, i: int, label: int, params: PathfinderParams, margin: int) -> str:
    p = params
    return (
        f"imgs/{batch} sample_{i}.png {i} {label} {p.continuity!r} {p.contour_length} "
        f"{p.distractor_length} {p.paddle_length} {p.paddle_thickness!r} {margin} 1"
    )


def _write_batch(folder, params, seed, batch, count, on_image=None) -> int:
    """Generates batch ``batch`` (``count`` images) into ``folder`` from scratch."""
    folder = Path(folder)
    img_dir = folder / "imgs" / str(batch)
    if img_dir.exists():
        shutil.rmtree(img_dir)
    img_dir.mkdir(parents=True)
    rng = _batch_rng(seed, params, batch)
    lines = []
    for i in range(count):
        image, label, info = generate_image(params, rng)
        path = img_dir / f"sample_{i}.png"
        with atomic_file(path) as tmp:
            Image.fromarray(image).save(tmp, format="PNG")
        lines.append(_metadata_line(batch, i, label, params, info["margin"]))
        if on_image is not None:
            on_image()
    meta = folder / "metadata" / f"{batch}.npy"
    write_atomic(meta, "\n".join(lines) + "\n")
    return count


_images_done = None  # in a pool worker: the shared counter of finished images


def _init_worker(counter) -> None:
    """Pool initializer: the parent handles Ctrl-C (and terminates the workers)."""
    global _images_done
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _images_done = counter


def _count_image() -> None:
    with _images_done.get_lock():
        _images_done.value += 1


def _pool_batch(folder: str, params: PathfinderParams, seed: int, batch: int, count: int) -> int:
    return _write_batch(folder, params, seed, batch, count, on_image=_count_image)


def _worker_pids(pool) -> set[int]:
    # Pool replaces a worker that dies; without maxtasksperchild none exits otherwise, so a
    # change in this set means a worker died (its batch would never report back).
    return {p.pid for p in getattr(pool, "_pool", ())}


def _exit_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    raise SystemExit(128 + signum)


def _run_pool(folder: Path, params, seed: int, batches, counts, workers: int, bar) -> None:
    """Generates ``batches`` in a spawn pool of ``workers``, updating ``bar`` per image."""
    # Default SIGTERM would kill this process at once and orphan the workers; while they
    # run, it raises SystemExit(143) instead (in the main thread, if nothing else handles it).
    sigterm = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    # "spawn": the parent may have started JAX threads, which fork would copy.
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("q", 0)
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=(counter,))
    try:
        if sigterm:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        pids = _worker_pids(pool)
        pending = [
            pool.apply_async(_pool_batch, (str(folder), params, seed, b, counts[b]))
            for b in batches
        ]
        pool.close()
        shown = 0
        while pending:
            pending[0].wait(_POLL_SECONDS)
            for result in [r for r in pending if r.ready()]:
                result.get()  # re-raises a worker's exception
                pending.remove(result)
            done = counter.value
            bar.update(done - shown)
            shown = done
            if pending and _worker_pids(pool) != pids:
                raise DataError(
                    "Pathfinder worker processes died (killed, out of memory, or spawned from "
                    "an unguarded script); if you call write_pathfinder from a script, guard "
                    "the call with `if __name__ == '__main__':` (workers are spawned), or pass "
                    "num_workers=1; complete batches are kept, so a rerun continues"
                )
        pool.join()
    except BaseException:
        # Ctrl-C, SIGTERM, a worker's error or a dead worker: stop the others now.
        # Complete batches keep their metadata file; the next call regenerates the rest.
        pool.terminate()
        pool.join()
        raise
    finally:
        if sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_generator_file(folder: Path, record: dict) -> None:
    path = folder / GENERATOR_FILE
    fix = f"delete {folder} to regenerate it, or call again with the arguments it was made with"
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise DataError(f"cannot read {path} ({err}); {fix}") from None
        if found != record:
            diff = sorted(k for k in set(found) | set(record) if found.get(k) != record.get(k))
            raise DataError(
                f"{folder} was generated with other arguments (differing: {', '.join(diff)}; "
                f"found {[found.get(k) for k in diff]}, asked {[record.get(k) for k in diff]}); "
                f"{fix}"
            )
    else:
        text = json.dumps(record, indent=2, sort_keys=True) + "\n"
        write_atomic(path, text)


def write_pathfinder(
    root: Path,
    resolution: int,
    difficulty: str,
    num_images: int,
    *,
    seed: int,
    images_per_batch: int = 1000,
    num_workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Generates ``num_images`` images into
    ``root/pathfinder{resolution}/{difficulty}`` in the official layout
    (``imgs/<b>/sample_<i>.png`` uint8 grayscale PNGs of resolution x resolution,
    ``metadata/<b>.npy`` text lines, ``generator.json``); returns that folder.

    Batches of ``images_per_batch`` (the last may be smaller) are generated in
    ``num_workers`` spawned processes (default: all CPUs). Resumable: complete
    batches (those with a metadata file) are skipped, others regenerated; the
    output depends only on the arguments. Ctrl-C stops the workers within about
    a second (complete batches stay) and re-raises KeyboardInterrupt; SIGTERM
    does the same and raises SystemExit(143). A folder made with other
    arguments, or workers that die, raise DataError.
    """
    params = params_for(resolution, difficulty)
    for name, value, low in (
        ("num_images", num_images, 1),
        ("images_per_batch", images_per_batch, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise DataError(f"Pathfinder {name} must be an integer >= {low}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise DataError(f"Pathfinder seed must be a non-negative integer, got {seed!r}")
    num_images, images_per_batch, seed = int(num_images), int(images_per_batch), int(seed)
    folder = Path(root) / f"pathfinder{resolution}" / difficulty
    try:
        (folder / "metadata").mkdir(parents=True, exist_ok=True)
        (folder / "imgs").mkdir(exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create {folder} ({err}); choose a writable data folder") from None
    record = {
        "generator": "lra.data.pathfinder_gen",
        "algorithm_version": ALGORITHM_VERSION,
        "params": json.loads(json.dumps(asdict(params))),
        "seed": seed,
        "num_images": num_images,
        "images_per_batch": images_per_batch,
    }
    _check_generator_file(folder, record)
    for stray in (folder / "metadata").glob(".*.tmp-*"):
        stray.unlink()

    num_batches = -(-num_images // images_per_batch)
    counts = [min(images_per_batch, num_images - b * images_per_batch) for b in range(num_batches)]
    todo = [b for b in range(num_batches) if not (folder / "metadata" / f"{b}.npy").exists()]
    workers = worker_count(num_workers)
    workers = min(workers, len(todo))
    bar = tqdm(
        total=num_images,
        initial=num_images - sum(counts[b] for b in todo),
        unit="img",
        desc=f"pathfinder{resolution}/{difficulty}",
        disable=not progress,
    )
    with bar:
        if workers <= 1:
            for b in todo:
                _write_batch(folder, params, seed, b, counts[b], on_image=lambda: bar.update(1))
            return folder
        _run_pool(folder, params, seed, todo, counts, workers, bar)
    return folder
