"""The dense-layer floor of the Figure-1 train step, in the harness and in its PyTorch twin.

Issue 15 asks the linear-attention models to train at 1.5x a plain PyTorch twin on the CPU.
Their train step is mostly dense layers (Q/K/V/output projections and the MLP), which both
frameworks run through a GEMM library. This program measures how fast each framework runs the
step WITHOUT attention, next to the full model: every layer's mechanism is replaced by
``value_only`` (``gau_value_only`` for FLASH and FLASH_quad; :mod:`lra.measure.dense_floor`).
Everything else is the model of ``--model``: embeddings, LayerNorms, MLP, dropout, pooling,
loss and AdamW. If the harness's floor is below 1.5x the PyTorch twin's full model, no
attention implementation can reach that ratio on this machine.

Built on :mod:`lra.measure.compare` (the twin, logits check and timing cells; the ``compare``
extra): first the twin's logits must equal the harness's for the full model and the floor at
every length (else exit 1, nothing timed), then round-robin timing
(:mod:`lra.measure.compare.floor`). Prints the min-max steps/s over the rounds and the floor's
share of the 1.5x target::

    PYTHONPATH=<torch> python scripts/dense_floor.py --model transnormer_t2 \\
        --lengths 1024,2048,4096 --rounds 3 --steps 2 --warmup 1 [KEY=VALUE ...]

Overrides after the options go to both (lra-bench's, as in compare_pytorch.py); attention
dropout is 0 (the floor has no attention weights to drop).
"""

import sys

from lra.measure.compare_cli import floor_main

if __name__ == "__main__":
    sys.exit(floor_main())
