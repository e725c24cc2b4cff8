"""Attention mechanisms, one per module; importing this package registers them all.

Each module registers its class with ``lra.models.registry.register(name)``; add a new
mechanism by writing its module and importing it here.
"""

from lra.models.attention import (  # noqa: F401  (importing registers each mechanism)
    cosformer,
    flash,
    linear,
    linformer,
    local,
    long_short,
    nystromformer,
    performer,
    reformer,
    softmax,
    synthesizer,
    transnormer,
)
