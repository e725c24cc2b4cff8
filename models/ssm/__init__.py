"""State-space token mixers, one per module; importing this package registers them all.

They follow the same contract as the attention mechanisms (``lra.models.registry``):
``x: float[B, L, D]``, ``mask: bool[B, L]`` -> ``float[B, L, D]``. ``common`` holds what the
scan-based mixers share (zeroing padding, reversing each row's real tokens, the linear
recurrence by associative scan).
"""

from lra.models.ssm import lru, mamba, s4d, s5  # noqa: F401  (importing registers each mixer)
