"""The networks of the LRA harness: attention mechanisms, the encoder, classifier heads.

Nothing here knows a dataset; the harness in ``lra`` builds models from configs.
"""

import lra.models.attention  # noqa: F401  (registers every mechanism)
import lra.models.ssm  # noqa: F401  (registers the state-space mixers)
from lra.models import registry
from lra.models.encoder import sinusoidal_positions
from lra.models.heads import Classifier, DualClassifier, build_classifier
from lra.models.pretrain import TokenPredictor, build_token_predictor
from lra.models.registry import (
    RegistryError,
    causal_mechanisms,
    make_attention,
    names,
    register,
    supports_causal,
)
from lra.models.schedule import describe_layers, resolve_schedule

ATTENTION_NAMES: tuple[str, ...] = names()

__all__ = [
    "ATTENTION_NAMES",
    "Classifier",
    "DualClassifier",
    "RegistryError",
    "TokenPredictor",
    "build_classifier",
    "build_token_predictor",
    "causal_mechanisms",
    "describe_layers",
    "make_attention",
    "names",
    "register",
    "registry",
    "resolve_schedule",
    "sinusoidal_positions",
    "supports_causal",
]
