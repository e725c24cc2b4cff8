"""JAX's persistent compilation cache: compile a step once per machine, not once per run.

A resumed run, a rerun, or the next job of a sweep with the same shapes finds
its compiled steps on disk instead of compiling them again. Configured by the
top-level ``compile_cache`` of ``lra-train`` and ``lra-bench``:

* ``enabled`` (default true): ``false`` turns the cache off for this process;
* ``dir`` (default null): the folder; null = ``$JAX_COMPILATION_CACHE_DIR`` if
  set, else ``$XDG_CACHE_HOME/lra/jax-compile`` (``~/.cache/lra/jax-compile``);
* ``min_compile_seconds`` (default null): compiles faster than this are not
  written; null keeps JAX's setting (1 s, or
  ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``); 0 caches everything.

:func:`CacheCounter` counts JAX's cache hits and misses (``jax.monitoring``
events) so records can say whether their steps came from the cache.
"""

import os
from pathlib import Path

import jax
from jax import monitoring

HIT_EVENT = "/jax/compilation_cache/cache_hits"
MISS_EVENT = "/jax/compilation_cache/cache_misses"


def default_cache_dir() -> Path:
    """``$JAX_COMPILATION_CACHE_DIR``, else ``$XDG_CACHE_HOME/lra/jax-compile``."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lra" / "jax-compile"


def configure_compile_cache(settings) -> str | None:
    """Point JAX's persistent cache at the configured folder (or turn it off).

    Call before the first compile of the process: JAX decides once whether the
    cache is used. Returns the folder in use, or None when off.
    """
    settings = settings or {}
    if not settings.get("enabled", True):
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    folder = Path(settings.get("dir") or default_cache_dir()).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    seconds = settings.get("min_compile_seconds")
    if seconds is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(seconds))
    return str(folder)


class CacheCounter:
    """Counts persistent-cache hits and misses from the moment it is made.

    JAX offers no way to unregister a listener, so one module-level listener feeds
    every counter; a counter reads the totals' difference since it was made.
    """

    _totals = {HIT_EVENT: 0, MISS_EVENT: 0}
    _listening = False

    def __init__(self):
        if not CacheCounter._listening:
            monitoring.register_event_listener(CacheCounter._on_event)
            CacheCounter._listening = True
        self._start = dict(CacheCounter._totals)

    @staticmethod
    def _on_event(event: str, **_) -> None:
        if event in CacheCounter._totals:
            CacheCounter._totals[event] += 1

    def counts(self) -> dict:
        """``{"hits": n, "misses": m}`` since this counter was made."""
        return {
            "hits": CacheCounter._totals[HIT_EVENT] - self._start[HIT_EVENT],
            "misses": CacheCounter._totals[MISS_EVENT] - self._start[MISS_EVENT],
        }
