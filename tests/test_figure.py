"""Figure 1 (lra.report.figure_data, lra.report.figure) from synthetic records, checked on the
Figure object."""

import statistics
import xml.etree.ElementTree as ET

import pytest
from matplotlib.collections import LineCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.legend import Legend
from matplotlib.text import Text
from test_report import MIB, OFFICIAL, bench, official_store, store, train

from lra.errors import ConfigError, DataError
from lra.report import figure
from lra.report.efficiency import efficiency
from lra.report.figure_data import figure1_data
from lra.report.leaderboard import leaderboard, leaderboards
from lra.report.load import TINY_NOTE

# transformer: three seeds on every task; accuracies per seed and task.
TF_ACC = {
    0: [0.50, 0.60, 0.70, 0.40, 0.60],
    1: [0.55, 0.62, 0.74, 0.41, 0.66],
    2: [0.45, 0.58, 0.66, 0.43, 0.70],
}
# Eight more models with almost the same score and speed: their labels would collide.
CROWD = ["performer", "cosformer", "linformer", "nystromformer", "reformer", "flash", "ls", "lsh"]


def figure_records(protocol="transnormer"):
    records = []
    for seed, accs in TF_ACC.items():
        records += [
            train("transformer", t, seed, a, protocol=protocol)
            for t, a in zip(OFFICIAL, accs, strict=True)
        ]
    records.append(
        bench(
            "transformer",
            2048,
            10.0,
            20.0,
            400 * MIB,
            protocol=protocol,
            train_steps_per_sec_windows=[9.0, 10.0, 12.0],
        )
    )
    for i, model in enumerate(CROWD):
        acc = 0.55 + 0.0005 * i
        records += [train(model, t, 0, acc, protocol=protocol) for t in OFFICIAL]
        records.append(
            bench(model, 2048, 14.0 + 0.05 * i, 20.0, (50 + 40 * i) * MIB, protocol=protocol)
        )
    return records


@pytest.fixture
def fig1(tmp_path):
    _, records = store(
        tmp_path,
        figure_records()
        # records of another protocol: the figure uses transnormer's, never a mix
        + [train("transformer", t, 0, 0.99, protocol="lra_official") for t in OFFICIAL],
    )
    return figure.figure1(leaderboards(records), efficiency(records), length=2048)


