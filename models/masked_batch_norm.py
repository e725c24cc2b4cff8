"""BatchNorm over the real tokens of a padded batch (issue 27: the norm of S4, S5 and LRU, and
of TransNormer's authors on some tasks, whose ``torch.nn.BatchNorm1d`` keeps per-GPU
statistics; this one is synchronised).

Ioffe & Szegedy, "Batch Normalization" (ICML 2015), applied per channel over the batch and
the sequence, as the state-space references use it: S4 (state-spaces/s4 ``src/models/nn/
normalization.py``, ``BatchNorm1d`` over [B, D, L], PyTorch momentum 0.1) and S5
(lindermanlab/S5 ``s5/layers.py``, ``nn.BatchNorm`` over (B, L); ``run_train.py``'s
``--bn_momentum`` defaults to 0.95, its Pathfinder and Path-X scripts pass 0.9). Read, not
copied. The references count padded positions in the statistics; this one does not.

Shapes: ``x: float[B, L, D]``, ``mask: bool[B, L]`` (True at real tokens) -> ``float[B, L, D]``.

Training (``use_running_average=False``): the mean and the (biased) variance of each channel
are taken over the real tokens alone, so neither the padded inputs nor how much padding
follows changes any output at a real token; the running statistics move towards them,
``running = momentum * running + (1 - momentum) * batch`` (Flax's convention; PyTorch's
``momentum=0.1`` is ``0.9`` here; ``task.arch.norm_momentum``, default 0.9). Evaluation
uses the running statistics. Padded positions are normalised too (with the same statistics);
nothing downstream reads them.

Across devices: the train step is one ``jax.jit`` over the global batch, so the sums below
run over every device's rows (XLA inserts the all-reduce): SyncBatchNorm, with no axis name.
Under ``trainer.grad_accum=K`` they cover one micro-batch, as in PyTorch with accumulation,
and the step's new running statistics average the K micro-batches'
(:mod:`lra.train.steps`).

Retrieval's dual encoder runs its two documents as one batch of 2B rows (:mod:`lra.models.heads`,
as the S4 and S5 code stacks them): the statistics cover both documents' real tokens and the
running statistics move once a step.

The statistics are ``nnx.BatchStat`` variables: the train state keeps them beside the
parameters, with no gradient and no optimizer update (:mod:`lra.train.steps`), so they are in
every checkpoint and in the best-validation parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["MaskedBatchNorm", "masked_moments"]


def masked_moments(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-channel mean and biased variance (float32[D]) of ``x`` float[B, L, D] over the
    positions where ``mask`` bool[B, L] is True (zeros where no position is)."""
    x = x.astype(jnp.float32)
    weights = mask.astype(jnp.float32)[..., None]
    count = jnp.maximum(jnp.sum(weights), 1.0)
    mean = jnp.sum(x * weights, axis=(0, 1)) / count
    var = jnp.sum(jnp.square(x - mean) * weights, axis=(0, 1)) / count
    return mean, var


class MaskedBatchNorm(nnx.Module):
    """Per-channel BatchNorm whose batch statistics cover real tokens only (module docstring)."""

    def __init__(self, dim: int, *, momentum: float = 0.9, epsilon: float = 1e-5, rngs=None):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"BatchNorm momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))
        self.mean = nnx.BatchStat(jnp.zeros((dim,), jnp.float32))
        self.var = nnx.BatchStat(jnp.ones((dim,), jnp.float32))

    def __call__(self, x: jax.Array, mask: jax.Array, *, use_running_average: bool) -> jax.Array:
        if use_running_average:
            mean, var = self.mean[...], self.var[...]
        else:
            mean, var = masked_moments(x, mask)
            m = self.momentum
            self.mean[...] = m * self.mean[...] + (1.0 - m) * mean
            self.var[...] = m * self.var[...] + (1.0 - m) * var
        inv = jax.lax.rsqrt(var.astype(jnp.float32) + self.epsilon) * self.scale[...]
        y = (x.astype(jnp.float32) - mean) * inv + self.bias[...]
        return y.astype(x.dtype)
