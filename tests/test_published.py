"""Published LRA results shipped as data (lra/report/published.py, issue 31).

Checks that every shipped file parses and names its source, the averaging rules on
hand-computed cases, the alias table against configs/model/*.yaml, and that a malformed file
names the file and the key. Pure Python and YAML: no JAX.
"""

from pathlib import Path

import pytest

import lra.configs
from lra.errors import LRAError
from lra.report import published as pub

MODEL_NAMES = {p.stem for p in (Path(lra.configs.__file__).parent / "model").glob("*.yaml")}
DATA = Path(pub.__file__).parent / "published_data"


@pytest.fixture(scope="module")
def shipped():
    return pub.load_published()


def test_every_shipped_file_parses_and_names_its_source(shipped):
    files = sorted(DATA.glob("*.yaml"))
    assert files, "no published data shipped"
    scores, efficiency = shipped
    assert scores and efficiency
    ids = {row.source.id for row in scores} | {row.source.id for row in efficiency}
    assert ids == {p.stem for p in files}
    for row in [*scores, *efficiency]:
        assert row.source.citation.strip() and row.source.read_from.strip()
        assert row.table.strip() and row.source.table.strip()
    for row in scores:
        assert set(row.scores) == set(pub.TASKS)
        assert row.averaging in pub.AVERAGING_RULES
        for value in row.scores.values():
            assert value is None or value == pub.FAIL or 0.0 <= value <= 100.0


def test_lra_paper_table1_row_as_published(shipped):
    scores, efficiency = shipped
    (row,) = [r for r in scores if r.source.id == "lra_paper" and r.model == "Transformer"]
    assert row.scores["listops"] == 36.37 and row.scores["pathx"] == pub.FAIL
    assert row.average == 54.39 and row.averaging == "lra5"
    (mem,) = [
        e
        for e in efficiency
        if e.source.id == "lra_paper" and e.model == "Transformer" and e.metric == "peak_memory"
    ]
    assert mem.table == "Table 2" and sorted(mem.values) == [1024, 2048, 3072, 4096]


def test_lra5_average_hand_computed():
    cells = {"listops": 10.0, "text": 20.0, "retrieval": 30.0, "image": 40.0, "pathfinder": 50.0}
    assert pub.lra5_average({**cells, "pathx": pub.FAIL}) == pytest.approx(30.0)
    assert pub.lra5_average({**cells, "pathx": None}) == pytest.approx(30.0)
    assert pub.lra5_average({**cells, "pathx": 99.0}) == pytest.approx(30.0)
    assert pub.lra5_average({**cells, "image": pub.FAIL}) is None
    assert pub.lra5_average({**cells, "text": None}) is None


def test_six_average_fail50_hand_computed():
    cells = {"listops": 10.0, "text": 20.0, "retrieval": 30.0, "image": 40.0, "pathfinder": 50.0}
    assert pub.six_average_fail50({**cells, "pathx": pub.FAIL}) == pytest.approx(200.0 / 6)
    assert pub.six_average_fail50({**cells, "pathx": 80.0}) == pytest.approx(230.0 / 6)
    assert pub.six_average_fail50({**cells, "pathx": None}) is None
    assert pub.average({**cells, "pathx": pub.FAIL}, "six") is None
    assert pub.average({**cells, "pathx": 80.0}, "six") == pytest.approx(230.0 / 6)
    assert pub.average(cells, "none") is None
    with pytest.raises(ValueError):
        pub.average(cells, "seven")


def test_aliases_name_existing_configs_and_no_label_twice():
    assert set(pub.ALIASES) <= MODEL_NAMES, set(pub.ALIASES) - MODEL_NAMES
    labels = [label for labels in pub.ALIASES.values() for label in labels]
    assert len(labels) == len(set(labels)), "a published label maps to two harness names"


def test_published_for_and_unmatched(shipped):
    scores, _ = shipped
    rows = pub.published_for("transformer", scores)
    assert rows and {r.model for r in rows} <= set(pub.ALIASES["transformer"])
    left = pub.unmatched(scores, MODEL_NAMES)
    left_labels = {r.model for r in left}
    assert "Synthesizer" in left_labels  # which variant ran is not printed: never guessed
    assert "Transformer" not in left_labels
    assert pub.unmatched(scores, []) == scores


def test_rows_whose_average_differs_from_their_cells_say_so(shipped):
    scores, _ = shipped
    checked = 0
    for row in scores:
        mean = pub.average(row.scores, row.averaging)
        if mean is None or row.average is None:
            continue
        checked += 1
        if abs(mean - row.average) > 0.06:
            assert "differs from the mean of its cells" in row.notes, (row.source.id, row.model)
    assert checked


