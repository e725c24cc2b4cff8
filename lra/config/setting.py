"""What a record's setting is: a hash, a readable variant name and a protocol.

A leaderboard cell may only average runs of one setting. Three keys of every
record say which setting a run had:

* ``setting``: :func:`lra.config.identity.result_hash` of the resolved config, i.e.
  of everything that can change a result, less the seed (paths, logging,
  checkpoint cadence and the device layout are left out as well). Two seeds of
  one setting share it; a 20-step and a 2000-step run do not.
* ``overrides``: every value that differs from the config Hydra composes from
  the run's group choices alone (``model=``, ``task=``, ``protocol=``), as
  ``{dotted key: value}`` (a key the reference has and the run lacks maps to
  ``"(removed)"``). This catches command-line overrides, ``trainer=bf16`` and
  experiment files alike, and ignores an override that restates a file's value.
* ``variant``: the model name, plus a short ``[key=value, ...]`` suffix listing
  the overrides: ``transformer`` or ``transformer[trainer.num_steps=20]``.
* ``protocol``: the chosen protocol (``lra_official``, ``transnormer`` or ``authors``, see
  ``configs/protocol/``) when nothing was overridden, else ``custom``. A protocol's per model x
  task file (``configs/protocol_model_task/``) is part of the reference config, so its values
  are not overrides.
"""

import json
import logging

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from lra.config.compose import compose_config
from lra.config.identity import result_config, result_hash

log = logging.getLogger(__name__)

CUSTOM = "custom"
REMOVED = "(removed)"
# Group choices a reference config is composed from; everything else is an override.
REFERENCE_GROUPS = ("model", "task", "protocol")
_VALUE_CHARS = 24
_SUFFIX_CHARS = 72


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict) and tree:
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def diff_overrides(config: dict, reference: dict) -> dict:
    """``{dotted key: value in config}`` for every result-relevant leaf that differs."""
    ours, theirs = _flatten(result_config(config)), _flatten(result_config(reference))
    diff = {k: v for k, v in ours.items() if k not in theirs or theirs[k] != v}
    # An empty mapping of the reference that the config fills ({} -> {a: 1}) is not removed:
    # its new keys are the difference.
    filled = {k.rsplit(".", i)[0] for k in ours for i in range(1, k.count(".") + 1)}
    diff.update({k: REMOVED for k in theirs if k not in ours and k not in filled})
    return dict(sorted(diff.items()))


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."


def variant_name(model: str, overrides: dict | None) -> str:
    """``model`` or ``model[key=value, ...]`` (long suffixes end in ``+N more``)."""
    if overrides is None:
        return f"{model}[no reference]"
    if not overrides:
        return model
    parts, used = [], 0
    for key, value in overrides.items():
        part = f"{key}={_short(value)}"
        if parts and used + len(part) > _SUFFIX_CHARS:
            parts.append(f"+{len(overrides) - len(parts)} more")
            break
        parts.append(part)
        used += len(part) + 2
    return f"{model}[{', '.join(parts)}]"


def group_choices(config: dict) -> dict:
    """The run's ``model``/``task``/``protocol`` choices: Hydra's, else the config's names."""
    if HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
        if all(choices.get(group) for group in REFERENCE_GROUPS):
            return {group: choices[group] for group in REFERENCE_GROUPS}
    return {
        "model": config["model"]["name"],
        "task": config["task"]["name"],
        "protocol": config.get("protocol") or "lra_official",
    }


def reference_config(choices: dict, config_name: str = "config") -> dict:
    """The resolved config Hydra composes from ``choices`` alone (no value overrides)."""
    overrides = [f"{group}={name}" for group, name in choices.items()]
    return OmegaConf.to_container(compose_config(config_name, overrides), resolve=True)


# The pretraining stage's trainer keys come from pretrain.* (lra.train.pretrain).
_STAGE_KEYS = tuple(
    f"trainer.{k}"
    for k in ("learning_rate", "schedule", "warmup_steps", "num_steps", "decay_steps")
)


def _self_pretraining(config: dict, ignore: tuple) -> tuple[str, tuple]:
    """The variant suffix of a self-pretraining stage (``+spt``, ``+spt-causal``; the
    pretraining stage adds ``:pretrain``) and the override prefixes it explains."""
    init, stage = config.get("init"), config.get("stage")
    if init is None and stage is None:
        return "", ignore
    objective = config["pretrain"]["objective"]
    suffix = "+spt" if objective == "masked" else f"+spt-{objective}"
    if stage is not None:
        return suffix + ":pretrain", (*ignore, "stage", "pretrain.mask_ratio", *_STAGE_KEYS)
    return suffix, (*ignore, "init.")


def describe_setting(
    config: dict, config_name: str = "config", choices=None, ignore: tuple[str, ...] = ()
) -> dict:
    """``setting``, ``variant``, ``protocol`` and ``overrides`` of a resolved run config.

    Overrides of keys starting with a prefix in ``ignore`` are left out of ``overrides``,
    ``variant`` and the protocol decision (``lra-bench``'s lengths and timing options say
    how a model is measured, not which model it is).

    When no reference can be composed (a config built by hand, a model file that
    is no longer on the search path), ``overrides`` is None and the protocol is
    ``custom``: nothing vouches that the run used a protocol's settings.
    """
    choices = choices or group_choices(config)
    suffix, ignore = _self_pretraining(config, ignore)
    if suffix:  # compare with the pretrain preset's own values; init is the suffix
        choices = {**choices, "pretrain": config["pretrain"]["objective"]}
    try:
        overrides = diff_overrides(config, reference_config(choices, config_name))
        overrides = {k: v for k, v in overrides.items() if not k.startswith(ignore)}
    except Exception as err:  # noqa: BLE001 - any composition failure means "no reference"
        log.debug(f"no reference config for {choices}: {err}")
        overrides = None
    return {
        "setting": result_hash(config),
        "variant": variant_name(config["model"]["name"] + suffix, overrides),
        "protocol": choices["protocol"] if overrides == {} else CUSTOM,
        "overrides": overrides,
    }
