"""Tests for lra.data.listops: generator, TSV writer, reader and loader."""

import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from lra.data import listops
from lra.errors import ConfigError, DataError

SMALL = dict(min_length=10, max_length=100)
COUNTS = dict(num_train=200, num_val=50, num_test=50)


# An evaluator written independently of listops.evaluate: it reads the
# serialized string with a stack, ignoring the pair parentheses.
def independent_value(source: str) -> int:
    stack: list[list] = [["ROOT"]]
    for token in source.replace("(", " ").replace(")", " ").split():
        if token in ("[MIN", "[MAX", "[MED", "[SM"):
            stack.append([token])
        elif token == "]":
            op, *args = stack.pop()
            assert args, "operator without arguments"
            if op == "[MIN":
                value = min(args)
            elif op == "[MAX":
                value = max(args)
            elif op == "[MED":
                value = int(statistics.median(args))
            else:
                value = sum(args) % 10
            stack[-1].append(value)
        else:
            assert token.isdigit() and len(token) == 1, token
            stack[-1].append(int(token))
    assert len(stack) == 1 and len(stack[0]) == 2, source
    return stack[0][1]


def token_count(source: str) -> int:
    return len(source.replace("(", " ").replace(")", " ").split())


def read_rows(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "Source\tTarget"
    rows = []
    for line in lines[1:]:
        source, target = line.split("\t")
        rows.append((source, int(target)))
    return rows


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "listops-small"
    return listops.write_listops(out, **COUNTS, **SMALL, seed=3, num_workers=1, progress=False)


# --- trees -------------------------------------------------------------------


def test_official_serialization_and_value():
    tree = ((("[MAX", 2), 9), "]")
    assert listops.to_string(tree) == "( ( ( [MAX 2 ) 9 ) ] )"
    assert listops.evaluate(tree) == 9
    assert listops.to_string(7) == "7"
    assert listops.evaluate(7) == 7


def test_med_of_even_count_truncates_and_sm_is_mod_10():
    assert listops.apply_operator(listops.MED, [2, 5]) == 3
    assert listops.apply_operator(listops.MED, [5, 2, 9]) == 5
    assert listops.apply_operator(listops.MED, [1, 2, 3, 9]) == 2
    assert listops.apply_operator(listops.SUM_MOD, [5, 7, 4]) == 6
    med = ((("[MED", 2), 5), "]")
    assert listops.evaluate(med) == 3
    assert independent_value(listops.to_string(med)) == 3
    nested = (((("[SM", 5), 7), med), "]")
    assert listops.evaluate(nested) == 5
    assert independent_value(listops.to_string(nested)) == 5


def independent_string(tree) -> str:
    if isinstance(tree, tuple):
        return f"( {independent_string(tree[0])} {independent_string(tree[1])} )"
    return str(tree)


def test_generate_tree_length_matches_tokens_and_depth_limit():
    rng = random.Random(1)
    for _ in range(300):
        tree, length = listops.generate_tree(rng, 1)
        source = listops.to_string(tree)
        assert source == independent_string(tree)
        assert token_count(source) == length
        assert listops.evaluate(tree) == independent_value(source)
    # At max_depth every node is a leaf.
    for _ in range(20):
        tree, length = listops.generate_tree(rng, 1, max_depth=1)
        assert isinstance(tree, int) and 0 <= tree <= 9 and length == 1


def test_generate_tree_is_reproducible():
    a = [listops.to_string(listops.generate_tree(random.Random(5), 1)[0]) for _ in range(3)]
    b = [listops.to_string(listops.generate_tree(random.Random(5), 1)[0]) for _ in range(3)]
    assert a == b


# --- writing -----------------------------------------------------------------


def test_generated_files_format_counts_labels_and_lengths(generated):
    all_sources = []
    for split, n in (("train", 200), ("val", 50), ("test", 50)):
        path = generated / f"basic_{split}.tsv"
        assert path.read_text().splitlines()[0] == "Source\tTarget"
        rows = read_rows(path)
        assert len(rows) == n
        for source, label in rows:
            assert label == independent_value(source), source
            assert 10 < token_count(source) < 100
            all_sources.append(source)
    assert len(set(all_sources)) == len(all_sources) == 300
    labels = [
        label
        for name in ("train", "val", "test")
        for _, label in read_rows(generated / f"basic_{name}.tsv")
    ]
    assert len(set(labels)) > 3  # not degenerate

    meta = json.loads((generated / "metadata.json").read_text())
    assert meta["generator"]["seed"] == 3
    assert meta["generator"]["counts"] == {"train": 200, "val": 50, "test": 50}
    assert meta["generator"]["min_length"] == 10 and meta["generator"]["max_length"] == 100
    assert 0 < meta["acceptance_rate"] <= 1
    assert meta["seconds"] >= 0
    # Nothing but the output folder was left in the parent (no temp folder).
    assert [p.name for p in generated.parent.iterdir()] == [generated.name]


def test_same_seed_and_any_worker_count_give_identical_files(generated, tmp_path):
    again = listops.write_listops(
        tmp_path / "again", **COUNTS, **SMALL, seed=3, num_workers=1, progress=False
    )
    pooled = listops.write_listops(
        tmp_path / "pooled", **COUNTS, **SMALL, seed=3, num_workers=2, progress=False
    )
    other = listops.write_listops(
        tmp_path / "other", **COUNTS, **SMALL, seed=4, num_workers=1, progress=False
    )
    for name in listops.SPLIT_FILES.values():
        reference = (generated / name).read_bytes()
        assert (again / name).read_bytes() == reference
        assert (pooled / name).read_bytes() == reference
        assert (other / name).read_bytes() != reference


def test_existing_output_is_not_regenerated(generated, monkeypatch):
    mtimes = {p.name: p.stat().st_mtime_ns for p in generated.iterdir()}

    def fail(*args, **kwargs):
        raise AssertionError("regenerated")

    monkeypatch.setattr(listops, "_generate_into", fail)
    out = listops.write_listops(generated, **COUNTS, **SMALL, seed=3, num_workers=1, progress=False)
    assert out == generated
    assert {p.name: p.stat().st_mtime_ns for p in generated.iterdir()} == mtimes


def test_existing_output_with_other_parameters_is_an_error(generated):
    with pytest.raises(ConfigError, match="seed"):
        listops.write_listops(generated, **COUNTS, **SMALL, seed=9, progress=False)


def test_existing_incomplete_output_is_an_error(tmp_path):
    out = tmp_path / "partial"
    out.mkdir()
    (out / "basic_train.tsv").write_text("Source\tTarget\n")
    with pytest.raises(DataError, match="partial"):
        listops.write_listops(out, **COUNTS, **SMALL, progress=False)


def test_failure_at_the_end_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(listops, "_write_metadata", fail)
    out = tmp_path / "data" / "listops"
    with pytest.raises(RuntimeError, match="disk full"):
        listops.write_listops(out, **COUNTS, **SMALL, num_workers=1, progress=False)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []


def test_interruption_mid_generation_leaves_nothing(tmp_path, monkeypatch):
    real = listops._generate_chunk
    calls = []

    def interrupted(params):
        calls.append(params)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(params)

    monkeypatch.setattr(listops, "_generate_chunk", interrupted)
    out = tmp_path / "listops"
    with pytest.raises(KeyboardInterrupt):
        listops.write_listops(out, **COUNTS, **SMALL, num_workers=1, progress=False)
    assert len(calls) == 3
    assert list(tmp_path.iterdir()) == []


def test_impossible_bounds_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        listops.write_listops(tmp_path / "x", **COUNTS, min_length=10, max_length=11)
    with pytest.raises(ConfigError):
        listops.write_listops(
            tmp_path / "x", **COUNTS, min_length=500, max_length=2000, max_depth=3, max_args=3
        )
    assert not (tmp_path / "x").exists()


# --- reading -----------------------------------------------------------------

SAMPLE = (
    "Source\tTarget\n"
    "( ( ( [MAX 2 ) 9 ) ] )\t9\n"
    "( ( ( ( [SM 5 ) 7 ) 4 ) ] )\t6\n"
    "( ( ( [MED 2 ) 5 ) ] )\t3\n"
    "7\t7\n"
)


def test_vocabulary_is_fixed():
    assert listops.VOCAB_SIZE == 16
    assert [listops.VOCAB[str(d)] for d in range(10)] == list(range(1, 11))
    assert [listops.VOCAB[t] for t in ("[MIN", "[MAX", "[MED", "[SM", "]")] == [11, 12, 13, 14, 15]
    assert listops.tokenize("( ( ( [MAX 2 ) 9 ) ] )") == [12, 3, 10, 15]


def test_read_tsv_sample(tmp_path):
    split = listops.read_tsv(write(tmp_path / "basic_val.tsv", SAMPLE), max_length=6)
    (tokens,) = split.inputs
    (lengths,) = split.lengths
    assert tokens.dtype == np.uint8 and tokens.shape == (4, 6)
    assert lengths.dtype == np.int32 and split.labels.dtype == np.int32
    expected = [
        [12, 3, 10, 15, 0, 0],
        [14, 6, 8, 5, 15, 0],
        [13, 3, 6, 15, 0, 0],
        [8, 0, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(tokens, np.array(expected, dtype=np.uint8))
    np.testing.assert_array_equal(lengths, [4, 5, 4, 1])
    np.testing.assert_array_equal(split.labels, [9, 6, 3, 7])


def test_read_tsv_truncates(tmp_path):
    split = listops.read_tsv(write(tmp_path / "t.tsv", SAMPLE), max_length=3)
    np.testing.assert_array_equal(split.inputs[0], [[12, 3, 10], [14, 6, 8], [13, 3, 6], [8, 0, 0]])
    np.testing.assert_array_equal(split.lengths[0], [3, 3, 3, 1])


def test_read_tsv_accepts_crlf_glued_parens_and_extra_spaces(tmp_path):
    text = "Source\tTarget\r\n((([MAX 2)   9) ])\t9\r\n"
    split = listops.read_tsv(write(tmp_path / "t.tsv", text), max_length=5)
    np.testing.assert_array_equal(split.inputs[0], [[12, 3, 10, 15, 0]])
    assert listops.tokenize("((([MAX 2)   9) ])") == [12, 3, 10, 15]


def test_read_tsv_matches_reference_tokenizer_on_generated_data(generated):
    path = generated / "basic_train.tsv"
    rows = read_rows(path)
    split = listops.read_tsv(path, max_length=100)
    for i, (source, label) in enumerate(rows):
        ids = listops.tokenize(source)
        n = split.lengths[0][i]
        assert n == len(ids) == token_count(source)
        assert split.inputs[0][i, :n].tolist() == ids
        assert not split.inputs[0][i, n:].any()
        assert split.labels[i] == label


@pytest.mark.parametrize(
    ("row", "line", "what"),
    [
        ("( ( ( [MAX 2 ) 9 ) ] )\t9\textra", 3, "fields"),
        ("( ( ( [MAX 2 ) 9 ) ] )", 3, "fields"),
        ("( ( ( [MAX 2 ) 9 ) ] )\tx", 3, "label"),
        ("( ( ( [MAX 2 ) 9 ) ] )\t10", 3, "label"),
        ("( ( ( [MAX 2 ) 9 ) ] )\t-1", 3, "label"),
        ("( ( ( [MAXX 2 ) 9 ) ] )\t9", 3, "MAXX"),
        ("( ( ( [MAX 12 ) 9 ) ] )\t9", 3, "'12'"),
        ("( ( ( [MAX2 ) 9 ) ] )\t9", 3, "MAX2"),
        ("( ( ( [MAX 2 ) 9 ) ] ) é\t9", 3, "unknown"),
        ("( )\t9", 3, "empty"),
    ],
)
def test_read_tsv_malformed_rows(tmp_path, row, line, what):
    path = write(tmp_path / "bad_file.tsv", "Source\tTarget\n7\t7\n" + row + "\n7\t7\n")
    with pytest.raises(DataError) as info:
        listops.read_tsv(path, max_length=10)
    message = str(info.value)
    assert "bad_file.tsv" in message
    assert f"line {line}" in message
    assert what in message


def test_read_tsv_header_and_missing_file(tmp_path):
    path = write(tmp_path / "noheader.tsv", "( ( ( [MAX 2 ) 9 ) ] )\t9\n")
    with pytest.raises(DataError, match=r"noheader\.tsv, line 1"):
        listops.read_tsv(path, max_length=10)
    with pytest.raises(DataError, match=r"missing\.tsv"):
        listops.read_tsv(tmp_path / "missing.tsv", max_length=10)


def test_tokenize_unknown_token():
    with pytest.raises(DataError, match="FOO"):
        listops.tokenize("( [FOO 1 ) ]")


# --- finding and loading -----------------------------------------------------


def make_release(root: Path) -> Path:
    root.mkdir(parents=True)
    for name in listops.SPLIT_FILES.values():
        write(root / name, SAMPLE)
    return root


def test_find_listops_dir_both_levels(tmp_path):
    flat = make_release(tmp_path / "a" / "listops-1000")
    assert listops.find_listops_dir(tmp_path / "a", "listops-1000") == flat
    nested = make_release(tmp_path / "b" / "lra_release" / "listops-1000")
    assert listops.find_listops_dir(tmp_path / "b", "listops-1000") == nested
    assert listops.find_listops_dir(tmp_path / "b" / "lra_release", "listops-1000") == nested
    assert listops.find_listops_dir(tmp_path / "c", "listops-1000") is None
    # An incomplete folder does not count.
    (flat / "basic_test.tsv").unlink()
    assert listops.find_listops_dir(tmp_path / "a", "listops-1000") is None


def test_load_listops(tmp_path):
    make_release(tmp_path / "lra_release" / "listops-1000")
    splits = listops.load_listops(tmp_path, "listops-1000", 8, "lra-data task=listops")
    assert set(splits) == {"train", "val", "test"}
    assert splits["test"].max_length == 8 and len(splits["train"]) == 4


def test_load_listops_missing_names_the_prepare_command(tmp_path):
    command = f"lra-data task=listops data_dir={tmp_path}"
    with pytest.raises(DataError) as info:
        listops.load_listops(tmp_path, "listops-1000", 2000, command)
    assert command in str(info.value)
    assert str(tmp_path) in str(info.value)