def test_sinkhorn_transcription_inconsistency_is_noted(shipped):
    scores, _ = shipped
    (row,) = [r for r in scores if r.source.id == "lra_paper" and r.model == "Sinkhorn Trans."]
    assert row.average == 51.39
    assert "51.29" in row.notes and "differs from the mean of its cells" in row.notes


GOOD = """\
source:
  id: {stem}
  citation: "Someone, Some paper"
  table: "Table 1"
  read_from: "https://example.org/paper"
averaging: lra5
scores:
  - model: A
    listops: 1.0
    text: 2.0
    retrieval: 3.0
    image: 4.0
    pathfinder: 5.0
    pathx: FAIL
    average: 3.0
"""


def _write(tmp_path, text, stem="bad_source"):
    path = tmp_path / f"{stem}.yaml"
    path.write_text(text.format(stem=stem))
    return path


def test_a_good_tmp_file_loads(tmp_path):
    _write(tmp_path, GOOD)
    scores, efficiency = pub.load_published(tmp_path)
    assert [r.model for r in scores] == ["A"] and efficiency == []
    assert scores[0].scores["pathx"] == pub.FAIL and scores[0].notes == ""


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda t: t.replace("    text: 2.0", "    txt: 2.0"), "scores[0].txt"),
        (lambda t: t.replace('  read_from: "https://example.org/paper"\n', ""), "read_from"),
        (lambda t: t.replace("    text: 2.0", "    text: 2.0x"), "scores[0].text"),
        (lambda t: t.replace("pathx: FAIL", "pathx: fail"), "scores[0].pathx"),
        (lambda t: t + t[t.index("  - model: A") :], "scores[1].model"),
        (lambda t: t.replace("averaging: lra5", "averaging: lra6"), "averaging"),
        (lambda t: t + "    image_variant: color\n", "scores[0].image_variant"),
    ],
    ids=["task", "source", "number", "fail", "duplicate", "averaging", "image_variant"],
)
def test_a_malformed_file_names_the_file_and_key(tmp_path, edit, key):
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(pub.PublishedDataError) as err:
        pub.load_published(tmp_path)
    assert isinstance(err.value, LRAError)
    assert str(path) in str(err.value) and key in str(err.value)


def test_lru_table3_as_published_with_colour_cifar_as_a_field(shipped):
    scores, _ = shipped
    rows = {r.model: r for r in scores if r.source.id == "lru_paper"}
    lru = rows["LRU"]
    assert lru.averaging == "none" and lru.average is None
    assert [lru.scores[t] for t in pub.TASKS] == [60.2, 89.4, 89.9, 89.0, 95.1, 94.2]
    for row in rows.values():  # the paper's sCIFAR column is colour CIFAR, stored under image
        assert row.image_variant == "colour" and row.table == "Table 3"
        assert "colour CIFAR-10" in row.notes
    assert pub.published_for("lru", scores) == [lru]
    # no other shipped source prints a colour Image score
    assert {r.source.id for r in scores if r.image_variant != "grayscale"} == {"lru_paper"}


def test_image_variant_defaults_to_grayscale_and_reads_colour(tmp_path):
    _write(tmp_path, GOOD + "  - model: B\n    image: 90.0\n    image_variant: colour\n")
    scores, _ = pub.load_published(tmp_path)
    assert [(r.model, r.image_variant) for r in scores] == [("A", "grayscale"), ("B", "colour")]
    assert pub.IMAGE_VARIANTS == ("grayscale", "colour")


