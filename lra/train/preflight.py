"""The pre-flight memory check: do the compiled steps fit before any data loads?

XLA's memory analysis of the ahead-of-time compiled train and eval steps says what
one step needs on each device (:func:`lra.device.measure.compiled_memory_bytes`). This
module compares it with what the device has: ``memory_stats()["bytes_limit"]``
on GPU and TPU, the available RAM (``MemAvailable``) on CPU, where all host
devices share the RAM, or ``trainer.memory_limit_gb`` when set. If the step does
not fit, :func:`check_fits` compiles the settings that trade compute for memory,
``trainer.grad_accum`` (micro-batches) and ``trainer.remat`` policies (recomputed
activations), and names the cheapest ones that fit with what each needs
("trainer.grad_accum=4 (9.9 GB → 3.1 GB)"). It never guesses: every suggested override
was compiled and measured, and none needs as much as the setting it replaces. A step that
cannot even be compiled in the device's memory (a GPU's autotuner allocates while
compiling) is treated as one that does not fit. The candidates compile in this process,
under XLA's default scheduler on CPU, where remat as a scan over the layers saves (official
ListOps Transformer: 12.30 GB, 5.43 with ``block``; results/cpu/memory_settings.md).
"""

import logging
import re
from collections.abc import Callable
from pathlib import Path

import jax

from lra.errors import LRAError

log = logging.getLogger("lra.train.preflight")
GB = 1e9
# The trainer.remat policies the search compiles (lra.models.encoder.REMAT_POLICIES), in the
# order it names those that fit; "none" for a run whose remat policy costs memory. On CPU at
# the official settings block saves the most, attention and dots_no_batch about half as much,
# and dots raises the softmax Transformer's memory (results/cpu/memory_settings.md).
REMAT_CANDIDATES = ("none", "attention", "dots_no_batch", "block")


def _policy(remat: str | bool) -> str:
    """A ``trainer.remat`` value as a policy name (``false``/``true``: none/block)."""
    if isinstance(remat, bool):
        return "block" if remat else "none"
    return str(remat)


class OutOfMemory(LRAError):
    """A step needs more memory than the device has."""


def _gb(num_bytes: float) -> str:
    """``9.9 GB``, or ``72 MB`` below 1 GB (so a small step's savings stay visible)."""
    if num_bytes < GB:
        return f"{num_bytes / 1e6:.0f} MB"
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
    measure_bytes: Callable[[int, str], int | None],
    available: int,
    per_device_batch: int,
    grad_accum: int,
    remat: str | bool,
    needed: int | None = None,
    policies: tuple[str, ...] = REMAT_CANDIDATES,
) -> list[tuple[str, int]]:
    """Overrides that fit in ``available`` bytes, each with the bytes it was measured at.

    ``measure_bytes(grad_accum, remat)`` compiles the train step with those settings and
    returns its compiled memory (None: it does not compile in the device's memory).
    ``needed``: the current settings' bytes, when known; nothing that needs as much or more
    is offered. Tried: the smallest larger ``grad_accum`` that fits (same remat); each remat
    policy of ``policies`` alone; and if none fits alone, the smallest ``grad_accum`` that
    fits with the policy that needed least, if it is smaller than the one without (remat
    costs compute; with as many micro-batches it buys nothing). A remat policy is offered
    only as measured: on XLA's CPU, for instance, ``block`` can need more than ``none``
    (results/cpu/memory_settings.md).
    """
    remat = _policy(remat)
    measured: dict[tuple[int, str], int | None] = {}

    def fits(k: int, r: str) -> bool:
        if (k, r) not in measured:
            measured[k, r] = measure_bytes(k, r)
        size = measured[k, r]
        return size is not None and size <= available and (needed is None or size < needed)

    def words(k: int, r: str) -> str:
        parts = []
        if r != remat:
            parts.append(f"trainer.remat={r}")
        if k != grad_accum:
            parts.append(f"trainer.grad_accum={k}")
        return " ".join(parts)

    found = []
    accum = _divisors_above(per_device_batch, grad_accum)
    plain = _smallest_fitting(accum, lambda k: fits(k, remat))
    if plain is not None:
        found.append((words(plain, remat), measured[plain, remat]))
    others = [p for p in policies if p != remat]
    alone = [p for p in others if fits(grad_accum, p)]
    found += [(words(grad_accum, p), measured[grad_accum, p]) for p in alone]
    known = {p: measured[grad_accum, p] for p in others if measured[grad_accum, p] is not None}
    if not alone and known:  # the policy that saves most, with fewer micro-batches than plain
        best = min(known, key=known.get)
        fewer = [k for k in accum if plain is None or k < plain]
        k = _smallest_fitting(fewer, lambda k: fits(k, best))
        if k is not None:
            found.append((words(k, best), measured[k, best]))
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
    measure_bytes: Callable[[int, str], int | None],
    per_device_batch: int,
    grad_accum: int,
    remat: str | bool,
    *,
    step: str = "train step",
    compile_error: BaseException | None = None,
    dropout_rng: str = "hash",
    batch_norm: bool = False,
) -> None:
    """Raise :class:`OutOfMemory` naming what fits if ``needed`` bytes exceed the device's.

    ``step`` names the step that needs ``needed`` (the train or the eval step, whichever
    needs more). ``compile_error``: compiling the steps itself ran out of device memory
    (``needed`` is then unknown and too much); the search for settings that fit runs as
    when the memory analysis is too large, and ``measure_bytes`` returns None for a setting
    that fails the same way. ``dropout_rng``: the run's generator; the advice says when
    ``grad_accum`` would change its dropout masks (:func:`lra.train.dropout_rng.batch_rows`).
    ``batch_norm``: the model normalises with a masked BatchNorm, whose statistics
    ``grad_accum`` changes (each micro-batch's); the advice says so.
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
    found = fitting_overrides(
        measure_bytes, available, per_device_batch, grad_accum, remat, needed=needed
    )
    if found:
        saves = "" if needed is None else f"{_gb(needed)} → "
        advice = "; or ".join(f"{words} ({saves}{_gb(n)})" for words, n in found)
        advice = f"these overrides fit (compiled and measured): {advice}"
        if dropout_rng != "hash" and any("grad_accum" in words for words, _ in found):
            advice += (
                f" (with trainer.dropout_rng={dropout_rng} micro-batches draw other dropout "
                "masks than the whole batch; the hash generator draws the same)"
            )
        if batch_norm and any("grad_accum" in words for words, _ in found):
            advice += (
                " (with task.arch.norm=batch each micro-batch is normalised by its own "
                "statistics, so grad_accum changes the result; a remat policy does not)"
            )
    else:
        advice = (
            "no grad_accum/remat setting fits (each was compiled); use more devices "
            "(trainer.mesh) or a smaller trainer.batch_size (which changes the result)"
        )
    raise OutOfMemory(f"{problem}; {advice}; trainer.preflight=false skips this check")
