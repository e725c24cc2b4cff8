"""Compiling a run's steps with the device-memory checks around them.

:func:`compile_or_explain` compiles the steps (:func:`lra.train.compile.compile_steps`);
:func:`preflight` stops a run whose compiled train or eval step does not fit the device
before any data loads, naming the ``grad_accum``/``remat`` settings that fit
(:mod:`lra.train.preflight`); :func:`out_of_memory` turns the device's own out-of-memory
error into one clear :class:`OutOfMemory`.
"""

from lra.device import measure
from lra.train.compile import compile_steps, compile_train_variant
from lra.train.model import model_kwargs
from lra.train.preflight import OutOfMemory, check_fits, compile_error_summary


def compile_or_explain(cfg, example, topology):
    """:func:`compile_steps`; if compiling runs out of device memory (a GPU's autotuner
    allocates while compiling), the pre-flight search for settings that fit, or with
    ``trainer.preflight=false`` a clean :class:`OutOfMemory`."""
    try:
        return compile_steps(cfg, example, topology=topology)
    except Exception as err:  # XLA raises its own runtime error types
        if not measure.is_out_of_memory(err):
            raise
        if cfg.trainer.preflight:
            preflight(cfg, None, topology, compile_error=err)  # raises OutOfMemory
        raise out_of_memory(err, None) from err


def _steps_bytes(compiled) -> tuple[int | None, str]:
    """Compiled memory of the step that needs more, train or eval, and its name."""
    sizes = {
        f"{name} step": measure.compiled_memory_bytes(step)
        for name, step in (("train", compiled.train_step), ("eval", compiled.eval_step))
        if step is not None
    }
    known = {name: size for name, size in sizes.items() if size is not None}
    if not known:
        return None, "train step"
    name = max(known, key=known.get)
    return known[name], name


def preflight(cfg, compiled, topology, compile_error=None) -> None:
    """Stop (:class:`OutOfMemory`) if the compiled train or eval step does not fit the device
    (``compile_error``: compiling them already ran out of device memory)."""
    trainer = cfg.trainer

    def measure_bytes(grad_accum: int, remat: str) -> int | None:
        try:
            variant = compile_train_variant(
                cfg, topology, grad_accum=grad_accum, remat=remat, evaluate=True
            )
        except Exception as err:  # XLA raises its own runtime error types
            if measure.is_out_of_memory(err):
                return None  # does not even compile in the device's memory
            raise
        return _steps_bytes(variant)[0]

    needed, step = (None, "train step") if compiled is None else _steps_bytes(compiled)
    check_fits(
        needed,
        trainer.memory_limit_gb,
        measure_bytes,
        topology.per_device_batch,
        int(trainer.grad_accum),
        trainer.remat,
        step=step,
        compile_error=compile_error,
        dropout_rng=str(trainer.dropout_rng),
        batch_norm=model_kwargs(cfg).get("norm") == "batch",
    )


def out_of_memory(err: BaseException, compiled) -> OutOfMemory:
    """The clear error for a device that ran out of memory compiling or running ``compiled``."""
    needed = None if compiled is None else measure.compiled_memory_bytes(compiled.train_step)
    plan = "" if needed is None else f" (the compiled train step needs {needed / 1e9:.1f} GB)"
    return OutOfMemory(
        f"the device ran out of memory{plan}: {compile_error_summary(err)}; lower the "
        "memory with trainer.grad_accum=2 (or more), or leave "
        "trainer.preflight=true and trainer.memory_limit_gb=<GB the device has free> to have "
        "the fitting settings found"
    )
