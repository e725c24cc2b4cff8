"""Rematerialised encoder blocks run as a ``lax.scan`` over runs of identical layers.

Why (issue 29, measured in results/cpu/memory_settings.md): with each block wrapped in its own
``nnx.remat`` in a Python loop, XLA CPU is free to schedule every block's recomputation at
once, and on the chunked softmax path (a ``lax.map`` over query blocks) the compiled memory of
a train step *rose* with remat (4 layers, d 128, B 8, L 1024: 549 MiB without remat, 624 MiB
with ``block``). A ``lax.scan`` over the layers forces one layer's recomputation and backward
pass at a time: the same step compiles to 254 MiB, with the same gradients bit for bit.

The scan stacks the layers' states (``float[N, ...]`` per leaf, N layers: a copy of the
block parameters, small next to the activations) and runs ``jax.checkpoint(body, policy)``
over them. Consecutive layers with the same structure (``nnx.graphdef``: same mechanism and
options) form one run; a layer schedule ``{lower: local, upper: softmax}`` gives two scans.

Dropout keys stay those of the Python loop: a layer draws ``n`` keys from the encoder's
``dropout`` stream (``fold_in(key, count)``, ``count`` counting up), so layer ``i`` of a run
starts at ``count0 + i * n``, where ``n`` is counted once by tracing the first layer
(:func:`dropout_draws`). A remat policy therefore never changes a run's numbers: the test
compares the loss and every gradient with ``remat=none`` for every built-in mechanism.

BatchNorm (``norm=batch``, lra.models.masked_batch_norm) updates its running statistics in a
training call: the scan returns each layer's new ``nnx.BatchStat`` values and writes them back
to the layers, as the Python loop's calls would have.

Shapes: ``x: float[B, L, D]``, ``mask: bool[B, L]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["dropout_draws", "runs_of_equal_layers", "scan_blocks"]


def dropout_draws(block: nnx.Module, x: jax.Array, mask: jax.Array, **kw: Any) -> int:
    """How many keys one call of ``block`` draws from a ``dropout`` stream (traced, not run).
    The probe calls a copy of the block, so its state stays as it was (a BatchNorm updates its
    statistics in a training call)."""
    drawn: list[int] = []
    graphdef, state = nnx.split(block)

    def probe(x, key):
        # Under ensure_compile_time_eval the counter (a constant) counts up eagerly and stays
        # readable; the key is traced, so no mask is ever drawn (an eager draw of official
        # ListOps' attention masks would take gigabytes).
        with jax.ensure_compile_time_eval():
            rngs = nnx.Rngs(dropout=key)
            copy = nnx.merge(graphdef, state, copy=True)  # variables of this trace
            copy(x, mask=mask, deterministic=False, rngs=rngs, **kw)
            drawn.append(int(rngs.dropout.count[...]))
        return x

    jax.eval_shape(probe, x, jax.random.key(0))
    return drawn[0]


def runs_of_equal_layers(blocks: Sequence[nnx.Module]) -> list[list[nnx.Module]]:
    """``blocks`` cut into runs of consecutive layers with the same ``nnx.graphdef``."""
    runs: list[list[nnx.Module]] = []
    last = None
    for block in blocks:
        graphdef = nnx.graphdef(block)
        if runs and graphdef == last:
            runs[-1].append(block)
        else:
            runs.append([block])
        last = graphdef
    return runs


def scan_blocks(
    blocks: Sequence[nnx.Module],
    x: jax.Array,
    mask: jax.Array,
    *,
    deterministic: bool,
    rngs: nnx.Rngs | None,
    policy,
    **kw: Any,
) -> jax.Array:
    """``x`` float[B, L, D] through ``blocks`` (one structure), each recomputed in the backward
    pass under the ``jax.checkpoint`` ``policy``; ``rngs``' dropout counter advances as the
    Python loop's would; their ``nnx.BatchStat`` variables (a BatchNorm's running statistics)
    take the values their calls computed. No other state may change during a call."""
    graphdef = nnx.graphdef(blocks[0])
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[nnx.state(b) for b in blocks])
    layers = len(blocks)
    if rngs is None:
        key, per, first = None, 0, jnp.zeros((), jnp.uint32)
    else:
        stream = rngs.dropout
        per = dropout_draws(blocks[0], x, mask, **kw)
        key, first = stream.key[...], stream.count[...]
    counts = first + jnp.arange(layers, dtype=first.dtype) * per

    def body(x, layer):
        state, count = layer
        block = nnx.merge(graphdef, state)
        layer_rngs = None
        if key is not None:
            layer_rngs = nnx.Rngs(dropout=key)
            layer_rngs.dropout.count[...] = count
        y = block(x, mask=mask, deterministic=deterministic, rngs=layer_rngs, **kw)
        return y, nnx.state(block, nnx.BatchStat)

    # prevent_cse=False: inside a scan, CSE cannot merge the recomputation (JAX's advice)
    body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    x, stats = jax.lax.scan(body, x, (stacked, counts))
    if rngs is not None:
        stream.count[...] = first + per * layers
    if jax.tree.leaves(stats):
        for index, block in enumerate(blocks):
            nnx.update(block, jax.tree.map(lambda leaf, i=index: leaf[i], stats))
    return x
