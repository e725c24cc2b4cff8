"""configs/bench.yaml for one model, length, batch size and attention dropout: the setting the
side-by-side programs (``scripts/compare_pytorch.py``, ``scripts/dense_floor.py``,
``scripts/softmax_paths.py``) build and time. No PyTorch needed.
"""

from __future__ import annotations

# The options the programs set themselves; as overrides they would be silently replaced.
OWN_KEYS = ("model", "models", "rounds", "task.max_length", "batch_size", "lengths")


class SetupError(Exception):
    """A config or weight the twin cannot mirror: reported as one line, exit status 2."""


def compose_bench_config(model, length, batch_size, overrides=(), attention_dropout=None):
    """configs/bench.yaml with ``model=<model>``, the overrides, then ``task.max_length``,
    ``batch_size`` and ``task.arch.attention_dropout`` (each left as configured if None)."""
    from hydra.errors import HydraException

    from lra.config import schema
    from lra.config.compose import compose_config

    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if key in OWN_KEYS:
            raise SetupError(
                f"override {text!r}: set this with --models, --rounds, --lengths or "
                "--batch-size instead"
            )
    extra = [] if length is None else [f"task.max_length={int(length)}"]
    extra += [] if batch_size is None else [f"batch_size={int(batch_size)}"]
    if attention_dropout is not None:
        extra.append(f"task.arch.attention_dropout={float(attention_dropout)}")
    try:
        cfg = compose_config("bench", [f"model={model}", *overrides, *extra])
    except HydraException as err:
        raise SetupError(f"model={model}: {' '.join(str(err).split())}") from err
    try:
        schema.validate(cfg, "bench")
    except Exception as err:
        raise SetupError(f"model={model}: {err}") from err
    return cfg
