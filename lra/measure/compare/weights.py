"""Config -> the harness's classifier and its PyTorch twin with the same weights; the logits
check.

The harness's initial weights (``nnx.state`` -> numpy) are copied into the twin by module path
plus a per-module rename (flax kernel [in, out] -> torch weight [out, in]; norm scale ->
weight). A harness weight the twin cannot place, or a twin weight left without a harness
value, is a :class:`~lra.measure.bench_config.SetupError`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lra.measure.bench_config import SetupError, compose_bench_config
from lra.measure.compare.attention import TWIN_ATTENTION
from lra.measure.compare.classifier import Classifier, DualClassifier


def twin_kwargs(cfg) -> dict:
    """The twin's constructor arguments: the harness's ``model_kwargs`` with the layer
    schedule resolved; a setting the twin cannot mirror is a SetupError."""
    from lra.models.schedule import resolve_options, resolve_schedule
    from lra.train.model import model_kwargs

    if cfg.trainer.precision != "fp32":
        raise SetupError(
            f"model={cfg.model.name}: the PyTorch twin runs in float32 only; "
            f"got trainer.precision={cfg.trainer.precision}"
        )
    if int(cfg.trainer.grad_accum) != 1:
        raise SetupError(f"model={cfg.model.name}: the twin has no gradient accumulation")
    kwargs = model_kwargs(cfg)
    norm = (kwargs.pop("norm"), kwargs.pop("norm_position"))
    kwargs.pop("norm_momentum")
    if norm != ("layer", "pre"):
        raise SetupError(
            f"model={cfg.model.name}: the PyTorch twin has pre-norm LayerNorm only; got "
            f"task.arch.norm={norm[0]} task.arch.norm_position={norm[1]}"
        )
    schedule = resolve_schedule(kwargs.pop("attention"), int(kwargs["num_layers"]))
    missing = sorted(set(schedule) - set(TWIN_ATTENTION))
    if missing:
        raise SetupError(
            f"model={cfg.model.name} uses {missing}, which the PyTorch twin does not implement "
            f"(it has: {', '.join(TWIN_ATTENTION)})"
        )
    kwargs["options"] = resolve_options(kwargs.pop("attention_options"), schedule)
    kwargs["schedule"] = schedule
    return kwargs


def harness_weights(model) -> dict[tuple, np.ndarray]:
    """Every variable of the harness model (params and state such as Performer's features)."""
    from flax import nnx

    return {
        tuple(path): np.asarray(var.get_value())
        for path, var in nnx.to_flat_state(nnx.state(model))
    }


def _rename(module) -> dict:
    """Harness leaf name -> (twin attribute, transpose?) for one twin module."""
    if isinstance(module, nn.Linear):  # flax kernel [in, out]; torch weight [out, in]
        return {"kernel": ("weight", True), "bias": ("bias", False)}
    if isinstance(module, nn.LayerNorm):
        return {"scale": ("weight", False), "bias": ("bias", False)}
    return getattr(module, "HARNESS_NAMES", {})


def load_harness_weights(twin, weights: dict[tuple, np.ndarray]) -> None:
    """Copy harness weights into the twin; any weight without a place is a SetupError."""
    targets = dict(twin.state_dict(keep_vars=True))
    placed = set()
    for path, value in weights.items():
        shown = "/".join(map(str, path))
        owner = ".".join(map(str, path[:-1]))
        try:
            module = twin.get_submodule(owner)
        except AttributeError as err:
            raise SetupError(f"harness weight {shown}: the twin has no module {owner!r}") from err
        name, transpose = _rename(module).get(path[-1], (str(path[-1]), False))
        full = f"{owner}.{name}" if owner else name
        if full not in targets:
            raise SetupError(f"harness weight {shown}: the twin has no weight {full!r}")
        if transpose:
            value = value.T
        if tuple(targets[full].shape) != value.shape:
            raise SetupError(
                f"harness weight {shown} {value.shape} does not fit twin {full} "
                f"{tuple(targets[full].shape)}"
            )
        with torch.no_grad():
            targets[full].copy_(torch.from_numpy(np.array(value, copy=True)))
        placed.add(full)
    left = sorted(set(targets) - placed)
    if left:
        raise SetupError(f"twin weights with no harness value: {', '.join(left)}")


def build_harness(cfg):
    """The harness classifier as lra.train.compile.compile_steps initialises it (seed cfg.seed)."""
    import jax
    from flax import nnx

    from lra.train.model import build_model

    return build_model(cfg, nnx.Rngs(params=jax.random.key(int(cfg.seed))))


def build_twin(cfg, harness_model):
    """The twin of ``cfg``'s classifier with ``harness_model``'s weights (on the CPU)."""
    kwargs = twin_kwargs(cfg)
    twin = (DualClassifier if kwargs.pop("dual") else Classifier)(**kwargs)
    load_harness_weights(twin, harness_weights(harness_model))
    return twin


def harness_logits(model, batch) -> np.ndarray:
    """Eval-mode logits of the harness model, jitted, at full float32 matmul precision."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)

    def forward(state, tokens, lengths):
        args = [a for pair in zip(tokens, lengths, strict=True) for a in pair]
        return nnx.merge(graphdef, state)(*args, deterministic=True)

    with jax.default_matmul_precision("float32"):
        return np.asarray(jax.jit(forward)(state, batch["tokens"], batch["lengths"]))


def torch_inputs(batch, device) -> list:
    args = []
    for tokens, lengths in zip(batch["tokens"], batch["lengths"], strict=True):
        args.append(torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device))
        args.append(torch.as_tensor(np.asarray(lengths), dtype=torch.long, device=device))
    return args


def twin_logits(twin, batch, device) -> np.ndarray:
    twin.eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            return twin(*torch_inputs(batch, device)).float().cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def check_model(model, length, batch_size, overrides, tolerance, device) -> dict:
    """Twin logits against harness logits on one synthetic batch, eval mode."""
    from lra.measure.bench import synthetic_batch

    cfg = compose_bench_config(model, length, batch_size, overrides)
    harness = build_harness(cfg)
    twin = build_twin(cfg, harness).to(device)
    batch = synthetic_batch(cfg.task, batch_size, length)
    expected = harness_logits(harness, batch)
    got = twin_logits(twin, batch, device)
    diff = float(np.max(np.abs(got - expected)))
    scale = float(np.max(np.abs(expected)))
    limit = tolerance * max(1.0, scale)
    return {
        "model": model,
        "length": int(length),
        "batch_size": int(batch_size),
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "limit": limit,
        "ok": bool(np.isfinite(diff) and diff <= limit),
    }
