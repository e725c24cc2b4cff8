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

Parameter groups (``trainer.param_groups``, issue 27): the state-space references train
their SSM parameters (A or Lambda, B, Delta) with a learning rate of their own and no weight
decay (state-spaces/s4 ``register(name, tensor, lr, wd)`` in its SSM kernels; lindermanlab/S5
``ssm_lr`` and the "ssm" label of ``s5/train_helpers.py``). :func:`param_kind` names each
parameter's kind from its path (``ssm_a``, ``ssm_b``, ``ssm_dt``, ``ssm_d`` or ``default``);
``trainer.param_groups`` maps a kind (or ``ssm``: every SSM kind without a group of its own)
to ``{learning_rate, weight_decay}`` (or ``lr_factor`` in place of ``learning_rate``: that
share of ``trainer.learning_rate``, LRU's "LR factor"), and :func:`make_optimizer` gives each
group its own AdamW through ``optax.multi_transform``. Null keeps the single AdamW,
bit-identical.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from lra.config.schema import check_value
from lra.config.types import Schedule, allowed
from lra.errors import ConfigError

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


# --- parameter groups (issue 27 part 4) ------------------------------------------------------

#: The group every parameter of no listed kind falls in; it takes ``trainer.*``.
DEFAULT_GROUP = "default"
#: The kinds :func:`param_kind` gives an SSM parameter: the state matrix (A, Lambda, lambda),
#: the input matrix B (with LRU's input normalisation gamma), the step Delta, and Mamba's
#: skip D.
SSM_KINDS = ("ssm_a", "ssm_b", "ssm_dt", "ssm_d")
#: ``ssm``: every SSM kind that has no group of its own.
SSM_GROUP = "ssm"
GROUP_NAMES = (SSM_GROUP, *SSM_KINDS)

# Mixer -> (the child names that identify its module, {parameter name: kind}). Each entry
# follows what the reference trains specially:
# - s4d (models/ssm/s4d.py): state-spaces/s4 src/models/sequence/kernels/ssm.py
#   SSMKernelDiag.register_params registers A_real, A_imag (lr_dict['A']), B (lr_dict['B']) and
#   inv_dt (lr_dict['dt']) with their own learning rate and weight decay (wd 0.0 by default);
#   C and D are ordinary parameters.
# - s5 (models/ssm/s5.py): lindermanlab/S5 s5/train_helpers.py create_train_state puts
#   Lambda_re, Lambda_im and log_step (unless dt_global) in its "ssm" group (Adam at ssm_lr, no
#   decay) and B there only under opt_config=standard; C, C1, C2 and D are "regular".
# - lru (models/ssm/lru.py): the paper's recurrent parameters nu_log, theta_log (the
#   eigenvalues), gamma_log (the input normalisation) and B; C and D are ordinary.
# - mamba (models/ssm/mamba.py): state-spaces/mamba mamba_simple.py marks A_log and D
#   ``_no_weight_decay``; it has no learning rate of its own for any parameter.
SSM_PARAMETERS: dict[str, tuple[frozenset, dict[str, str]]] = {
    "s4d": (
        frozenset({"log_a_real", "a_imag", "log_dt"}),
        {"log_a_real": "ssm_a", "a_imag": "ssm_a", "b": "ssm_b", "log_dt": "ssm_dt"},
    ),
    "s5": (
        frozenset({"lambda_re", "lambda_im", "log_step"}),
        {"lambda_re": "ssm_a", "lambda_im": "ssm_a", "b": "ssm_b", "log_step": "ssm_dt"},
    ),
    "lru": (
        frozenset({"nu_log", "theta_log", "gamma_log"}),
        {
            "nu_log": "ssm_a",
            "theta_log": "ssm_a",
            "gamma_log": "ssm_b",
            "B_re": "ssm_b",
            "B_im": "ssm_b",
        },
    ),
    "mamba": (
        frozenset({"A_log", "D", "x_proj", "dt_proj"}),
        {"A_log": "ssm_a", "D": "ssm_d"},
    ),
}


def param_kind(path: tuple[str, ...], siblings: frozenset | set = frozenset()) -> str:
    """The kind of the parameter at ``path`` (names from the root, e.g. ``("encoder",
    "blocks", "0", "attention", "forward", "nu_log")``): one of :data:`SSM_KINDS`, or
    :data:`DEFAULT_GROUP`. ``siblings`` are the names of everything in the parameter's own
    module (the other parameters and submodules next to it); a module is an SSM mixer when
    they hold the mixer's signature, so generic names (``b``, ``D``) count only there.

    Names matched, per mixer (see :data:`SSM_PARAMETERS` for the references):

    ========  ============================  ============  ==========  ======
    mixer     ssm_a (A / Lambda / lambda)   ssm_b         ssm_dt      ssm_d
    ========  ============================  ============  ==========  ======
    s4d       log_a_real, a_imag            b             log_dt
    s5        lambda_re, lambda_im          b             log_step
    lru       nu_log, theta_log             gamma_log,
                                            B_re, B_im
    mamba     A_log                                                   D
    ========  ============================  ============  ==========  ======
    """
    name = path[-1]
    names = set(siblings) | {name}
    for signature, kinds in SSM_PARAMETERS.values():
        if name in kinds and signature <= names:
            return kinds[name]
    return DEFAULT_GROUP


def _names(path) -> tuple[str, ...]:
    """A JAX key path as plain names (an nnx Variable's trailing ``.value`` dropped)."""
    out = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                out.append(str(getattr(key, attr)))
                break
    if out and out[-1] == "value" and len(out) > 1:
        out.pop()
    return tuple(out)


def param_kinds(params) -> dict[tuple[str, ...], str]:
    """``{path: kind}`` of every parameter leaf of ``params`` (an nnx.State or any pytree)."""
    paths = [_names(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    children: dict[tuple[str, ...], set] = {}  # module path -> names of its children
    for path in paths:
        for depth in range(len(path)):
            children.setdefault(path[:depth], set()).add(path[depth])
    return {path: param_kind(path, frozenset(children[path[:-1]])) for path in paths}


def _group_of(kind: str, groups) -> str:
    """The group a parameter of ``kind`` is trained in under ``groups`` (its names)."""
    if kind in groups:
        return kind
    if kind in SSM_KINDS and SSM_GROUP in groups:
        return SSM_GROUP
    return DEFAULT_GROUP


def _groups(trainer_cfg) -> dict:
    """``trainer.param_groups`` as ``{name: {"learning_rate", "weight_decay"}}`` (a group's
    ``lr_factor`` times ``trainer.learning_rate`` when it gives no rate of its own; a missing
    weight decay is ``trainer.weight_decay``); ``{}`` when it is null or absent."""
    groups = trainer_cfg.get("param_groups") if hasattr(trainer_cfg, "get") else None
    out = {}
    for name, spec in (groups or {}).items():
        if name not in GROUP_NAMES:
            raise ConfigError(
                f"trainer.param_groups.{name}: unknown group; allowed: {', '.join(GROUP_NAMES)}"
            )
        spec = spec or {}
        rate = spec.get("learning_rate")
        if rate is None:  # lr_factor: a share of trainer.learning_rate (LRU's "LR factor")
            rate = float(spec.get("lr_factor") or 1.0) * float(trainer_cfg.learning_rate)
        out[str(name)] = {
            "learning_rate": float(rate),
            "weight_decay": float(
                trainer_cfg.weight_decay
                if spec.get("weight_decay") is None
                else spec.get("weight_decay")
            ),
        }
    return out


def param_labels(params, groups) -> Any:
    """The group name of every leaf of ``params`` (same tree structure), for
    ``optax.multi_transform``. A group that no parameter falls in is a ConfigError naming it."""
    kinds = param_kinds(params)
    labels = {path: _group_of(kind, groups) for path, kind in kinds.items()}
    unused = sorted(set(groups) - set(labels.values()))
    if unused:
        mixers = ", ".join(SSM_PARAMETERS)
        raise ConfigError(
            f"trainer.param_groups.{unused[0]}: no parameter of this model is in the group "
            f"(SSM parameter groups apply to the mixers {mixers}; set "
            "trainer.param_groups=null for other models)"
        )
    leaves = [labels[_names(p)] for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves)


def _adamw(trainer_cfg, learning_rate: float, weight_decay: float):
    schedule = make_schedule(
        trainer_cfg.schedule,
        learning_rate,
        trainer_cfg.warmup_steps,
        trainer_cfg.num_steps,
        trainer_cfg.get("decay_steps"),  # absent in the config of a run older than the key
    )
    return optax.adamw(
        schedule, b1=trainer_cfg.b1, b2=trainer_cfg.b2, eps=trainer_cfg.eps,
        weight_decay=weight_decay,
    )  # fmt: skip


def make_optimizer(trainer_cfg) -> optax.GradientTransformation:
    """Adam(W) with the configured schedule, decay and clipping.

    With ``trainer.param_groups`` null (or absent) this is one AdamW for every parameter.
    With groups, each group's parameters (:func:`param_labels`) get their own AdamW: the same
    schedule shape (warm-up, then rsqrt/cosine/constant) scaled to the group's learning rate,
    and the group's weight decay; every other parameter takes ``trainer.learning_rate`` and
    ``trainer.weight_decay``. Clipping by global norm covers all parameters together, first.
    """
    groups = _groups(trainer_cfg)
    parts = []
    if trainer_cfg.grad_clip and trainer_cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(trainer_cfg.grad_clip))
    default = _adamw(trainer_cfg, trainer_cfg.learning_rate, trainer_cfg.weight_decay)
    if not groups:
        parts.append(default)
    else:
        transforms = {DEFAULT_GROUP: default}
        for name, spec in groups.items():
            transforms[name] = _adamw(trainer_cfg, spec["learning_rate"], spec["weight_decay"])
        parts.append(optax.multi_transform(transforms, lambda p: param_labels(p, groups)))
    return optax.chain(*parts)


def describe_param_groups(trainer_cfg, params, examples: int = 4) -> dict:
    """The record's ``param_groups``: ``{group: {"learning_rate", "weight_decay",
    "num_tensors", "num_params", "examples"}}``, the default group first; ``examples`` are
    the first few parameter paths of the group (dotted)."""
    groups = _groups(trainer_cfg)
    out = {
        DEFAULT_GROUP: {
            "learning_rate": float(trainer_cfg.learning_rate),
            "weight_decay": float(trainer_cfg.weight_decay),
        },
        **{name: dict(spec) for name, spec in groups.items()},
    }
    for entry in out.values():
        entry.update(num_tensors=0, num_params=0, examples=[])
    sizes = {
        _names(p): int(getattr(leaf, "size", 1))
        for p, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    for path, kind in param_kinds(params).items():
        entry = out[_group_of(kind, groups)]
        entry["num_tensors"] += 1
        entry["num_params"] += sizes[path]
        if len(entry["examples"]) < examples:
            entry["examples"].append(".".join(path))
    return out
