"""The networks of the LRA harness: attention mechanisms, the encoder, classifier heads.

Nothing here knows a dataset; the harness in ``lra`` builds models from configs.
"""

import lra.models.attention  # noqa: F401  (registers every mechanism)
import lra.models.ssm  # noqa: F401  (registers the state-space mixers)
from lra.models import registry
from lra.models.encoder import sinusoidal_positions
from lra.models.heads import Classifier, DualClassifier, build_classifier
from lra.models.registry import RegistryError, make_attention, names, register
from lra.models.schedule import describe_layers, resolve_schedule

ATTENTION_NAMES: tuple[str, ...] = names()

__all__ = [
    "ATTENTION_NAMES",
    "Classifier",
    "DualClassifier",
    "RegistryError",
    "build_classifier",
    "describe_layers",
    "make_attention",
    "names",
    "register",
    "registry",
    "resolve_schedule",
    "sinusoidal_positions",
]
