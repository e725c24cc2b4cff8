"""lra.device.machine_load: other processes' CPU use per timed window, and what a record keeps."""

import subprocess
import sys
import time

import pytest

from lra.device.machine_load import LOADED_OTHER_CORES, LoadProbe, summarize_windows


def test_a_busy_process_shows_up_as_other_cores_and_our_own_work_does_not():
    probe = LoadProbe()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        probe.start()
        time.sleep(1.0)
        loaded = probe.stop()
    finally:
        busy.kill()
        busy.wait()
    assert loaded["other_cores"] >= 0.6  # one core spinning (other tests may add more)
    assert loaded["load_average"] is not None
    probe.start()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # this process's own work is not "other"
        pass
    own = probe.stop()
    assert own["other_cores"] < loaded["other_cores"]


def test_loaded_windows_are_flagged_and_left_out_of_the_median():
    rates = [10.0, 4.0, 11.0, 12.0]
    loads = [{"other_cores": 0.0}, {"other_cores": 1.5}, {"other_cores": 0.1}, {}]
    out = summarize_windows(rates, loads, "train")
    assert out["train_loaded_windows"] == [1]
    assert out["train_steps_per_sec"] == 11.0  # median of 10, 11, 12
    assert out["train_steps_per_sec_spread"] == pytest.approx((12 - 10) / 11)
    assert out["train_under_load"] is False
    assert out["train_window_other_cores"] == [0.0, 1.5, 0.1, None]
    busy = summarize_windows([5.0, 7.0], [{"other_cores": 2 * LOADED_OTHER_CORES}] * 2, "eval")
    assert busy["eval_under_load"] is True and busy["eval_steps_per_sec"] == 6.0
