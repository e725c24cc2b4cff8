"""lra-check-attention over every built-in mechanism, and on a mechanism that ignores the mask.

The conformance check (lra.measure.conformance) is the contract every mechanism keeps: shapes,
padding (content and, where declared, amount), finite values with one real token, all real tokens
(at length 4096) and bfloat16, finite gradients, jit/eval_shape, and the declared memory class
measured from XLA's compiled memory. Each mechanism's agreement with the formula it implements
is tested in its own test file.
"""

import pytest
from flax import nnx

import lra.models
from lra.cli import check_attention_main
from lra.measure import conformance

BROKEN = "my_attention.broken:MaskIgnoringAttention"  # examples/my_attention, installed


def test_every_figure1_mechanism_is_registered():
    expected = {
        "softmax", "flash_quad", "flash", "long_short", "performer", "cosformer", "linformer",
        "nystromformer", "reformer", "transnormer_diag", "transnormer_norm",
        "synthesizer_dense", "synthesizer_random", "synthesizer_factorized", "local", "linear",
    }  # fmt: skip
    assert expected <= set(lra.models.ATTENTION_NAMES)


# Shorter and fewer than lra-check-attention's default (1024, 2048, 4096) to keep the suite fast
# on 2 cores: each length is one more compile of forward + backward, which dominates the check.
# Two lengths give the slope (linear <= 1.35 < 1.5 <= quadratic); both are on softmax
# attention's chunked path (from 1024 on a CPU). lra-check-attention --all runs the defaults.
TEST_LENGTHS = (1024, 2048)


@pytest.mark.parametrize("name", lra.models.ATTENTION_NAMES)
def test_builtin_mechanism_passes_the_conformance_check(name):
    report = conformance.check_attention(name, memory_lengths=TEST_LENGTHS)
    assert report.passed, report.text()
    checks = {c.name: c for c in report.checks}
    assert checks["memory class"].passed is True  # declared and confirmed, not skipped
    expected_padding_check = name != "nystromformer"  # landmarks depend on the padded length
    assert (checks["same without padding"].passed is True) == expected_padding_check


def test_mask_ignoring_mechanism_fails_on_the_padding_line(capsys):
    with pytest.raises(SystemExit) as stop:
        check_attention_main([BROKEN, "--lengths", "256,512"])
    assert stop.value.code == 1
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("PASS", "FAIL")}
    assert lines["padded"].startswith("FAIL  padded token content")
    assert lines["output"].startswith("PASS")  # the rest of it works: only padding is wrong
    assert "2 failed" in out.splitlines()[-1]


def test_declared_memory_class_is_checked_against_the_measurement():
    class Declared(lra.models.registry.get("softmax")):
        memory_class = "linear"  # a quadratic mechanism claiming to be linear

    subject = conformance._Subject("softmax", {})
    subject.cls = Declared
    subject.build = lambda max_len, seed=0, **options: Declared(
        dim=conformance.DIM,
        num_heads=conformance.HEADS,
        max_len=max_len,
        rngs=nnx.Rngs(seed),
        implementation="plain",
        **options,
    )
    check = conformance._memory_class(subject, (256, 512))
    assert check.passed is False and "slope 1.9" in check.value


def test_a_class_declared_per_instance_is_fitted_on_the_lengths_of_one_path():
    """Softmax attention runs its chunked path (linear memory) from length 1024 on a CPU."""
    subject = conformance._Subject("softmax", {})
    assert [subject.build(n).memory_class for n in (512, 1024)] == ["quadratic", "linear"]
    check = conformance._memory_class(subject, (512, 1024, 2048))
    assert check.passed is True and "declared 'linear'" in check.value
    assert "512:" not in check.value and "1024:" in check.value and "2048:" in check.value
    lone = conformance._memory_class(subject, (256, 512, 1024))
    assert lone.passed is None and "only at length 1024" in lone.value


def test_unloadable_mechanism_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as stop:
        check_attention_main(["no_such_package.attention:Mine"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: attention 'no_such_package.attention:Mine': cannot import")
    assert "Traceback" not in err


def test_bad_lengths_are_an_argument_error(capsys):
    with pytest.raises(SystemExit) as stop:
        check_attention_main(["softmax", "--lengths", "1024"])
    assert stop.value.code == 2
    assert "two or more different" in capsys.readouterr().err


def test_all_writes_one_table_row_per_builtin_mechanism(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(lra.models, "ATTENTION_NAMES", ("performer", "softmax"))
    out = tmp_path / "tables" / "conformance.md"
    with pytest.raises(SystemExit) as stop:
        check_attention_main(["--all", "--lengths", "256,512", "--out", str(out)])
    assert stop.value.code == 0
    text = out.read_text()
    assert text.startswith("`lra-check-attention --all`") and "lengths 256/512" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| mechanism | checks passed | failed | memory class")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    assert [c[:6] for c in cells] == [
        ["performer", "9/9", "-", "linear", cells[0][4], "yes"],
        ["softmax", "9/9", "-", "quadratic", cells[1][4], "yes"],
    ]
    assert float(cells[0][4]) < 1.35 < 1.5 < float(cells[1][4])  # the measured slopes
    assert cells[1][6] == "1.00x softmax attention"
    printed = capsys.readouterr().out
    assert all(row in printed for row in rows)


@pytest.mark.parametrize(
    "argv", [[], ["softmax", "--all"], ["--all", "--option", "a=1"], ["softmax", "--out", "x"]]
)
def test_all_or_one_mechanism_is_a_usage_error_otherwise(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        check_attention_main(argv)
    assert stop.value.code == 2
    assert "error:" in capsys.readouterr().err
