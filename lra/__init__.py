"""The Long-Range Arena harness: data, training loop, measurement, results."""

from pathlib import Path

__version__ = "0.1.0"

#: The Hydra config folder every entry point composes from (``configs/`` beside ``lra/``).
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")
