"""Learning-rate schedules and the optimizer of the LRA recipes.

LRA (Tay et al., 2020) trains with Adam (b1 0.9, b2 0.98, eps 1e-9) and one
of two schedules, written as a product of factors of ``step``:

* ``rsqrt``:  ``lr * min(1, step / warmup) / sqrt(max(step, warmup))``; the
  peak is ``lr / sqrt(warmup)`` (about 1.6e-3 for ListOps' lr 0.05, warmup 1000);
* ``cosine``: ``lr * min(1, step / warmup) * 0.5 * (1 + cos(pi * progress))``
  with ``progress = (step - warmup) / (num_steps - warmup)`` clipped to [0, 1].
  With ``decay_steps`` set, the cosine's horizon is ``decay_steps`` instead of
  ``num_steps`` and ``progress`` is not clipped above, as in
  ``transformers.get_cosine_schedule_with_warmup`` that the TransNormer authors'
  LRA code used (horizon 50000 whatever the run length): a run longer than the
  horizon sees the learning rate rise again;
* ``constant``: ``lr * min(1, step / warmup)``.

Weight decay is decoupled (AdamW), as in the old ``flax.optim.Adam`` the
official code used; gradient clipping by global norm is applied first when
``grad_clip > 0``.
"""

import jax.numpy as jnp
import optax

from lra.config.schema import check_value
from lra.config.types import Schedule, allowed

SCHEDULES = allowed(Schedule)


def make_schedule(
    name: str,
    learning_rate: float,
    warmup_steps: int,
    num_steps: int,
    decay_steps: int | None = None,
) -> optax.Schedule:
    """The learning rate at each step for one of :data:`SCHEDULES`. The values are checked by
    the schema (lra.config.types: ranges, and ``decay_steps`` > ``warmup_steps``)."""
    check_value("trainer.schedule", name)
    warmup = max(int(warmup_steps), 0)
    horizon = int(num_steps) if decay_steps is None else int(decay_steps)
    decay_span = max(horizon - warmup, 1)
    upper = 1.0 if decay_steps is None else jnp.inf

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        ramp = jnp.minimum(1.0, step / warmup) if warmup > 0 else 1.0
        if name == "rsqrt":
            return (
                learning_rate * ramp * jnp.reciprocal(jnp.sqrt(jnp.maximum(step, max(warmup, 1))))
            )
        if name == "cosine":
            progress = jnp.clip((step - warmup) / decay_span, 0.0, upper)
            return learning_rate * ramp * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return learning_rate * ramp

    return schedule


def make_optimizer(trainer_cfg) -> optax.GradientTransformation:
    """Adam(W) with the configured schedule, decay and clipping."""
    schedule = make_schedule(
        trainer_cfg.schedule,
        trainer_cfg.learning_rate,
        trainer_cfg.warmup_steps,
        trainer_cfg.num_steps,
        trainer_cfg.get("decay_steps"),  # absent in the config of a run older than the key
    )
    parts = []
    if trainer_cfg.grad_clip and trainer_cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(trainer_cfg.grad_clip))
    parts.append(
        optax.adamw(
            schedule,
            b1=trainer_cfg.b1,
            b2=trainer_cfg.b2,
            eps=trainer_cfg.eps,
            weight_decay=trainer_cfg.weight_decay,
        )
    )
    return optax.chain(*parts)
