"""lra-report beside the literature and in a paper's forms (issue 31, parts 2-6): published
numbers beside measured cells, both averaging rules, unmatched rows, LaTeX, PDF/SVG, hollow
published markers, the report without benchmark records, the LRA paper's Table 2 form and the
Transformer on two softmax paths. Synthetic records and a tiny published-data folder."""

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from matplotlib.collections import PathCollection
from test_report import MIB, OFFICIAL, bench, full_row, official_store, store, train

from lra.errors import DataError
from lra.report import figure
from lra.report import main as report
from lra.report.compare import compare, published_points
from lra.report.efficiency import IMPLEMENTATION_KEY, efficiency
from lra.report.figure_data import figure1_data
from lra.report.latex import leaderboard_latex
from lra.report.leaderboard import leaderboard
from lra.report.published import TASKS, load_file, load_published
from lra.report.table2 import table2
from lra.report.tables import efficiency_markdown, leaderboard_csv

# Two sources; "a_source" sorts first by file name, but the LRA paper is always shown first.
LRA_PAPER = """
source:
  id: lra_paper
  citation: "Tay et al., Long Range Arena, ICLR 2021"
  table: "Table 1"
  read_from: "test data"
averaging: lra5
scores:
  - model: "Transformer"
    listops: 36.37
    text: 64.27
    retrieval: 57.46
    image: 42.44
    pathfinder: 71.40
    pathx: "FAIL"
    average: 54.39
  - model: "Mystery Model"
    listops: 30.0
efficiency:
  - model: "Transformer"
    metric: steps_per_sec
    hardware: "TPU"
    values: {1024: 8.0, 2048: 4.0}
    table: "Table 2"
  - model: "Transformer"
    metric: peak_memory
    hardware: "TPU"
    values: {1024: 1.0, 2048: 4.0}
    table: "Table 2"
  - model: "Performer"
    metric: steps_per_sec
    hardware: "TPU"
    values: {1024: 10.0, 2048: 10.0}
    table: "Table 2"
  - model: "Performer"
    metric: relative_steps_per_sec
    hardware: "TPU"
    values: {1024: 1.2}
    table: "Table 2"
  - model: "Performer"
    metric: peak_memory
    hardware: "TPU"
    values: {1024: 0.5, 2048: 1.0}
    table: "Table 2"
"""
A_SOURCE = """
source:
  id: a_source
  citation: "Someone, Another Paper"
  table: "Table 9"
  read_from: "test data"
averaging: six_fail50
scores:
  - model: "Transformer"
    listops: 40.0
    text: 60.0
    retrieval: 50.0
    image: 40.0
    pathfinder: 70.0
    pathx: 60.0
  - model: "cosFormer"
    listops: 37.0
    text: 63.0
    retrieval: 60.0
    image: 45.0
    pathfinder: 80.0
    pathx: "FAIL"
efficiency:
  - model: "cosFormer"
    metric: steps_per_sec
    hardware: "A6000"
    values: {1024: 20.0, 4096: 5.0}
"""


@pytest.fixture
def published(tmp_path):
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "lra_paper.yaml").write_text(textwrap.dedent(LRA_PAPER))
    (folder / "a_source.yaml").write_text(textwrap.dedent(A_SOURCE))
    return folder


def read_csv(text):
    return {r["row"]: r for r in csv.DictReader(io.StringIO(text))}


# ---------------------------------------------------------------- part 2: beside published


