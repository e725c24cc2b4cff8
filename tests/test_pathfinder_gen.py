"""Pathfinder generator: ground truth, statistics, layout, reproducibility, resumption."""

import math

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from lra.data import pathfinder_gen as pg
from lra.errors import DataError

DIFFS = list(pg.DIFFICULTIES)
PER_DIFFICULTY = 40  # 32-px images per difficulty for the intensity test
EXTRA_BASELINE = 60  # more baseline images for the label statistics


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
