"""Attention mechanisms, one per module; importing this package registers them all.

Each module registers its class with ``models.registry.register(name)``; add a new
mechanism by writing its module and importing it here.
"""

from models.attention import softmax  # noqa: F401  (registers "softmax")

__all__ = ["softmax"]
