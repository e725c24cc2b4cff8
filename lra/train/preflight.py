"""The pre-flight memory check: do the compiled steps fit before any data loads?

XLA's memory analysis of the ahead-of-time compiled train and eval steps says what
one step needs on each device (:func:`lra.device.measure.compiled_memory_bytes`). This
module compares it with what the device has: ``memory_stats()["bytes_limit"]``
on GPU and TPU, the available RAM (``MemAvailable``) on CPU, where all host
devices share the RAM, or ``trainer.memory_limit_gb`` when set. If the step does
not fit, :func:`check_fits` compiles the settings that trade compute for memory,
``trainer.grad_accum`` (micro-batches) and ``trainer.remat`` (recomputed
activations), and names the cheapest ones that fit. It never guesses: every
suggested override was compiled and measured. A step that cannot even be compiled
in the device's memory (a GPU's autotuner allocates while compiling) is treated as
one that does not fit.
"""

import logging
import re
from collections.abc import Callable
from pathlib import Path

import jax

from lra.errors import LRAError

log = logging.getLogger("lra.train.preflight")
GB = 1e9


class OutOfMemory(LRAError):
    """A step needs more memory than the device has."""


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:.1f} GB"


def _available_ram() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_memory(limit_gb=None, device=None) -> tuple[int | None, str]:
    """``(bytes one device may use, where that figure comes from)``; None if unknown.

    On CPU the figure is the available RAM divided by the process's CPU devices
    (they share it).
    """
    if limit_gb is not None:
        return int(float(limit_gb) * GB), "trainer.memory_limit_gb"
    device = device or jax.local_devices()[0]
    if device.platform == "cpu":
        ram = _available_ram()
        if ram is None:
            return None, "unknown"
        share = len(jax.local_devices(backend="cpu"))
        where = "available RAM" if share == 1 else f"available RAM / {share} CPU devices"
        return ram // share, where
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a backend without statistics
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.device_kind} bytes_limit"
    return None, "unknown"


def _divisors_above(n: int, low: int) -> list[int]:
    return [k for k in range(low + 1, n + 1) if n % k == 0]


def _smallest_fitting(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The smallest candidate for which ``fits`` holds, by bisection (memory falls as it grows)."""
    low, high, found = 0, len(candidates) - 1, None
    while low <= high:
        mid = (low + high) // 2
        if fits(candidates[mid]):
            found, high = candidates[mid], mid - 1
        else:
            low = mid + 1
    return found


def fitting_overrides(
    measure_bytes: Callable[[int, bool], int | None],
    available: int,
    per_device_batch: int,
    grad_accum: int,
    remat: bool,
) -> list[tuple[str, int]]:
    """Overrides that fit in ``available`` bytes, each with the bytes it was measured at.

    ``measure_bytes(grad_accum, remat)`` compiles the train step with those
    settings and returns its compiled memory. Tried: the smallest larger
    ``grad_accum`` that fits (same remat), ``remat=true`` alone, and else the
    smallest ``grad_accum`` that fits with ``remat=true`` if it is smaller than
    the one without (remat costs compute; with as many micro-batches it buys nothing).
    """
    measured: dict[tuple[int, bool], int | None] = {}

    def fits(k: int, r: bool) -> bool:
        if (k, r) not in measured:
            measured[k, r] = measure_bytes(k, r)
        return measured[k, r] is not None and measured[k, r] <= available

    def words(k: int, r: bool) -> str:
        parts = []
        if r != remat:
            parts.append("trainer.remat=true")
        if k != grad_accum:
            parts.append(f"trainer.grad_accum={k}")
        return " ".join(parts)

    found = []
    accum = _divisors_above(per_device_batch, grad_accum)
    plain = _smallest_fitting(accum, lambda k: fits(k, remat))
    if plain is not None:
        found.append((words(plain, remat), measured[plain, remat]))
    if not remat:
        if fits(grad_accum, True):
            found.append((words(grad_accum, True), measured[grad_accum, True]))
        else:  # remat is worth naming only if it needs fewer micro-batches
            fewer = [k for k in accum if plain is None or k < plain]
            k = _smallest_fitting(fewer, lambda k: fits(k, True))
            if k is not None:
                found.append((words(k, True), measured[k, True]))
    return found


def compile_error_summary(err: BaseException) -> str:
    """The allocation a failed compile asked for, in XLA's words, else its first line.

    On a GPU, XLA's autotuner allocates trial buffers while compiling, so a step far too
    large for the device fails to compile (``RESOURCE_EXHAUSTED: Failed to get configs
    ... Out of memory while trying to allocate 244.40GiB``) before any memory analysis.
    """
    text = str(err)
    found = re.search(r"Out of memory while trying to allocate [0-9.]+\s*[KMGT]?i?B", text)
    return found.group(0) if found else text.strip().splitlines()[0][:200]


def check_fits(
    needed: int | None,
    limit_gb,
    measure_bytes: Callable[[int, bool], int | None],
    per_device_batch: int,
    grad_accum: int,
    remat: bool,
    *,
    step: str = "train step",
    compile_error: BaseException | None = None,
) -> None:
    """Raise :class:`OutOfMemory` naming what fits if ``needed`` bytes exceed the device's.

    ``step`` names the step that needs ``needed`` (the train or the eval step, whichever
    needs more). ``compile_error``: compiling the steps itself ran out of device memory
    (``needed`` is then unknown and too much); the search for settings that fit runs as
    when the memory analysis is too large, and ``measure_bytes`` returns None for a setting
    that fails the same way.
    """
    available, source = device_memory(limit_gb)
    if compile_error is not None:
        summary = compile_error_summary(compile_error)
        known = "unknown" if available is None else _gb(available)
        log.info(
            f"pre-flight: compiling the steps ran out of device memory ({summary}; {source} "
            f"is {known}); compiling lower-memory settings to find ones that fit"
        )
        problem = (
            f"the steps do not compile in the device's memory (XLA: {summary}; {source} is {known})"
        )
        available = available if available is not None else float("inf")
    elif needed is None or available is None:
        log.info("pre-flight memory check skipped: the compiled memory or the device's is unknown")
        return
    elif needed <= available:
        log.info(f"pre-flight: the {step} needs {_gb(needed)} of {_gb(available)} ({source})")
        return
    else:
        log.info(
            f"pre-flight: the {step} needs {_gb(needed)} but {source} is {_gb(available)}; "
            "compiling lower-memory settings to find ones that fit"
        )
        problem = (
            f"the {step} needs {_gb(needed)} per device (XLA compiled memory analysis) but "
            f"{source} is {_gb(available)}"
        )
    found = fitting_overrides(measure_bytes, available, per_device_batch, grad_accum, remat)
    if found:
        advice = "; or ".join(f"{words} ({_gb(n)})" for words, n in found)
        advice = f"these overrides fit (compiled and measured): {advice}"
    else:
        advice = (
            "no grad_accum/remat setting fits (each was compiled); use more devices "
            "(trainer.mesh) or a smaller trainer.batch_size (which changes the result)"
        )
    raise OutOfMemory(f"{problem}; {advice}; trainer.preflight=false skips this check")
