"""What a run's model is, as records describe it (computed from the configs; nothing is built).

``attention_sources`` (where each mechanism's class comes from), ``layers_description``
(the mechanism of each layer) and ``softmax_implementations`` (the path the softmax layers
take on this backend). Training and benchmark records carry them
(:mod:`lra.train.fields`).
"""

import lra.models
from lra.models.platform import target_platform
from lra.train.model import model_kwargs
from lra.train.steps import PRECISIONS


def attention_sources(cfg) -> dict[str, str]:
    """Mechanism name -> where its class comes from (``module:Class``, plus the package and
    version for an entry point), for every mechanism the model's layers use."""
    kwargs = model_kwargs(cfg)
    schedule = lra.models.resolve_schedule(kwargs["attention"], int(kwargs["num_layers"]))
    return {name: lra.models.registry.source(name) for name in sorted(set(schedule))}


def layers_description(cfg) -> dict:
    """``layer_mechanisms`` (the mechanism of each layer, lowest first) and ``schedule_warning``
    (set when a lower/upper schedule lost a part at this depth), as records carry them."""
    kwargs = model_kwargs(cfg)
    return lra.models.describe_layers(kwargs["attention"], int(kwargs["num_layers"]))


def softmax_implementations(cfg) -> dict | None:
    """How the softmax layers run on this backend, ``{"train": ..., "eval": ...}``
    (``cudnn``, ``fused``, ``chunked`` or ``plain``; see lra.models.attention.softmax), or None
    when the model has no softmax layer."""
    from lra.models.attention.softmax import choose_implementation

    kwargs = model_kwargs(cfg)
    if "softmax" not in lra.models.resolve_schedule(kwargs["attention"], int(kwargs["num_layers"])):
        return None
    options = (kwargs["attention_options"] or {}).get("softmax") or {}
    qkv_dim = kwargs["qkv_dim"] or kwargs["dim"]

    def chosen(dropout_active: bool) -> str:
        return choose_implementation(
            options.get("implementation", "auto"),
            platform=target_platform(),
            dtype=PRECISIONS[cfg.trainer.precision],
            head_dim=int(qkv_dim) // int(kwargs["num_heads"]),
            dropout_active=dropout_active,
            max_len=int(kwargs["max_len"]) + int(kwargs["pooling"] == "cls"),  # + the CLS
        )

    return {"train": chosen(float(kwargs["attention_dropout"]) > 0), "eval": chosen(False)}