def drawn_texts(fig, monkeypatch):
    """``[(text, window extent)]`` of every text actually drawn, recorded while drawing."""
    drawn = []
    draw = Text.draw

    def spy(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            # the text's own box (an annotation's would include its leader line)
            drawn.append((self.get_text(), Text.get_window_extent(self, renderer)))

    monkeypatch.setattr(Text, "draw", spy)
    fig.canvas.draw()
    return drawn


def test_figure1_has_one_legend_entry_per_model_and_a_memory_legend(fig1):
    ax = fig1.figure.axes[0]
    legends = {leg.get_gid(): leg for leg in fig1.figure.findobj(Legend)}
    assert set(legends) == {"models", "memory"}
    entries = [t.get_text() for t in legends["models"].get_texts()]
    assert entries == sorted([*CROWD, "transformer (3 seeds)"])
    assert len(entries) == len(fig1.points) == 9
    sizes = [t.get_text() for t in legends["memory"].get_texts()]
    assert sizes == ["400 MiB", "100 MiB", "20 MiB"]  # round values, the largest circle first
    assert ax.get_legend() is legends["models"]
    assert fig1.data.protocol == "transnormer"
    ys = {p.model: p.y for p in fig1.points}
    assert ys["transformer"] < 99  # the lra_official 0.99 records are not in it


def test_figure1_error_bars_span_seeds_and_timing_windows(fig1):
    ax = fig1.figure.axes[0]
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
    assert "_errorbar transformer" in bars
    per_seed = [statistics.fmean(accs) * 100 for accs in TF_ACC.values()]
    mean, std = statistics.fmean(per_seed), statistics.stdev(per_seed)
    point = next(p for p in fig1.points if p.model == "transformer")
    assert point.y == pytest.approx(mean) and point.y_std == pytest.approx(std)
    segments = [
        seg
        for col in bars["_errorbar transformer"].lines[2]
        if isinstance(col, LineCollection)
        for seg in col.get_segments()
    ]
    vertical = [s for s in segments if s[0][0] == s[1][0]]
    horizontal = [s for s in segments if s[0][1] == s[1][1]]
    assert len(vertical) == 1 and len(horizontal) == 1
    (x0, y_lo), (_, y_hi) = sorted(vertical[0].tolist(), key=lambda p: p[1])
    assert x0 == pytest.approx(10.0)
    assert (y_lo, y_hi) == (pytest.approx(mean - std), pytest.approx(mean + std))
    (x_lo, y0), (x_hi, _) = sorted(horizontal[0].tolist())
    assert (x_lo, x_hi, y0) == (pytest.approx(9.0), pytest.approx(12.0), pytest.approx(mean))
    # one seed and identical windows: no error bar at all
    assert "_errorbar performer" not in bars


def test_figure1_caption_names_protocol_task_set_device_and_length(fig1):
    texts = [t.get_text() for t in fig1.figure.texts if t.get_gid() == "caption"]
    assert len(texts) == 1
    caption = " ".join(texts[0].split())
    for needle in ("Protocol: transnormer", "Task set: official", "NVIDIA H200", "length 2048"):
        assert needle in caption
    assert "listops, text, retrieval, image, pathfinder" in caption
    assert "min-max over the timed windows" in caption and "std over seeds" in caption


def test_figure1_text_labels_do_not_overlap(fig1, monkeypatch):
    drawn = drawn_texts(fig1.figure, monkeypatch)
    labels = {p.label for p in fig1.points}
    placed = [t for t, _ in drawn if t in labels]
    assert len(placed) >= 3  # the crowd is labelled where there is room
    assert set(placed) | set(fig1.unlabelled) >= labels  # the rest is only in the legend
    overlaps = [
        (a, b)
        for i, (a, box_a) in enumerate(drawn)
        for b, box_b in drawn[i + 1 :]
        if box_a.overlaps(box_b)
    ]
    assert overlaps == []


def test_figure1_protocol_must_be_named_without_transnormer(tmp_path):
    _, records = store(
        tmp_path,
        figure_records("lra_official")
        + [train("transformer", t, 0, 0.5, protocol="custom") for t in OFFICIAL],
    )
    with pytest.raises(ConfigError, match="protocol=<name>"):
        figure1_data(leaderboards(records), efficiency(records), length=2048)
    data = figure1_data(
        [b for b in leaderboards(records) if b.protocol == "lra_official"],
        efficiency(records),
        length=2048,
    )
    assert data.protocol == "lra_official" and len(data.points) == 9


def test_figure1_needs_benchmark_records_of_its_protocol(tmp_path):
    records = [r for r in figure_records() if r["kind"] == "train"]
    records += [bench("transformer", 2048, 10.0, 20.0, MIB, protocol="lra_official")]
    _, records = store(tmp_path, records)
    with pytest.raises(
        DataError, match=r"lra-bench -m model=\S*transformer.* protocol=transnormer"
    ):
        figure1_data(leaderboards(records), efficiency(records), length=2048)


@pytest.fixture
def official(tmp_path):
    return official_store(tmp_path)


def published_rows():
    """Published points as :func:`lra.report.compare.published_points` makes them."""
    rows = [
        ("transformer", "Transformer (paper)", 57.37, 15.34),
        ("cosformer", "cosFormer (paper)", 62.11, 21.0),
        ("flash", "FLASH (paper)", 61.31, 20.49),  # not drawn: no measured flash point
    ]
    return [
        {
            "model": m,
            "label": label,
            "source": "paper",
            "citation": "A. Author, A Paper",
            "lra_average": y,
            "train_steps_per_sec": x,
            "speed_length": 1024,
        }
        for m, label, y, x in rows
    ]


def collection(fig, gid):
    return next(c for c in fig.axes[0].collections if c.get_gid() == gid)


def test_figure1_one_circle_per_model_missing_listed_and_reference(official, tmp_path):
    _, records = official
    lb, tables = leaderboard(records), efficiency(records)
    fig1 = figure.figure1(lb, tables, length=2048, published=published_rows())
    assert fig1.labels == ["cosformer"]  # the only model with both a score and a speed at 2048
    assert len(collection(fig1.figure, "measured").get_offsets()) == 1
    assert "OOM at length 2048" in fig1.missing["transformer"]
    assert "no LRA average" in fig1.missing["performer"]
    assert "no training records" in fig1.missing["linformer"]
    # published points only for the models drawn (cosformer), labelled by source
    assert len(collection(fig1.figure, "published").get_offsets()) == 1
    assert "Hollow circles" in fig1.caption
    for model in ("transformer", "performer", "linformer"):
        assert model in fig1.caption
    models = next(leg for leg in fig1.figure.findobj(Legend) if leg.get_gid() == "models")
    assert len(models.get_texts()) == 2  # cosformer + the paper's values

    fig2 = figure.figure1(lb, tables, length=1024)
    assert sorted(fig2.labels) == ["transformer"]
    assert not [c for c in fig2.figure.axes[0].collections if c.get_gid() == "published"]
    point = fig2.points[0]
    assert (point.x, point.y, point.memory_bytes) == (10.0, pytest.approx(60.0), 100 * MIB)

    out = tmp_path / "out"
    paths = figure.write_figure1(fig1, out)
    png, svg = out / "figure1.png", out / "figure1.svg"
    assert png in paths and svg in paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    texts = " ".join(el.text or "" for el in ET.parse(svg).getroot().iter())
    assert "cosformer" in texts and "cosFormer (paper)" in texts  # measured and paper labels


def test_figure1_tiny_uses_common_tasks(tmp_path):
    _, records = store(
        tmp_path,
        [
            train("transformer", "listops_tiny", 0, 0.5),
            train("transformer", "text_tiny", 0, 0.7),
            train("performer", "listops_tiny", 0, 0.4),
            bench("transformer", 512, 5.0, 9.0, 4 * MIB, task="listops_tiny"),
            bench("performer", 512, 6.0, 9.0, 2 * MIB, task="listops_tiny"),
        ],
    )
    lb, tables = leaderboard(records), efficiency(records)
    fig1 = figure.figure1(lb, tables, length=512, published=published_rows())
    ys = {p.model: p.y for p in fig1.points}
    assert ys == {"transformer": pytest.approx(50.0), "performer": pytest.approx(40.0)}
    assert "listops_tiny" in fig1.y_label and "text_tiny" not in fig1.y_label
    assert TINY_NOTE in fig1.y_label and TINY_NOTE in fig1.caption
    assert len(collection(fig1.figure, "measured").get_offsets()) == 2


def test_figure1_without_any_point_is_an_error(tmp_path):
    _, records = store(
        tmp_path,
        [train("transformer", "listops", 0, 0.5), bench("transformer", 2048, 5.0, 9.0, MIB)],
    )
    with pytest.raises(DataError, match="no LRA average"):
        figure.figure1(leaderboard(records), efficiency(records), length=2048)
