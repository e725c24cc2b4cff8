"""The platform a model is built and traced for: the running backend, unless a deviceless
compile names another.

Layers that choose their implementation by platform (softmax attention's ``auto`` path,
:func:`lra.models.attention.softmax.choose_implementation`) ask :func:`target_platform`. It is
``jax.default_backend()``, except inside :func:`compiling_for`, which ``lra-plan
device=tpu:<topology>`` uses to compile for TPU chips from a CPU host (JAX's deviceless
ahead-of-time compilation): the program then takes the path it would take on that platform.
"""

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)


def target_platform() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the platform being compiled for."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str):
    """Within the block, :func:`target_platform` is ``platform``."""
    token = _TARGET.set(str(platform))
    try:
        yield
    finally:
        _TARGET.reset(token)
