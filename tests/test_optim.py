import math

import numpy as np
import pytest

from lra.errors import ConfigError
from lra.optim import make_schedule


def test_rsqrt_schedule_matches_the_lra_formula():
    lr, warmup = 0.05, 1000
    schedule = make_schedule("rsqrt", lr, warmup, 5000)
    for step in [0, 1, 500, 999, 1000, 1001, 4000, 5000]:
        expected = lr * min(1.0, step / warmup) / math.sqrt(max(step, warmup))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    assert float(schedule(warmup)) == pytest.approx(0.05 / math.sqrt(1000), rel=1e-6)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    schedule = make_schedule("cosine", 1e-3, 100, 1100)
    assert float(schedule(50)) == pytest.approx(5e-4, rel=1e-6)
    assert float(schedule(100)) == pytest.approx(1e-3, rel=1e-6)
    assert float(schedule(600)) == pytest.approx(5e-4, rel=1e-5)
    assert float(schedule(1100)) == pytest.approx(0.0, abs=1e-12)
    values = np.array([float(schedule(s)) for s in range(100, 1101, 50)])
    assert np.all(np.diff(values) <= 0)


def test_constant_schedule_and_no_warmup():
    schedule = make_schedule("constant", 0.1, 0, 10)
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(7)) == pytest.approx(0.1)


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ConfigError, match="rsqrt, cosine, constant"):
        make_schedule("linear", 0.1, 10, 100)
