"""Token encodings shared by the byte-level and pixel tasks (REFERENCE section 5).

* Text and Retrieval: token = UTF-8 byte + 1 (0 is padding), truncated to the
  stored length: :func:`encode_bytes` -> ``uint16[N, L]``, ``int32[N]``.
* Image: grayscale ``trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)``,
  values 0..255, row major; every pixel is a real token, a black pixel included:
  :func:`grayscale` -> ``uint8[N, H*W]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BYTE_VOCAB_SIZE = 257  # 256 byte values + padding id 0


def encode_bytes(documents: Sequence[bytes], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte-encode documents: ``(uint16[N, max_length] ids = byte + 1, int32[N] lengths)``."""
    tokens = np.zeros((len(documents), max_length), np.uint16)
    lengths = np.zeros(len(documents), np.int32)
    for row, doc in enumerate(documents):
        data = np.frombuffer(doc[:max_length], np.uint8)
        tokens[row, : len(data)] = data.astype(np.uint16) + 1
        lengths[row] = len(data)
    return tokens, lengths


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """``uint8[N, H, W, 3]`` RGB -> ``uint8[N, H*W]`` grayscale tokens (LRA's formula)."""
    rgb = np.asarray(rgb, np.float64)
    gray = (0.2989 * rgb[..., 0] + 0.5870 * rgb[..., 1] + 0.1140 * rgb[..., 2]) / 255.0 * 255.5
    gray = np.clip(np.trunc(gray), 0, 255).astype(np.uint8)
    return gray.reshape(gray.shape[0], -1)