def test_a_bad_image_variant_names_file_row_and_allowed_values(tmp_path):
    path = _write(tmp_path, GOOD + "    image_variant: rgb\n")
    with pytest.raises(pub.PublishedDataError) as err:
        pub.load_published(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "scores[0].image_variant" in message and "'rgb'" in message and "'A'" in message
    assert "grayscale, colour" in message


def test_liquid_s4_table1_state_space_rows_as_published(shipped):
    scores, _ = shipped
    rows = {r.model: r for r in scores if r.source.id == "liquid_s4_paper"}
    assert list(rows) == [
        "DSS",
        "S4 (original)",
        "S4-LegS",
        "S4-FouT",
        "S4-LegS/FouT",
        "S4D-LegS",
        "S4D-Inv",
        "S4D-Lin",
        "S5 (preprint, quoted by Liquid-S4)",
        "Liquid-S4",
    ]
    inv = rows["S4D-Inv"]
    assert [inv.scores[t] for t in pub.TASKS] == [60.18, 87.34, 91.09, 87.83, 93.78, 92.80]
    assert inv.average == 85.50 and inv.averaging == "six_fail50"
    lin = rows["S4D-Lin"]
    assert lin.scores["pathx"] == pub.FAIL and lin.average == 78.39
    for row in rows.values():  # every printed Avg. is the six-task mean, a FAIL counting as 50
        assert row.average == pytest.approx(pub.six_average_fail50(row.scores), abs=0.005)
        assert row.table == "Table 1" and row.image_variant == "grayscale"
    # S4-LegS and S4 (original) are the S4 paper's Table 10 rows, quoted
    s4 = {r.model: r for r in scores if r.source.id == "s4_paper"}
    assert rows["S4-LegS"].scores == s4["S4 (updated)"].scores
    assert rows["S4 (original)"].scores == s4["S4 (original)"].scores
    # the harness's s4d runs S4D-Inv: only that row stands beside it; LegS and Lin are listed
    assert pub.published_for("s4d", scores) == [inv]
    left = {r.model for r in pub.unmatched(scores, MODEL_NAMES)}
    assert {"S4D-LegS", "S4D-Lin", "Liquid-S4", "DSS"} <= left and "S4D-Inv" not in left
    # its S5 row is an earlier preprint's numbers: listed, never beside the harness's s5
    assert "S5 (preprint, quoted by Liquid-S4)" in left
    assert all(r.source.id != "liquid_s4_paper" for r in pub.published_for("s5", scores))


def test_mega_table2_as_published_and_its_mixed_average(shipped):
    scores, efficiency = shipped
    rows = {r.model: r for r in scores if r.source.id == "mega_paper"}
    mega = rows["MEGA"]
    assert [mega.scores[t] for t in pub.TASKS] == [63.14, 90.43, 91.25, 90.44, 96.01, 97.98]
    assert mega.average == 88.21 == pytest.approx(pub.average(mega.scores, "six"), abs=0.005)
    xfm = rows["XFM"]  # Path-X failed: the printed Avg. is the five-task mean
    assert xfm.scores["pathx"] == pub.FAIL and xfm.average == 54.39
    assert xfm.average == pytest.approx(pub.lra5_average(xfm.scores), abs=0.005)
    assert "five other tasks" in xfm.notes
    chunk_speed = [
        e
        for e in efficiency
        if e.source.id == "mega_paper"
        and e.model == "MEGA-chunk"
        and e.metric == "relative_steps_per_sec"
    ]
    assert [e.values for e in chunk_speed] == [{4096: 5.5}]
    assert {"XFM", "XFM‡"} <= {r.model for r in pub.published_for("transformer", scores)}


def test_secondary_rows_as_published_and_marked_secondary(shipped):
    scores, _ = shipped
    s5 = next(r for r in scores if r.source.id == "s5_paper")
    spt = next(r for r in scores if r.source.id == "spt_paper")
    assert s5.scores == {
        "listops": 62.15,
        "text": 89.31,
        "retrieval": 91.40,
        "image": 88.00,
        "pathfinder": 95.33,
        "pathx": 98.58,
    }
    assert spt.scores["image"] == 76.0 and spt.scores["pathx"] == 88.05
    for row, printed in ((s5, 87.46), (spt, 81.81)):
        assert row.average == printed
        assert round(pub.six_average(row.scores), 2) == printed
        assert row.source.secondary and "secondary source" in row.source.cited
        assert row.source.read_from in row.source.cited
    assert "paperswithcode.com" in s5.source.read_from
    assert "2405.06147" in spt.source.read_from
    # S5's own row stands beside the harness's s5; the SPT row matches no harness model
    assert s5 in pub.published_for("s5", scores)
    assert spt in pub.unmatched(scores, MODEL_NAMES)
    # every other source is primary, and its citation prints as it is
    lra = next(r for r in scores if r.source.id == "lra_paper")
    assert not lra.source.secondary and lra.source.cited == lra.source.citation


def test_a_secondary_flag_that_is_not_a_boolean_names_file_and_key(tmp_path):
    path = tmp_path / "x_paper.yaml"
    path.write_text(
        "source: {id: x_paper, citation: C, table: T, read_from: R, secondary: 'yes'}\n"
        "averaging: six\nscores: [{model: M, listops: 50.0}]\n"
    )
    with pytest.raises(pub.PublishedDataError, match=r"x_paper.yaml.*source.secondary"):
        pub.load_file(path)