def test_published_beside_measured_first_source_and_all_in_sources(tmp_path, published):
    folder, _ = official_store(tmp_path)
    out = tmp_path / "out"
    report.run_report(folder, out, figure=False, curves=False, published_dir=published)
    rows = read_csv((out / "leaderboard.csv").read_text())
    tf = rows["transformer"]
    # transformer listops measured 60.00 (50, 60, 70); published 36.37 (LRA paper first)
    assert float(tf["listops_published"]) == pytest.approx(36.37)
    assert tf["listops_published_source"] == "lra_paper"
    assert float(tf["listops_diff"]) == pytest.approx(60.0 - 36.37)
    assert tf["pathx_published"] == "FAIL" and tf["pathx_diff"] == ""
    assert float(tf["lra_average_published"]) == pytest.approx(
        (36.37 + 64.27 + 57.46 + 42.44 + 71.40) / 5
    )
    # cosformer is only in a_source; performer in neither: empty
    assert rows["cosformer"]["listops_published_source"] == "a_source"
    assert rows["performer"]["listops_published"] == ""
    md = (out / "leaderboard.md").read_text()
    assert "36.37 [1] (+23.63)" in md and "[1] lra_paper: Tay et al." in md
    assert "## Published rows not matched" in md and "Mystery Model (lra_paper, Table 1)" in md
    assert "LRA avg (5)" in md and "Avg (6, FAIL=50)" in md  # the rules, named
    trace = json.loads((out / "sources.json").read_text())
    listops = trace["leaderboard"]["unspecified"]["transformer"]["published"]["listops"]
    assert [p["source"] for p in listops] == ["lra_paper", "a_source"]
    assert [p["value"] for p in listops] == [36.37, 40.0]
    assert trace["published_unmatched"] == ["Mystery Model (lra_paper, Table 1)"]


def test_both_averages_on_hand_computed_rows(tmp_path, published):
    records = full_row("transformer", [0.4, 0.6, 0.6, 0.5, 0.9])
    records.append(train("transformer", "pathx", 0, 0.5))
    _, records = store(tmp_path, records)
    lb = leaderboard(records)
    scores, _ = load_published(published)
    comp = compare(lb, scores)
    mine = comp.rows["transformer"]
    assert mine.measured_lra5 == pytest.approx((40 + 60 + 60 + 50 + 90) / 5)  # 60.0
    assert mine.measured_six50 == pytest.approx((40 + 60 + 60 + 50 + 90 + 50) / 6)
    # LRA paper: Path-X FAIL -> the five-task average only, six counts FAIL as 50
    assert [p.source for p in mine.lra5] == ["lra_paper", "a_source"]
    assert mine.lra5[0].value == pytest.approx(271.94 / 5)
    assert mine.six50[0].value == pytest.approx((271.94 + 50) / 6)
    assert mine.six50[1].value == pytest.approx((40 + 60 + 50 + 40 + 70 + 60) / 6)
    row = read_csv(leaderboard_csv([lb], [comp]))["transformer"]
    assert float(row["six_average_fail50"]) == pytest.approx(350 / 6)
    assert float(row["six_average_fail50_diff"]) == pytest.approx(350 / 6 - (271.94 + 50) / 6)


def test_tiny_reports_put_no_published_number_beside_cells(tmp_path, published):
    _, records = store(tmp_path, [train("transformer", f"{t}_tiny", 0, 0.5) for t in OFFICIAL])
    folder = tmp_path / "runs"
    out = tmp_path / "out"
    report.run_report(folder, out, figure=False, curves=False, published_dir=published)
    md = (out / "leaderboard.md").read_text()
    assert "Published numbers are for the official LRA tasks" in md
    assert "published [source]" not in md and "36.37" not in md
    row = read_csv((out / "leaderboard.csv").read_text())["transformer"]
    assert row["listops_tiny_published"] == ""


# ---------------------------------------------------------------- part 3: paper-ready


def tabular_rows(tex: str) -> list[str]:
    body = tex[tex.index("\\begin{tabular}") : tex.index("\\end{tabular}")]
    return [line for line in body.splitlines() if line.endswith("\\\\")]


