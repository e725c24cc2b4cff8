"""The Long-Range Arena harness: data, training loop, measurement, results."""

__version__ = "0.1.0"
