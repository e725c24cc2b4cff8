"""An attention mechanism from outside the LRA harness (the harness's worked example)."""