def test_latex_leaderboard_structure(tmp_path, published):
    records = [
        *full_row("transformer", [0.4, 0.6, 0.6, 0.5, 0.9]),
        *full_row("transformer", [0.5, 0.6, 0.6, 0.5, 0.9], seed=1),
        *full_row("transnormer_t2", [0.3, 0.7, 0.5, 0.6, 0.8]),
    ]
    _, records = store(tmp_path, records)
    lb = leaderboard(records)
    scores, _ = load_published(published)
    tex = leaderboard_latex([lb], [compare(lb, scores)])
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 1
    assert tex.count("\\begin{table}") == tex.count("\\end{table}") == 1
    for rule in ("\\toprule", "\\midrule", "\\bottomrule"):
        assert rule in tex
    assert tex.index("\\toprule") < tex.index("\\midrule") < tex.index("\\bottomrule")
    assert "|" not in tex.split("\\begin{tabular}")[1].split("}")[0]  # no vertical rules
    assert "transnormer\\_t2" in tex and "(\\%)" in tex
    assert not re.search(r"(?<!\\)_(?!\{n=)", tex.replace("$_{n=", "")), "unescaped _"
    rows = tabular_rows(tex)
    widths = {line.count("&") for line in rows}
    assert len(widths) == 1  # every row as wide as the header
    # the best per column in bold: ListOps 45.00 (transformer, two seeds), Text 70.00 (t2)
    tf = next(r for r in rows if r.startswith("transformer &"))
    t2 = next(r for r in rows if r.startswith("transnormer\\_t2 &"))
    assert "\\textbf{45.00 $\\pm$ 7.07$_{n=2}$}" in tf
    assert "\\textbf{70.00$_{n=1}$}" in t2 and "\\textbf" not in t2.split("&")[1]
    # the published block names its source and is never bold
    pub = [r for r in rows if "(lra\\_paper)" in r]
    assert pub and "36.37" in pub[0] and "\\textbf" not in pub[0]
    if shutil.which("pdflatex"):
        (tmp_path / "t.tex").write_text(tex)
        done = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-2000:]


def test_pdflatex_compiles_the_tables_where_installed(tmp_path):
    if not shutil.which("pdflatex"):
        pytest.skip("pdflatex is not installed here; the structure test checks the LaTeX")
    folder, _ = official_store(tmp_path)
    out = tmp_path / "out"
    report.run_report(folder, out, figure=False, curves=False)
    for name in ("leaderboard.tex", "efficiency.tex"):
        done = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", name],
            cwd=out,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-2000:]


def test_figure_and_tables_written_as_pdf_svg_csv_tex(tmp_path, published):
    folder, _ = official_store(tmp_path)
    out = tmp_path / "out"
    paths = report.run_report(folder, out, figure_length=2048, curves=False)
    names = {p.name for p in paths}
    assert {"figure1.png", "figure1.svg", "figure1.pdf", "efficiency.csv"} <= names
    assert (out / "figure1.pdf").read_bytes()[:5] == b"%PDF-"
    assert (out / "figure1.svg").read_text().lstrip().startswith("<?xml")
    eff = list(csv.DictReader(io.StringIO((out / "efficiency.csv").read_text())))
    perf = next(r for r in eff if r["row"] == "performer" and r["length"] == "1024")
    assert float(perf["relative_train_steps_per_sec"]) == pytest.approx(2.5)
    assert float(perf["relative_peak_memory_bytes"]) == pytest.approx(0.5)
    assert perf["relative_to"] == "transformer"
    assert "\\toprule" in (out / "efficiency.tex").read_text()


# ---------------------------------------------------------------- published markers


def test_published_points_are_hollow_markers_labelled_by_source(tmp_path, published):
    _, records = store(
        tmp_path,
        [
            *full_row("cosformer", [0.4, 0.6, 0.6, 0.5, 0.9]),
            bench("cosformer", 2048, 14.0, 18.0, 80 * MIB),
        ],
    )
    scores, eff = load_published(published)
    points = published_points({"cosformer"}, scores, eff, 2048)
    # a_source prints a cosFormer score and speed; 4096 is the length nearest 2048 (a tie
    # with 1024 goes to the shorter), so: 1024
    assert [(p["label"], p["speed_length"]) for p in points] == [("cosFormer (a_source)", 1024)]
    assert points[0]["lra_average"] == pytest.approx((37 + 63 + 60 + 45 + 80) / 5)
    fig1 = figure.figure1(leaderboard(records), efficiency(records), length=2048, published=points)
    seen = {}
    draw = PathCollection.draw

    def spy(self, renderer):  # what the renderer is asked to fill, per collection
        seen[self.get_gid()] = (self.get_facecolor().copy(), len(self.get_offsets()))
        draw(self, renderer)

    PathCollection.draw = spy
    try:
        fig1.figure.canvas.draw()
    finally:
        PathCollection.draw = draw
    faces, count = seen["published"]
    assert count == 1 and (len(faces) == 0 or all(f[3] == 0 for f in faces))  # hollow
    measured, _ = seen["measured"]
    assert all(f[3] > 0 for f in measured)  # filled
    texts = [t.get_text() for t in fig1.figure.axes[0].texts]
    assert "cosFormer (a_source)" in texts or "cosFormer (a_source)" in fig1.unlabelled
    assert "a_source: Someone, Another Paper" in " ".join(
        t.get_text()
        for leg in fig1.figure.legends + [fig1.figure.axes[0].get_legend()]
        for t in leg.get_texts()
    )


