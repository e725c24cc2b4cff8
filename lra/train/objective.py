"""The self-pretraining objectives: what stage 1 of ``pretrain=masked|causal`` trains on.

Amos, Berant & Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors" (ICLR 2024); reference code IdoAmos/not-from-scratch (read, not
copied). The model is :class:`lra.models.pretrain.TokenPredictor` (an encoder and one Dense
per position, float[B, L, outputs]); :meth:`Pretraining.prepare` turns a batch of the data
pipeline into inputs and per-position targets inside the compiled step, and
:meth:`Pretraining.metrics` sums the loss over the positions that count:

* ``masked``: a ``mask_ratio`` share of the real (non-padding) tokens, drawn independently
  per position, is replaced by the mask token id ``vocab_size`` (a new embedding row, so it
  equals neither padding, which the length mask hides, nor any real id in [0, vocab_size));
  the loss is the cross entropy of the original token at the masked positions only;
* ``causal``: next-token prediction: position i (encoder in causal mode) predicts token i + 1
  for every i + 1 < length.

Image-like tasks (Image, Pathfinder, Path-X: pixel ids 0..255) predict the pixel as a
256-way class (``pixel_target=classify``, the default) or regress it with an L1 loss on
pixel / (vocab_size - 1) (``pixel_target=l1``; one output per position).

The masks are a function of (seed, step): the key is ``fold_in(fold_in(key(seed), SALT),
step)``, so a resumed run draws the masks an uninterrupted one draws. Validation uses one
fixed key (the same masks at every evaluation, so validation losses compare across steps).
Retrieval's two documents are stacked on the batch axis: the shared encoder pretrains on
both.

Shapes (B rows, L length, V = task.vocab_size): batch ``tokens``/``lengths`` tuples of
int32[B, L] / int32[B] (two for Retrieval), ``weights`` float[B]; prepared batch ``tokens``
(int32[nB, L],), ``lengths`` (int32[nB],), ``targets`` int32[nB, L], ``target_weights``
float32[nB, L] (0 where a position does not count).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

# The paper's masking ratios per task family (Amos et al. 2024, appendix): task.dataset ->
# ratio; the _tiny variants and Path-X (dataset pathfinder) share their family's.
MASK_RATIOS = {"listops": 0.10, "text": 0.15, "retrieval": 0.15, "image": 0.50, "pathfinder": 0.50}
IMAGE_LIKE = ("image", "pathfinder")
_SALT = 0x6D61736B  # "mask": the masks' key is never a parameter or dropout key


def mask_ratio_for(pretrain_cfg, task_cfg) -> float:
    """``pretrain.mask_ratio``, or the paper's ratio for the task's family when it is null."""
    ratio = pretrain_cfg.get("mask_ratio")
    return float(MASK_RATIOS[str(task_cfg.dataset)] if ratio is None else ratio)


@dataclass(frozen=True)
class Pretraining:
    """One objective's batch preparation and loss (see the module docstring)."""

    objective: str  # masked | causal
    vocab_size: int  # the task's V: real ids are 0..V-1
    mask_ratio: float
    pixel_target: str  # classify | l1
    seed: int

    @classmethod
    def from_config(cls, cfg) -> Pretraining:
        return cls(
            objective=str(cfg.pretrain.objective),
            vocab_size=int(cfg.task.vocab_size),
            mask_ratio=mask_ratio_for(cfg.pretrain, cfg.task),
            pixel_target=str(cfg.pretrain.pixel_target),
            seed=int(cfg.seed),
        )

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    @property
    def input_vocab(self) -> int:
        """Embedding rows of the pretraining model: one more for the mask token."""
        return self.vocab_size + (self.objective == "masked")

    @property
    def outputs(self) -> int:
        return 1 if self.pixel_target == "l1" else self.vocab_size

    @property
    def causal(self) -> bool:
        return self.objective == "causal"

    def key(self, step=None) -> jax.Array:
        """The masks' key at train ``step`` (a traced int is fine); None: validation's."""
        if step is None:
            return jax.random.fold_in(jax.random.key(self.seed), _SALT + 1)
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), _SALT), step)

    def prepare(self, batch: dict, key: jax.Array) -> dict:
        """Inputs and per-position targets of ``batch`` (both documents stacked for dual)."""
        tokens = jnp.concatenate(batch["tokens"], axis=0)
        lengths = jnp.concatenate(batch["lengths"], axis=0)
        weights = jnp.tile(batch["weights"], len(batch["tokens"]))
        positions = jnp.arange(tokens.shape[1])[None, :]
        real = positions < lengths[:, None]
        if self.objective == "masked":
            chosen = real & (jax.random.uniform(key, tokens.shape) < self.mask_ratio)
            inputs = jnp.where(chosen, jnp.int32(self.mask_id), tokens)
            targets, counted = tokens, chosen
        else:
            inputs = tokens
            targets = jnp.roll(tokens, -1, axis=1)  # position i predicts token i + 1
            counted = positions + 1 < lengths[:, None]
        return {
            "tokens": (inputs,),
            "lengths": (lengths,),
            "targets": targets,
            "target_weights": counted.astype(jnp.float32) * weights[:, None],
        }

    def metrics(self, outputs: jax.Array, batch: dict):
        """``(loss sum, correct count, counted positions)`` over the counted positions."""
        targets, w = batch["targets"], batch["target_weights"]
        if self.pixel_target == "l1":
            scale = float(self.vocab_size - 1)
            pred = outputs[..., 0]
            losses = jnp.abs(pred - targets.astype(jnp.float32) / scale)
            correct = jnp.round(pred * scale) == targets
        else:
            losses = optax.softmax_cross_entropy_with_integer_labels(outputs, targets)
            correct = jnp.argmax(outputs, -1) == targets
        return jnp.sum(losses * w), jnp.sum(correct.astype(jnp.float32) * w), jnp.sum(w)
