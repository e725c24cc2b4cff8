"""The checks every attention mechanism must pass before it is benchmarked (lra-check-attention).

``check_attention(name)`` runs them on one mechanism: a built-in name, an entry-point name or
an import path ``package.module:ClassName`` (see :mod:`lra.models.registry`). Each check gives one
line: PASS, FAIL or INFO, its name and the value it measured. The mechanism's contract is the
one in ``shared/DESIGN.md``: ``x: float[B, L, D]``, ``mask: bool[B, L]`` (True = real token)
-> ``float[B, L, D]``. Checks, on a small mechanism (``D = 32``, 2 heads) unless noted:

1. output shape and dtype, on a padded batch (lengths 96, 61, 7 of 96);
2. padded token content: replacing the inputs at padded positions by large noise changes no
   real token's output (the mistake of most public LRA ports);
3. same without padding, for classes that declare ``same_without_padding = True``: the real
   tokens' outputs equal those of the same batch with 32 more padded positions;
4. finite outputs and gradients with a single real token per row, with every token real (at
   the longest memory length, 4096: sums over long sequences overflow there first), and with
   parameters and inputs in bfloat16;
5. gradients finite with respect to the parameters and the inputs;
6. ``jax.jit`` and ``jax.eval_shape`` agree, and a training call (dropout on) runs under jit;
7. memory class: XLA's compiled memory of forward + backward at three lengths gives the slope
   of log memory against log length; a class declaring ``memory_class = "linear"`` must show
   a slope of at most 1.35, ``"quadratic"`` at least 1.5 (a module may declare it per
   instance, as softmax attention does: its chunked path is linear; the slope then uses the
   lengths that declare what the longest does);
8. parameters at the LRA Text setting (``configs/task/text.yaml``: width, heads, length) as a
   multiple of softmax attention (plus the MLP for mechanisms that replace it); INFO only,
   since LRA's 1.1x budget applies to whole models, which ``lra-report`` compares.

This lives in ``lra`` (not ``models``) because it measures memory the way the harness does
(:func:`lra.device.measure.compiled_memory_bytes`) and reads the task configs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import OmegaConf

from lra.config.compose import CONFIG_DIR
from lra.device import measure
from lra.models import registry
from lra.train.model import count_params
from lra.train.steps import cast_floats

# Effective when this module is imported before JAX starts its backend (as lra-check-attention
# and a user's test that imports it first do): the memory-class check then measures the
# buffers the step really needs (see lra.device.measure.CPU_MEMORY_FLAG).
measure.configure_cpu_memory_analysis()

__all__ = ["Check", "Report", "check_attention"]

DIM, HEADS = 32, 2
LENGTH, EXTRA = 96, 32
PADDED_LENGTHS = (LENGTH, 61, 7)
MEMORY_LENGTHS = (1024, 2048, 4096)
LINEAR_MAX_SLOPE, QUADRATIC_MIN_SLOPE = 1.35, 1.5
TOLERANCE = 1e-5
# LLVM optimisation changes how fast a program runs, not what it computes or which buffers it
# needs (the compiled memory analysis is the same with and without it, measured for softmax,
# long_short and reformer at 1024 and 4096); it dominates compile time on small CPUs.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@dataclass(frozen=True)
class Check:
    """One line of the report: ``passed`` is True, False, or None for information."""

    name: str
    passed: bool | None
    value: str

    def line(self) -> str:
        status = {True: "PASS", False: "FAIL", None: "INFO"}[self.passed]
        return f"{status}  {self.name:<32} {self.value}"


@dataclass(frozen=True)
class Report:
    mechanism: str
    source: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is False]

    def text(self) -> str:
        counted = [c for c in self.checks if c.passed is not None]
        ok = sum(bool(c.passed) for c in counted)
        head = f"lra-check-attention {self.mechanism} ({self.source})"
        tail = f"{len(counted)} checks: {ok} passed, {len(counted) - ok} failed"
        return "\n".join([head, *(c.line() for c in self.checks), tail])


def _inputs(lengths: Sequence[int], length: int, seed: int = 0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(lengths), length, DIM)).astype(np.float32)
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    return jnp.asarray(x, dtype), jnp.asarray(mask)


def _finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


def _agreement(name: str, out, other, mask, what: str) -> Check:
    """PASS if ``out`` and ``other`` agree at the real tokens within the tolerance, scaled by
    the size of the outputs; ``what`` says how ``other`` was made."""
    real = np.asarray(mask)
    diff = np.abs(np.asarray(out, np.float64) - np.asarray(other, np.float64))[real]
    largest = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(np.asarray(out)[real]).max())
    return Check(
        name,
        largest <= TOLERANCE * (1 + scale),
        f"max |difference| at real tokens {largest:.2e} {what} "
        f"(tolerance {TOLERANCE:g} x (1 + {scale:.2f}))",
    )


class _Subject:
    """One mechanism, built small, and its jitted programs, each compiled once per shape.

    A program maps ``(params, x, mask)`` to ``(output, (d/d params, d/d x))`` of the real
    tokens' squared outputs, so one compile serves the checks of outputs and of gradients.
    The parameters are an argument, not constants closed over: XLA would otherwise fold
    products of them (a factorized Synthesizer's L x L weights) while compiling, which takes
    minutes at length 4096.
    """

    def __init__(self, name: str, options: dict[str, Any]):
        self.name, self.options = name, options
        self.cls = registry.get(name)
        self._small: tuple[nnx.Module, Any, Callable] | None = None
        self._padded: tuple[Any, Any, Any, Any] | None = None
        self._long: dict[int, tuple[Any, Any]] = {}

    def build(self, max_len: int, seed: int = 0, **overrides) -> nnx.Module:
        options = {**self.options, **overrides}
        return registry.make_attention(
            self.name, dim=DIM, num_heads=HEADS, max_len=max_len, rngs=nnx.Rngs(seed), **options
        )

    @staticmethod
    def program(module: nnx.Module) -> tuple[Any, Callable]:
        """``(params, jitted (params, x, mask) -> (output, gradients))`` of ``module``."""
        graphdef, params = nnx.split(module)

        def loss(params, x, mask):
            out = nnx.merge(graphdef, params)(x, mask=mask, deterministic=True)
            real = jnp.where(mask[..., None], out, 0.0).astype(jnp.float32)
            return jnp.sum(real**2), out

        def value_and_grads(params, x, mask):
            (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
                params, x, mask
            )
            return out, grads

        return params, jax.jit(value_and_grads, compiler_options=FAST_COMPILE)

    def small(self) -> tuple[nnx.Module, Any, Callable]:
        """The mechanism for lengths up to ``LENGTH + EXTRA``, its parameters and program."""
        if self._small is None:
            module = self.build(LENGTH + EXTRA)
            self._small = (module, *self.program(module))
        return self._small

    def run(self, x, mask):
        """``(output, gradients)`` of the small mechanism."""
        _, params, program = self.small()
        return program(params, x, mask)

    def padded(self) -> tuple[Any, Any, Any, Any]:
        """``(x, mask, output, gradients)`` of the padded batch (lengths 96, 61, 7 of 96) that
        several checks look at, computed once."""
        if self._padded is None:
            x, mask = _inputs(PADDED_LENGTHS, LENGTH)
            self._padded = (x, mask, *self.run(x, mask))
        return self._padded

    def at_length(self, length: int) -> tuple[Any, Any]:
        """Parameters and the compiled program for one all-real sequence of ``length``
        (the memory-class check measures it; the all-real check runs it)."""
        if length not in self._long:
            params, program = self.program(self.build(length))
            x, mask = _inputs([length], length)
            self._long[length] = (params, program.lower(params, x, mask).compile())
        return self._long[length]

    def forward(self, module: nnx.Module, dtype) -> Callable:
        """Jitted ``(x, mask) -> output`` of ``module`` with its parameters cast to ``dtype``."""
        graphdef, state = nnx.split(module)
        state = cast_floats(state, dtype)

        def apply(state, x, mask):
            return nnx.merge(graphdef, state)(x, mask=mask, deterministic=True)

        jitted = jax.jit(apply, compiler_options=FAST_COMPILE)
        return lambda x, mask: jitted(state, x, mask)


def _shape_and_dtype(s: _Subject) -> Check:
    x, _, out, _ = s.padded()
    ok = out.shape == x.shape and out.dtype == x.dtype
    return Check(
        "output shape and dtype",
        ok,
        f"{tuple(out.shape)} {out.dtype} for input {tuple(x.shape)} {x.dtype}",
    )


def _padded_content(s: _Subject) -> Check:
    x, mask, out, _ = s.padded()
    noise = jnp.asarray(np.random.default_rng(1).normal(size=x.shape).astype(np.float32)) * 5
    changed = jnp.where(mask[..., None], x, noise)
    what = "when the padded inputs change"
    return _agreement("padded token content", out, s.run(changed, mask)[0], mask, what)


def _same_without_padding(s: _Subject) -> Check:
    declared = getattr(s.cls, "same_without_padding", None)
    if declared is not True:
        return Check(
            "same without padding",
            None,
            "not checked: the class does not declare same_without_padding = True",
        )
    x, mask, out, _ = s.padded()
    x_long, mask_long = _inputs(PADDED_LENGTHS, LENGTH + EXTRA, seed=2)
    x_long = x_long.at[:, :LENGTH].set(x)
    out_long = s.run(x_long, mask_long)[0][:, :LENGTH]
    what = f"with {EXTRA} more padded positions (the first row has none without them)"
    return _agreement("same without padding", out, out_long, mask, what)


def _finite_line(title: str, out, grads, lengths, length: int, dtype) -> Check:
    ok = _finite(out) and _finite(grads)
    what = "outputs and gradients" if grads is not None else "outputs"
    value = f"{what} finite: {ok} (lengths {list(lengths)} of {length}, "
    return Check(title, ok, value + f"{jnp.dtype(dtype).name}, output {out.dtype})")


def _single_real_token(s: _Subject) -> Check:
    x, mask = _inputs([1, 1], LENGTH)
    out, grads = s.run(x, mask)
    return _finite_line("single real token", out, grads, [1, 1], LENGTH, jnp.float32)


def _all_real(s: _Subject, length: int) -> Check:
    params, compiled = s.at_length(length)
    x, mask = _inputs([length], length)
    out, grads = compiled(params, x, mask)
    return _finite_line("all tokens real", out, grads, [length], length, jnp.float32)


def _bfloat16(s: _Subject) -> Check:
    lengths = [LENGTH, 61, 1]
    x, mask = _inputs(lengths, LENGTH, dtype=jnp.bfloat16)
    out = s.forward(s.small()[0], jnp.bfloat16)(x, mask)
    return _finite_line("bfloat16", out, None, lengths, LENGTH, jnp.bfloat16)


def _gradients(s: _Subject) -> Check:
    grads = s.padded()[3]
    norm = float(jnp.sqrt(sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads))))
    size = sum(g.size for g in jax.tree.leaves(grads[0]))
    return Check(
        "gradients finite",
        math.isfinite(norm) and _finite(grads),
        f"|grad| {norm:.3g} over {size:,} parameters and the inputs",
    )


def _jit_and_eval_shape(s: _Subject) -> Check:
    x, mask, out, _ = s.padded()
    module = s.small()[0]
    shape = jax.eval_shape(lambda x, m: module(x, mask=m, deterministic=True), x, mask)
    agree = shape.shape == out.shape and shape.dtype == out.dtype
    value = f"eval_shape {tuple(shape.shape)} {shape.dtype}, jit {tuple(out.shape)} {out.dtype}"
    try:
        dropping = s.build(LENGTH + EXTRA, dropout_rate=0.1)
    except (ValueError, TypeError) as err:
        return Check("jit and eval_shape", agree, f"{value}; no dropout call: {err}")
    graphdef, state = nnx.split(dropping)

    def train_call(state, x, mask, key):
        rngs = nnx.Rngs(dropout=key)
        return nnx.merge(graphdef, state)(x, mask=mask, deterministic=False, rngs=rngs)

    train_call = jax.jit(train_call, compiler_options=FAST_COMPILE)
    trained = train_call(state, x, mask, jax.random.key(0))
    ok = agree and trained.shape == x.shape and _finite(trained)
    return Check("jit and eval_shape", ok, f"{value}; training call (dropout 0.1) finite")


def _memory_class(s: _Subject, lengths: Sequence[int]) -> Check:
    # A module may declare its class per instance (softmax: "linear" where it runs its
    # chunked path, which depends on the length and the backend); the slope is fitted over
    # the lengths that declare what the longest one does.
    declared_at = {n: getattr(s.build(n), "memory_class", None) for n in lengths}
    declared = declared_at[max(lengths)]
    lengths = [n for n in lengths if declared_at[n] == declared]
    if len(lengths) < 2:
        return Check(
            "memory class",
            None,
            f"declared {declared!r} only at length {lengths[0]} (the path changes with the "
            f"length: {declared_at}); give two or more lengths on one path",
        )
    sizes = []
    for length in lengths:
        sizes.append(measure.compiled_memory_bytes(s.at_length(length)[1]))
    if any(not b for b in sizes):
        return Check("memory class", None, "this backend has no compiled memory analysis")
    slope = float(np.polyfit(np.log(lengths), np.log(sizes), 1)[0])
    measured = ", ".join(f"{n}: {b / 2**20:.1f} MiB" for n, b in zip(lengths, sizes, strict=True))
    value = f"declared {declared!r}, slope {slope:.2f} ({measured})"
    if declared == "linear":
        return Check("memory class", slope <= LINEAR_MAX_SLOPE, f"{value}; linear <= 1.35")
    if declared == "quadratic":
        return Check("memory class", slope >= QUADRATIC_MIN_SLOPE, f"{value}; quadratic >= 1.5")
    return Check(
        "memory class",
        False,
        f"{value}; declare memory_class = 'linear' or 'quadratic' on the class",
    )


def text_setting() -> dict[str, int]:
    """Width, heads, MLP width and attention length of the LRA Text task."""
    task = OmegaConf.load(Path(CONFIG_DIR) / "task" / "text.yaml").task
    cls = int(task.arch.pooling == "cls")
    return {
        "dim": int(task.arch.dim),
        "qkv_dim": int(task.arch.qkv_dim),
        "num_heads": int(task.arch.num_heads),
        "mlp_dim": int(task.arch.mlp_dim),
        "max_len": int(task.max_length) + cls,
    }


def _param_count(name: str, setting: dict[str, int], options: dict[str, Any]) -> int:
    def build():
        return registry.make_attention(
            name,
            dim=setting["dim"],
            num_heads=setting["num_heads"],
            max_len=setting["max_len"],
            qkv_dim=setting["qkv_dim"],
            rngs=nnx.Rngs(0),
            **options,
        )

    return count_params(nnx.state(nnx.eval_shape(build), nnx.Param))


def _parameters(s: _Subject) -> Check:
    setting = text_setting()
    count = _param_count(s.name, setting, s.options)
    baseline = _param_count("softmax", setting, {})
    against = "softmax attention"
    if getattr(s.cls, "replaces_mlp", False):
        d, m = setting["dim"], setting["mlp_dim"]
        baseline += 2 * d * m + d + m
        against += " + MLP (it replaces the MLP)"
    return Check(
        "parameters at the Text setting",
        None,
        f"{count:,} = {count / baseline:.2f}x {against} ({baseline:,}); "
        f"D={setting['dim']}, heads={setting['num_heads']}, length={setting['max_len']}",
    )


def _run(title: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except Exception as err:  # a crash is a failed check, reported with what raised
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return Check(title, False, f"raised {type(err).__name__}: {message}"[:300])


def check_attention(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    memory_lengths: Sequence[int] = MEMORY_LENGTHS,
) -> Report:
    """Run every check on mechanism ``name`` built with ``options``; never raises for a
    failing mechanism (each failure is a FAIL line), only for one that cannot be loaded."""
    subject = _Subject(name, dict(options or {}))
    checks = [
        ("output shape and dtype", lambda: _shape_and_dtype(subject)),
        ("padded token content", lambda: _padded_content(subject)),
        ("same without padding", lambda: _same_without_padding(subject)),
        ("single real token", lambda: _single_real_token(subject)),
        ("all tokens real", lambda: _all_real(subject, max(memory_lengths))),
        ("bfloat16", lambda: _bfloat16(subject)),
        ("gradients finite", lambda: _gradients(subject)),
        ("jit and eval_shape", lambda: _jit_and_eval_shape(subject)),
        ("memory class", lambda: _memory_class(subject, memory_lengths)),
        ("parameters at the Text setting", lambda: _parameters(subject)),
    ]
    results = tuple(_run(title, check) for title, check in checks)
    return Report(name, registry.source(name), results)
