"""Speed, memory and FLOPs of compiled JAX steps, measured one way everywhere.

Used by the training loop (:mod:`lra.train.loop`) and the benchmark, so a training
record and a benchmark record mean the same thing by "steps/sec" and "peak
memory":

* steps/sec: wall time of timed windows that start and end with device work
  awaited (``jax.block_until_ready``); compilation happens ahead of time and is
  never inside a window.
* peak memory: the device's own ``peak_bytes_in_use`` where the backend keeps
  statistics (GPU, TPU) and the measured steps set it (not compiling before them);
  otherwise XLA's compiled memory analysis of the step (arguments + outputs +
  temporaries - aliased donations + generated code). The record names which one in
  ``memory_source``.
* FLOPs: XLA's cost analysis of the compiled step.
"""

import os
import time
from dataclasses import dataclass, field

import jax

from lra.device.machine_load import LoadProbe

# On CPU, the YNN fusion pass folds temporaries into fused kernels that the
# memory analysis then does not count; turning it off makes the compiled
# memory figure reflect the buffers the step really needs.
CPU_MEMORY_FLAG = "--xla_cpu_experimental_ynn_fusion_type="

# XLA's CPU scheduler orders work for parallelism by default, which runs the recomputed
# forward passes of rematerialised blocks early and so keeps their activations alive:
# remat then saves no memory on CPU. The memory-aware scheduler lets it save (a 6-layer
# Transformer at L=2048: 943 MB without remat, 308 MB with it under this flag).
CPU_REMAT_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

MEMORY_SOURCE_DEVICE = "device_peak_bytes_in_use"
MEMORY_SOURCE_COMPILED = "xla_compiled_memory_analysis"


def configure_cpu_memory_analysis() -> None:
    """Add :data:`CPU_MEMORY_FLAG` to ``XLA_FLAGS``; call before JAX starts a backend."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_MEMORY_FLAG}".strip()


def jax_backends_started() -> bool:
    """True once JAX has started its backends in this process (flags and devices are fixed)."""
    from jax._src import xla_bridge  # no public way to ask, as of JAX 0.10

    return xla_bridge.backends_are_initialized()


def configure_cpu_remat() -> bool:
    """Add :data:`CPU_REMAT_FLAG` (XLA CPU's memory-aware scheduler) to ``XLA_FLAGS``: for
    ``scripts/memory_settings.py --cpu-scheduler memory`` and the tests that compare.

    History (results/cpu/memory_settings.md): with per-block ``nnx.remat`` in a Python loop,
    XLA CPU's default scheduler let no remat policy save anything, and ``lra-train`` set this
    flag for remat runs. Since remat runs as a scan over the layers (models/layer_scan.py) the
    default scheduler saves more than this one (official ListOps, Transformer, ``block``: 5.43
    GB against 5.80; 12.30 without remat), so no command sets it any more.
    Returns False (and changes nothing) when a JAX backend has already started in this
    process, since XLA reads its flags once.
    """
    if jax_backends_started():
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_REMAT_FLAG}".strip()
    return True


def compiled_memory_bytes(compiled) -> int | None:
    """Bytes a compiled executable needs per XLA's memory analysis, or None."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if stats is None:
        return None
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.generated_code_size_in_bytes
    )


def is_out_of_memory(err: BaseException) -> bool:
    """True for XLA's allocation failures (RESOURCE_EXHAUSTED / out of memory)."""
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def compiled_flops(compiled) -> float | None:
    """FLOPs of one call of a compiled executable per XLA's cost analysis, or None."""
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, list | tuple):  # older JAX returned one dict per device
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def device_peak_bytes(device=None) -> int | None:
    """The device's own peak allocation since start, where the backend tracks it."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


def peak_memory(compiled, device=None, before: int | None = None) -> tuple[int | None, str]:
    """Peak memory and its source: device statistics if available, else compiled analysis.

    ``before`` is the device's peak just before the measured steps first ran, after
    compiling. The device keeps one peak per process, so earlier work sets it too: in one
    lra-bench process on an H200 (``bench.isolate=false``) every model reported the first
    model's peak, and compiling may allocate (XLA's GPU autotuner tries kernels on real
    buffers). If the steps did not raise the peak above ``before``, the device's figure is
    not theirs, and the compiled analysis is returned instead.
    """
    measured = device_peak_bytes(device)
    if measured is not None and (before is None or measured > before):
        return measured, MEMORY_SOURCE_DEVICE
    return compiled_memory_bytes(compiled), MEMORY_SOURCE_COMPILED


@dataclass
class WindowTimer:
    """Accumulates steps and seconds over timed windows.

    Call :meth:`start` after awaiting the device, run steps, then :meth:`stop`
    with the number of steps and a result to await. Time between windows
    (evaluation, logging) is not counted. Each window also records how busy the
    rest of the machine was (:class:`lra.device.machine_load.LoadProbe`).
    """

    steps: int = 0
    seconds: float = 0.0
    windows: list[float] = field(default_factory=list)
    loads: list[dict] = field(default_factory=list)  # per window: lra.device.machine_load.LoadProbe
    _t0: float | None = None
    _probe: LoadProbe = field(default_factory=LoadProbe)

    def start(self) -> None:
        self._probe.start()
        self._t0 = time.perf_counter()

    def stop(self, num_steps: int, result=None) -> None:
        if self._t0 is None:
            raise RuntimeError("WindowTimer.stop called before start")
        if result is not None:
            jax.block_until_ready(result)
        elapsed = time.perf_counter() - self._t0
        self._t0 = None
        if num_steps > 0:
            self.steps += num_steps
            self.seconds += elapsed
            self.windows.append(num_steps / elapsed if elapsed > 0 else float("inf"))
            self.loads.append(self._probe.stop())

    @property
    def steps_per_sec(self) -> float | None:
        if self.steps == 0 or self.seconds <= 0:
            return None
        return self.steps / self.seconds


def environment() -> dict:
    """Where a measurement ran: device kind, platform, device count, JAX version."""
    device = jax.devices()[0]
    return {
        "device": device.device_kind,
        "platform": device.platform,
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
