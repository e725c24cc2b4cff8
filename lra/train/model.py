"""The classifier of a run, built from its configs.

:func:`model_kwargs` merges the task's architecture with the model's overrides
(``model.arch_overrides``) into the arguments of :func:`lra.models.build_classifier`;
:func:`build_model` builds it, turning config mistakes into :class:`ConfigError`.
"""

import jax
from flax import nnx
from omegaconf import OmegaConf

import lra.models
from lra.errors import ConfigError


def model_kwargs(cfg) -> dict:
    """Classifier arguments: the task's architecture, then the model's overrides."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    arch = OmegaConf.to_container(cfg.task.arch, resolve=True)
    arch.update(model["arch_overrides"] or {})
    return dict(
        arch,
        vocab_size=cfg.task.vocab_size,
        num_classes=cfg.task.num_classes,
        max_len=cfg.task.max_length,
        attention=model["attention"],
        attention_options=model["attention_options"] or {},
        dual=bool(cfg.task.dual),
        remat=cfg.trainer.remat,
    )


def pretraining(cfg):
    """The :class:`lra.train.objective.Pretraining` of a pretraining stage's config (``stage:
    pretrain``, :mod:`lra.train.pretrain`), else None (a classification run)."""
    if cfg.get("stage") != "pretrain":
        return None
    from lra.train.objective import Pretraining

    return Pretraining.from_config(cfg)


def predictor_kwargs(cfg, kwargs: dict | None = None) -> dict:
    """:func:`lra.models.build_token_predictor`'s arguments for a pretraining stage: the
    classifier's encoder arguments, the objective's vocabulary, outputs and causal mode."""
    objective = pretraining(cfg)
    kwargs = dict(kwargs or model_kwargs(cfg))
    cls_token = kwargs["pooling"] == "cls"  # the classifier's, which the predictor lacks
    for key in ("num_classes", "pooling", "dual"):
        kwargs.pop(key)
    return dict(
        kwargs,
        # layers built as the classifier's: length-shaped parameters (Linformer, Synthesizer,
        # FLASH) must have its shapes to be handed over
        attention_max_len=int(kwargs["max_len"]) + int(cls_token),
        vocab_size=objective.input_vocab,
        outputs=objective.outputs,
        causal=objective.causal,
    )


def build_model(cfg, rngs: nnx.Rngs, kwargs: dict | None = None) -> nnx.Module:
    """The classifier for ``cfg.model`` on ``cfg.task`` (or for ``kwargs``, a
    :func:`model_kwargs` of it), or for a pretraining stage (``stage: pretrain``) the
    per-token model :func:`lra.models.build_token_predictor`; config mistakes become
    ConfigError."""
    try:
        if pretraining(cfg) is not None:
            return lra.models.build_token_predictor(**predictor_kwargs(cfg, kwargs), rngs=rngs)
        return lra.models.build_classifier(**(kwargs or model_kwargs(cfg)), rngs=rngs)
    except (lra.models.RegistryError, TypeError, ValueError) as err:
        raise ConfigError(f"cannot build model {cfg.model.name!r}: {err}") from err


def plain_softmax_kwargs(cfg) -> dict:
    """:func:`model_kwargs` with every softmax layer on the plain path (the same parameters)."""
    kwargs = model_kwargs(cfg)
    options = {k: dict(v or {}) for k, v in (kwargs["attention_options"] or {}).items()}
    options.setdefault("softmax", {})["implementation"] = "plain"
    return {**kwargs, "attention_options": options}


# What the train state keeps of a model (lra.train.steps): its parameters and a BatchNorm's
# running statistics (lra.models.masked_batch_norm); everything else stays in the graph.
TRAIN_STATE_VARIABLES = (nnx.Param, nnx.BatchStat)


def split_model(model: nnx.Module):
    """``(graphdef, params, rest)``: ``params`` the train state's variables
    (:data:`TRAIN_STATE_VARIABLES`), ``rest`` the model's other state."""
    return nnx.split(model, TRAIN_STATE_VARIABLES, ...)


def weights_only(params):
    """``params`` (a train state's) without a BatchNorm's statistics: the trained parameters."""
    if isinstance(params, nnx.State):
        return nnx.split_state(params, nnx.Param, ...)[0]
    return params


def count_params(params) -> int:
    """The number of trained parameters in ``params`` (a BatchNorm's statistics are not)."""
    return int(sum(x.size for x in jax.tree.leaves(weights_only(params))))
