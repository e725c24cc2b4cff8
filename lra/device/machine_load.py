"""How busy the machine was while a window was timed: other processes' CPU use.

A steps/sec figure measured while something else computes on the same cores
is a figure of that load, not of the model. :class:`LoadProbe` measures, over a
window, the machine's busy CPU time (``/proc/stat``: user, nice, system, irq,
softirq, steal) minus this process's own CPU time (``time.process_time``, every
thread, so XLA's thread pool counts as ours), divided by the window's wall
time: ``other_cores``, the number of cores other processes kept busy on
average (0 on a quiet machine, 1.0 = one core fully taken). Where ``/proc/stat``
does not exist (not Linux) it is None, and the 1-minute load average is kept
instead. :func:`summarize_windows` turns per-window rates and loads into the
figures a record keeps.
"""

import os
import statistics
import time

# A window is "under load" when other processes kept more than this many cores busy.
LOADED_OTHER_CORES = 0.25
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal


def machine_busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores), or None."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()[1:]
    except OSError:
        return None
    ticks = sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class LoadProbe:
    """``start()`` then ``stop()`` around a window; ``stop`` returns the window's load."""

    def start(self) -> None:
        self._busy = machine_busy_seconds()
        self._own = time.process_time()
        self._wall = time.perf_counter()

    def stop(self) -> dict:
        wall = time.perf_counter() - self._wall
        busy, own = machine_busy_seconds(), time.process_time() - self._own
        other = None
        if busy is not None and self._busy is not None and wall > 0:
            # /proc/stat ticks at 100 Hz: a short window reads +-0.01 s per core.
            other = round(max(0.0, (busy - self._busy - own) / wall), 3)
        return {"other_cores": other, "load_average": load_average()}


def summarize_windows(rates: list[float], loads: list[dict], prefix: str) -> dict:
    """The record's figures for one kind of window (``prefix``: ``train`` or ``eval``).

    ``<prefix>_steps_per_sec`` is the median over the windows not taken under load
    (other processes above :data:`LOADED_OTHER_CORES` cores), or over all windows
    when every one was loaded (then ``<prefix>_under_load`` is true). Every window
    is kept with its load, and the spread ((max - min) / median over the windows
    used) says how much the figure moved.
    """
    loaded = [
        i
        for i, load in enumerate(loads)
        if load.get("other_cores") is not None and load["other_cores"] > LOADED_OTHER_CORES
    ]
    clean = [r for i, r in enumerate(rates) if i not in loaded]
    used = clean or rates
    median = statistics.median(used) if used else None
    spread = (max(used) - min(used)) / median if used and median else None
    return {
        f"{prefix}_steps_per_sec": median,
        f"{prefix}_steps_per_sec_windows": rates,
        f"{prefix}_window_other_cores": [load.get("other_cores") for load in loads],
        f"{prefix}_window_load_average": [load.get("load_average") for load in loads],
        f"{prefix}_loaded_windows": loaded,
        f"{prefix}_under_load": bool(rates) and not clean,
        f"{prefix}_steps_per_sec_spread": spread,
    }