# ---------------------------------------------------------------- part 5: figure auto


def run_cli(*args, cwd):
    code = "from lra.report.main import report_main; report_main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=180
    )


def test_report_without_bench_records_writes_what_it_can(tmp_path):
    folder, _ = store(tmp_path, full_row("transformer", [0.5] * 5))
    out = tmp_path / "out"
    paths = report.run_report(folder, out, curves=False)  # figure=auto, the default
    names = {p.name for p in paths}
    assert {"leaderboard.md", "leaderboard.csv", "leaderboard.tex", "efficiency.md"} <= names
    assert not any(n.startswith("figure1") for n in names)
    trace = json.loads((out / "sources.json").read_text())
    assert trace["figure1"]["drawn"] is False and "lra-bench" in trace["figure1"]["why"]
    with pytest.raises(DataError, match="lra-bench -m model=transformer"):
        report.run_report(folder, tmp_path / "o2", curves=False, figure=True)
    assert not (tmp_path / "o2").exists()

    ok = run_cli(f"results_dir=[{folder}]", f"out_dir={tmp_path / 'o3'}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "figure1: not drawn" in ok.stdout and "lra-bench -m model=transformer" in ok.stdout
    assert (tmp_path / "o3" / "leaderboard.md").is_file()
    required = run_cli(
        f"results_dir=[{folder}]", f"out_dir={tmp_path / 'o4'}", "figure=true", cwd=tmp_path
    )
    assert required.returncode != 0 and "lra-bench" in required.stderr
    assert not (tmp_path / "o4").exists()
    bad = run_cli(f"results_dir=[{folder}]", "figure=maybe", cwd=tmp_path)
    assert bad.returncode != 0 and "figure" in bad.stderr


# ---------------------------------------------------------------- part 6: Table 2


def test_table2_relative_to_the_transformer_of_the_same_setting(tmp_path, published):
    _, records = store(
        tmp_path,
        [
            bench("transformer", 1024, 10.0, 20.0, 100 * MIB),
            bench("transformer", 2048, 4.0, 8.0, 400 * MIB),
            bench("transformer", 3072, status="oom"),
            bench("performer", 1024, 25.0, 30.0, 50 * MIB),
            bench("performer", 2048, 12.0, 15.0, 100 * MIB),
            bench("performer", 3072, 8.0, 9.0, 150 * MIB),
            bench("performer", 5120, 4.0, 5.0, 250 * MIB),  # not a Table 2 length
            # another setting (batch 8): its own Transformer, never mixed in
            bench("transformer", 1024, 100.0, 1.0, 10 * MIB, batch_size=8),
            bench("performer", 1024, 50.0, 1.0, 10 * MIB, batch_size=8),
        ],
    )
    _, eff = load_published(published)
    tables = efficiency(records)
    [big, small] = sorted(table2(tables, eff), key=lambda t: t.setting["batch_size"])[::-1]
    assert big.setting["batch_size"] == 20 and big.lengths == (1024, 2048, 3072)
    assert big.baseline == "transformer"
    perf = big.measured["performer"]
    assert perf["speed"] == {1024: 2.5, 2048: 3.0, 3072: None}
    assert perf["memory"] == {1024: 0.5, 2048: 0.25, 3072: None}
    assert big.measured["transformer"]["speed"] == {1024: 1.0, 2048: 1.0, 3072: "OOM"}
    assert small.measured["performer"]["speed"] == {1024: 0.5}
    # published: the printed relative speed (1.2 at 1K), else steps/sec over its Transformer's
    pub = big.published["performer"]
    assert pub["speed"] == {1024: 1.2, 2048: 2.5, 3072: None}
    assert pub["memory"] == {1024: 0.5, 2048: 0.25, 3072: None}
    assert big.published["transformer"]["speed"][1024] == 1.0
    md = efficiency_markdown(tables, table2s=[big, small])
    assert "LRA Table 2 form" in md and "| performer | 2.50 | 3.00 |" in md
    assert "published speed 1K" in md


# ---------------------------------------------------------------- part 4: two softmax paths


def two_paths(protocol="transnormer"):
    sm = "softmax_implementation"
    return [
        *full_row("transformer", [0.4, 0.6, 0.6, 0.5, 0.9], protocol=protocol),
        *full_row("performer", [0.3, 0.6, 0.6, 0.5, 0.8], protocol=protocol),
        bench(
            "transformer",
            2048,
            6.0,
            9.0,
            200 * MIB,
            protocol=protocol,
            **{sm: {"train": "chunked", "eval": "chunked"}},
        ),
        bench(
            "transformer",
            2048,
            4.0,
            6.0,
            800 * MIB,
            protocol=protocol,
            overrides={IMPLEMENTATION_KEY: "plain"},
            config_hash="bench-transformer-plain",
            **{sm: {"train": "plain", "eval": "plain"}},
        ),
        bench("performer", 2048, 12.0, 15.0, 100 * MIB, protocol=protocol, **{sm: None}),
    ]


def test_transformer_on_plain_and_chunked_paths_is_two_rows_and_two_points(tmp_path):
    _, records = store(tmp_path, two_paths())
    [table] = efficiency(records)
    assert table.models == ["transformer (plain)", "transformer (chunked)", "performer"]
    assert table.baseline == "transformer (plain)"  # the paper's Transformer: full L x L
    assert table.relative("transformer (chunked)", 2048, "peak_memory_bytes") == 0.25
    assert table.relative("performer", 2048, "train_steps_per_sec") == 3.0
    data = figure1_data(leaderboard(records), [table], length=2048)
    points = {p.label: p for p in data.points}
    assert set(points) == {"transformer (plain)", "transformer (chunked)", "performer"}
    assert points["transformer (plain)"].y == points["transformer (chunked)"].y
    assert points["transformer (plain)"].memory_bytes == 800 * MIB
    assert points["transformer (chunked)"].memory_bytes == 200 * MIB
    fig1 = figure.draw_figure1(data)
    legend = [t.get_text() for t in fig1.figure.axes[0].get_legend().get_texts()]
    assert "transformer (plain)" in legend and "transformer (chunked)" in legend
    md = efficiency_markdown([table])
    assert (
        "| transformer (plain) | 4.00 |" in md and "| transformer (chunked) | 6.00 (1.50x) |" in md
    )


def test_a_colour_cifar_image_score_never_stands_beside_the_grayscale_image_cell():
    from lra.report.compare import comparable_scores

    scores, _ = load_published()
    lru = next(r for r in scores if r.source.id == "lru_paper" and r.model == "LRU")
    assert isinstance(lru.scores["image"], float)  # shipped as published, marked colour
    assert lru.image_variant == "colour"
    kept = comparable_scores(lru)
    assert kept["image"] is None and kept["listops"] == lru.scores["listops"]
    lra = next(r for r in scores if r.source.id == "lra_paper" and r.model == "Transformer")
    assert comparable_scores(lra) == lra.scores


COLOUR_SOURCE = """
source:
  id: colour_source
  citation: "Someone, A Recurrent Paper"
  table: "Table 3"
  read_from: "test data"
averaging: none
scores:
  - model: "LRU"
    listops: 60.0
    text: 90.0
    retrieval: 90.0
    image: 89.0
    pathfinder: 95.0
    pathx: 94.0
    image_variant: {variant}
    notes: "{notes}"
"""


def lru_comparison(tmp_path, variant, notes=""):
    folder = tmp_path / f"published_{variant}"
    folder.mkdir()
    text = COLOUR_SOURCE.format(variant=variant, notes=notes)
    (folder / "colour_source.yaml").write_text(textwrap.dedent(text))
    records = full_row("lru", [0.6, 0.9, 0.9, 0.8, 0.9])
    records.append(train("lru", "pathx", 0, 0.9))
    _, records = store(tmp_path, records, name=f"runs_{variant}")
    lb = leaderboard(records)
    scores, _ = load_published(folder)
    return lb, compare(lb, scores).rows["lru"]


def test_image_variant_colour_keeps_image_and_averages_out_of_the_comparison(tmp_path):
    # the field decides, not the notes: a colour row whose notes say nothing about colour
    lb, colour = lru_comparison(tmp_path, "colour")
    shown = dict(zip(TASKS, lb.shown, strict=True))  # harness task name -> leaderboard column
    assert shown["image"] not in colour.tasks
    assert [p.value for p in colour.tasks[shown["listops"]]] == [60.0]
    assert [p.value for p in colour.tasks[shown["pathx"]]] == [94.0]
    assert colour.lra5 == [] and colour.six50 == []  # as before: no average without Image
    assert colour.measured_lra5 == pytest.approx((60 + 90 + 90 + 80 + 90) / 5)
    row = read_csv(
        leaderboard_csv([lb], [compare(lb, load_published(tmp_path / "published_colour")[0])])
    )
    assert row["lru"]["image_published"] == "" and row["lru"]["lra_average_published"] == ""
    # the same row on grayscale (notes mentioning colour CIFAR change nothing): compared
    _, gray = lru_comparison(tmp_path, "grayscale", notes="the paper also has a colour CIFAR table")
    assert [p.value for p in gray.tasks[shown["image"]]] == [89.0]
    assert [p.value for p in gray.lra5] == [pytest.approx((60 + 90 + 90 + 89 + 95) / 5)]
    assert [p.value for p in gray.six50] == [pytest.approx((60 + 90 + 90 + 89 + 95 + 94) / 6)]


def test_a_published_spread_is_kept_and_shown_beside_its_value(tmp_path):
    from lra.report.tables import leaderboard_markdown

    scores, _ = load_published()
    lru = next(r for r in scores if r.source.id == "lru_paper" and r.model == "LRU")
    assert lru.spread["listops"] == 0.8 and lru.spread_kind == "standard error over 3 seeds"
    records = full_row("lru", [0.6, 0.9, 0.9, 0.8, 0.9])
    _, records = store(tmp_path, records)
    lb = leaderboard(records)
    comp = compare(lb, scores)
    shown = dict(zip(TASKS, lb.shown, strict=True))
    [listops] = [p for p in comp.rows["lru"].tasks[shown["listops"]] if p.source == "lru_paper"]
    assert (listops.value, listops.spread) == (60.2, 0.8)
    assert listops.trace()["spread_kind"] == "standard error over 3 seeds"
    md = leaderboard_markdown([lb], [comp])
    assert "60.20 ± 0.80 [" in md
    assert "± beside a published value: the source's standard error over 3 seeds." in md
    # a row without a printed spread shows its value alone
    lra = next(r for r in scores if r.source.id == "lra_paper")
    assert lra.spread == {} and lra.spread_kind == ""


def test_a_spread_without_its_kind_names_file_and_key(tmp_path):
    path = tmp_path / "x_paper.yaml"
    path.write_text(
        "source: {id: x_paper, citation: C, table: T, read_from: R}\n"
        "averaging: none\nscores: [{model: M, listops: 50.0, spread: {listops: 1.0}}]\n"
    )
    with pytest.raises(DataError, match=r"x_paper.yaml.*spread_kind"):
        load_file(path)
