"""Pathfinder generator: ground truth, statistics, layout, reproducibility, resumption."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import live_processes_in_group
from PIL import Image
from scipy import ndimage

from lra.data import pathfinder_gen as pg
from lra.errors import DataError

DIFFS = list(pg.DIFFICULTIES)
PER_DIFFICULTY = 40  # 32-px images per difficulty for the intensity test
EXTRA_BASELINE = 60  # more baseline images for the label statistics


# The tests that read the generated samples run on one pytest-xdist worker (--dist loadgroup),
# so the module fixture generates them once, not once per worker.
SAMPLES_GROUP = pytest.mark.xdist_group("pathfinder_gen_samples")


@pytest.fixture(scope="module")
def samples():
    """{difficulty: [(image, label, info), ...]} of 32-px images."""
    out = {}
    for k, difficulty in enumerate(DIFFS):
        params = pg.params_for(32, difficulty)
        rng = np.random.default_rng(1000 + k)
        n = PER_DIFFICULTY + (EXTRA_BASELINE if difficulty == "curv_baseline" else 0)
        out[difficulty] = [pg.generate_image(params, rng) for _ in range(n)]
    return out


def _all(samples):
    return [s for difficulty in DIFFS for s in samples[difficulty]]


def _pixel(point):
    return int(round(point[0])), int(round(point[1]))


def test_params_table_and_bad_settings():
    p = pg.params_for(32, "curv_contour_length_14")
    assert (p.resolution, p.contour_length, p.distractor_length) == (32, 14, 4)
    assert (p.padding, p.seed_distance, p.marker_radius) == (1, 7, 1.5)
    assert (p.paddle_length, p.paddle_thickness, p.paddle_margins, p.continuity) == (
        2,
        0.5,
        (1,),
        1.0,
    )
    assert p.num_distractors == 20 // 4
    assert pg.params_for(128, "curv_baseline").paddle_margins == (2, 3)
    assert pg.params_for(64, "curv_contour_length_9").num_distractors == 22 // 3
    with pytest.raises(ValueError, match="32, 64, 128"):
        pg.params_for(48, "curv_baseline")
    with pytest.raises(DataError, match="curv_contour_length_14"):
        pg.params_for(32, "curv_hard")


@SAMPLES_GROUP
def test_images_labels_and_markers(samples):
    everything = _all(samples)
    labels = np.array([label for _, label, _ in everything])
    n = len(labels)
    assert set(labels.tolist()) == {0, 1}
    # Binomial(n, 1/2): 3.5 standard deviations.
    assert abs(labels.sum() - n / 2) <= 3.5 * math.sqrt(n / 4), (labels.sum(), n)
    for image, label, info in everything:
        assert image.dtype == np.uint8 and image.shape == (32, 32)
        assert image.max() == 255
        assert len(info["markers"]) == 2
        r = pg.params_for(32, "curv_baseline").marker_radius
        yy, xx = np.mgrid[:32, :32]
        for y, x in info["markers"]:
            assert image[_pixel((y, x))] >= 128  # the disc centre is bright
            # A disc, not a stray pixel: some 7 pixels (area pi r^2) at least a quarter lit.
            disc = (yy - y) ** 2 + (xx - x) ** 2 <= (r + 0.5) ** 2
            assert (image[disc] >= 64).sum() >= 7
        a, b = info["marker_snakes"]
        assert (a == b) == (label == 1)


@SAMPLES_GROUP
def test_occupancy_flood_fill_matches_label(samples):
    for _, label, info in _all(samples):
        occ = info["occupancy"]
        components, count = ndimage.label(occ)  # 4-connectivity
        # Every snake is one component and no two snakes touch.
        assert count == len(info["paths"])
        first, second = (components[_pixel(m)] for m in info["markers"])
        assert first > 0 and second > 0
        assert (first == second) == (label == 1)
        # The marked tips lie on the marked snakes' polylines.
        i, j = info["marker_snakes"]
        assert np.allclose(info["markers"][0], info["paths"][i][0])
        assert np.allclose(info["markers"][1], info["paths"][j][-1])
        assert info["target_paths"][0] is info["paths"][0]


@SAMPLES_GROUP
def test_image_consistent_with_occupancy(samples):
    for image, _, info in _all(samples):
        occ = info["occupancy"]
        # Nothing is drawn outside the snakes (anti-aliasing reaches one pixel).
        near = ndimage.binary_dilation(occ, structure=np.ones((3, 3), bool))
        assert not (image[~near] > 0).any()
        # Every paddle is visible, and its midpoint pixel belongs to the mask.
        for segs in info["paddles"]:
            for a, b in segs:
                mid = _pixel((a + b) / 2)
                assert image[mid] > 0 and occ[mid]
        # Each component of the mask holds something drawn.
        components, count = ndimage.label(occ)
        lit = np.unique(components[(image > 0) & occ])
        assert set(lit.tolist()) >= set(range(1, count + 1))


@SAMPLES_GROUP
def test_mean_intensity_rises_with_difficulty(samples):
    means = [np.mean([im.mean() for im, _, _ in samples[d][:PER_DIFFICULTY]]) for d in DIFFS]
    assert means[0] < means[1] < means[2], means
    assert 5 < means[0] and means[2] < 40, means


def test_generate_image_is_seeded():
    params = pg.params_for(32, "curv_contour_length_9")
    one = pg.generate_image(params, np.random.default_rng(5))
    two = pg.generate_image(params, np.random.default_rng(5))
    assert np.array_equal(one[0], two[0]) and one[1] == two[1]


# ---------------------------------------------------------------------------
# write_pathfinder


def _files(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _write(root, **kw):
    args = dict(seed=3, images_per_batch=3, num_workers=1, progress=False)
    args.update(kw)
    return pg.write_pathfinder(root, 32, "curv_baseline", 7, **args)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    folder = _write(root)
    return folder, _files(folder)


def test_layout_and_metadata(clean_run):
    folder, files = clean_run
    assert folder.name == "curv_baseline" and folder.parent.name == "pathfinder32"
    pngs = sorted(f for f in files if f.endswith(".png"))
    assert len(pngs) == 7
    assert {f for f in files if not f.endswith(".png")} == {
        "generator.json",
        "metadata/0.npy",
        "metadata/1.npy",
        "metadata/2.npy",
    }
    params = pg.params_for(32, "curv_baseline")
    for b, count in enumerate((3, 3, 1)):
        lines = (folder / "metadata" / f"{b}.npy").read_text().splitlines()
        assert len(lines) == count
        rng = pg._batch_rng(3, params, b)
        for i, line in enumerate(lines):
            fields = line.split()
            assert fields[:3] == [f"imgs/{b}", f"sample_{i}.png", str(i)]
            assert fields[4:] == ["1.0", "6", "2", "2", "0.5", "1", "1"]
            with Image.open(folder / fields[0] / fields[1]) as im:
                assert im.mode == "L" and im.size == (32, 32)
                pixels = np.asarray(im)
            image, label, _ = pg.generate_image(params, rng)
            assert int(fields[3]) == label
            assert np.array_equal(pixels, image)


def test_same_seed_same_bytes_and_other_seed_differs(clean_run, tmp_path):
    _, files = clean_run
    assert _files(_write(tmp_path / "again")) == files
    other = _files(_write(tmp_path / "other", seed=4))
    assert other["imgs/0/sample_0.png"] != files["imgs/0/sample_0.png"]


def test_two_workers_same_files(clean_run, tmp_path):
    _, files = clean_run
    assert _files(_write(tmp_path, num_workers=2)) == files


def test_resume_regenerates_only_incomplete_batch(clean_run, tmp_path, monkeypatch):
    _, files = clean_run
    folder = _write(tmp_path)
    kept = [p for p in folder.rglob("*") if p.is_file() and "/1" not in str(p.relative_to(folder))]
    mtimes = {p: p.stat().st_mtime_ns for p in kept}
    (folder / "metadata" / "1.npy").unlink()
    with open(folder / "imgs" / "1" / "sample_1.png", "r+b") as f:
        f.truncate(20)
    (folder / "imgs" / "1" / ".sample_2.png.tmp-999").write_bytes(b"partial")
    (folder / "metadata" / ".1.npy.tmp-999").write_bytes(b"partial")
    calls = []
    real = pg.generate_image
    monkeypatch.setattr(pg, "generate_image", lambda *a: calls.append(1) or real(*a))
    assert _write(tmp_path) == folder
    assert len(calls) == 3  # batch 1 only
    assert _files(folder) == files
    assert {p: p.stat().st_mtime_ns for p in kept} == mtimes
    # A complete folder is left alone.
    _write(tmp_path)
    assert len(calls) == 3


def test_other_arguments_raise(clean_run):
    folder, _ = clean_run
    root = folder.parent.parent
    with pytest.raises(DataError, match="seed.*delete"):
        _write(root, seed=9)
    with pytest.raises(DataError, match="images_per_batch"):
        _write(root, images_per_batch=4)
    with pytest.raises(DataError, match="num_images"):
        pg.write_pathfinder(root, 32, "curv_baseline", 0, seed=3, progress=False)


# ---------------------------------------------------------------------------
# Parallel runs: interruption, progress, worker failures

INTERRUPT_ARGS = dict(seed=3, images_per_batch=4, num_workers=2, progress=False)
INTERRUPT_IMAGES = 360  # about 4 s on 2 workers; interrupted after the first batch


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_workers_fast_and_resume_gives_the_same_files(tmp_path):
    root = tmp_path / "interrupted"
    folder = root / "pathfinder32" / "curv_baseline"
    code = (
        "from lra.data.pathfinder_gen import write_pathfinder\n"
        f"write_pathfinder({str(root)!r}, 32, 'curv_baseline', {INTERRUPT_IMAGES}, "
        f"**{INTERRUPT_ARGS!r})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not list((folder / "metadata").glob("*.npy")):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no batch finished within 60 s"
            time.sleep(0.02)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=5)
        assert time.monotonic() - sent < 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = proc.stderr.read()
    assert rc != 0 and "KeyboardInterrupt" in stderr, stderr[-2000:]
    # Workers were terminated with the parent (the resource tracker leaves once they are gone).
    deadline = time.monotonic() + 5
    while live_processes_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_processes_in_group(proc.pid) == []
    finished = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.glob("metadata/*.npy")}
    num_batches = -(-INTERRUPT_IMAGES // INTERRUPT_ARGS["images_per_batch"])
    assert 1 <= len(finished) < num_batches  # interrupted mid-run, finished batches kept
    # Resume in this process: same files as one uninterrupted run; finished batches untouched.
    pg.write_pathfinder(root, 32, "curv_baseline", INTERRUPT_IMAGES, **INTERRUPT_ARGS)
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in finished} == finished
    reference = pg.write_pathfinder(
        tmp_path / "reference", 32, "curv_baseline", INTERRUPT_IMAGES, **INTERRUPT_ARGS
    )
    assert _files(folder) == _files(reference)


def test_progress_bar_moves_per_image(tmp_path, monkeypatch):
    updates = []

    class Bar:
        def __init__(self, total, initial, **kw):
            updates.append(initial)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            updates.append(n)

    monkeypatch.setattr(pg, "tqdm", Bar)
    # Two batches of 12 hard images (about 1 s each); the parent polls every 0.25 s.
    pg.write_pathfinder(
        tmp_path, 32, "curv_contour_length_14", 24, seed=3, images_per_batch=12, num_workers=2
    )
    shown = np.cumsum(updates)
    assert updates[0] == 0 and shown[-1] == 24
    # Per-batch updates would only ever show 0, 12 and 24 images.
    assert any(n % 12 for n in shown), updates


def test_worker_error_is_raised_in_the_parent(tmp_path):
    folder = tmp_path / "pathfinder32" / "curv_baseline"
    (folder / "imgs").mkdir(parents=True)
    (folder / "imgs" / "1").write_text("a file where batch 1's folder goes")
    with pytest.raises(NotADirectoryError):
        pg.write_pathfinder(
            tmp_path,
            32,
            "curv_baseline",
            4,
            seed=3,
            images_per_batch=2,
            num_workers=2,
            progress=False,
        )


def test_unguarded_script_gets_the_spawn_guard_hint(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from lra.data.pathfinder_gen import write_pathfinder\n"
        f"write_pathfinder({str(tmp_path / 'out')!r}, 32, 'curv_baseline', 4, seed=3, "
        "images_per_batch=2, num_workers=2, progress=False)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "DataError" in out.stderr and "__name__ == '__main__'" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "sig, to_group, status",
    [
        (signal.SIGINT, True, -signal.SIGINT),  # Ctrl-C in a terminal
        (signal.SIGTERM, False, 128 + signal.SIGTERM),  # `kill` or `timeout`: the parent only
    ],
)
def test_signal_stops_running_batches_at_once(tmp_path, sig, to_group, status):
    # Two batches of 300 images: some 5 s each, far longer than the time allowed to stop.
    folder = tmp_path / "pathfinder32" / "curv_baseline"
    code = (
        "from lra.data.pathfinder_gen import write_pathfinder\n"
        f"write_pathfinder({str(tmp_path)!r}, 32, 'curv_baseline', 600, seed=3, "
        "images_per_batch=300, num_workers=2, progress=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob("imgs/*/sample_*.png")):  # the workers are generating
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        assert proc.wait(timeout=5) == status
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The workers went with the parent (orphans would finish their batch first).
    deadline = time.monotonic() + 2
    while live_processes_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_processes_in_group(proc.pid) == []
    assert not list(folder.glob("metadata/*.npy"))
