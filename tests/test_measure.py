import jax
import jax.numpy as jnp
import pytest

from lra.device import measure


def compile_matmul(n):
    return jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(jnp.ones((n, n)), jnp.ones((n, n))).compile()


def test_flops_of_a_matmul_match_2n3():
    flops = measure.compiled_flops(compile_matmul(128))
    assert flops == pytest.approx(2 * 128**3, rel=0.05)


def test_compiled_memory_counts_arguments_and_outputs():
    small, large = (measure.compiled_memory_bytes(compile_matmul(n)) for n in (64, 256))
    assert small >= 3 * 64 * 64 * 4  # two inputs and one output, float32
    assert large >= 3 * 256 * 256 * 4
    assert large > 10 * small


def test_peak_memory_names_its_source():
    value, source = measure.peak_memory(compile_matmul(64))
    assert value > 0
    expected = (
        measure.MEMORY_SOURCE_COMPILED
        if jax.devices()[0].platform == "cpu"
        else measure.MEMORY_SOURCE_DEVICE
    )
    assert source == expected


class _DeviceWithPeak:
    """A device whose statistics report a fixed peak (as a GPU's memory_stats does)."""

    def __init__(self, peak):
        self.peak = peak

    def memory_stats(self):
        return {"peak_bytes_in_use": self.peak, "bytes_limit": 10**12}


def test_peak_memory_is_the_steps_only_if_they_raised_the_device_peak():
    compiled = compile_matmul(64)
    analysis = measure.compiled_memory_bytes(compiled)
    device = _DeviceWithPeak(5_000_000)
    # The steps raised the peak above what compiling left: the device's figure is theirs.
    assert measure.peak_memory(compiled, device, before=1_000_000) == (
        5_000_000,
        measure.MEMORY_SOURCE_DEVICE,
    )
    # Compiling (e.g. the GPU autotuner's trial buffers) set a peak the steps never reached.
    assert measure.peak_memory(compiled, device, before=5_000_000) == (
        analysis,
        measure.MEMORY_SOURCE_COMPILED,
    )
    assert measure.peak_memory(compiled, device) == (5_000_000, measure.MEMORY_SOURCE_DEVICE)


def test_cpu_memory_flag_is_set_for_the_tests():
    import os

    assert measure.CPU_MEMORY_FLAG in os.environ["XLA_FLAGS"]


def test_window_timer_counts_only_windows():
    timer = measure.WindowTimer()
    assert timer.steps_per_sec is None
    timer.start()
    timer.stop(5, jnp.ones(3))
    timer.start()
    timer.stop(5)
    assert timer.steps == 10 and len(timer.windows) == 2 and timer.steps_per_sec > 0
    with pytest.raises(RuntimeError):
        timer.stop(1)
