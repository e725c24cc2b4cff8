"""Side-by-side train speed of the harness and a plain PyTorch twin of the same classifier.

The harness's config is the source of truth. For each model (``--models``) and length the
script composes ``configs/bench.yaml`` with Hydra's compose API (``model=<name>``, the extra
``KEY=VALUE`` overrides of the command line, ``task.max_length`` and ``batch_size`` from the
options), builds the harness classifier (``lra.train.model.build_model``) and a PyTorch twin of it
(:mod:`lra.measure.compare`: what a competent researcher would write in eager PyTorch, mirroring
``models/encoder.py`` and the attention files, dropout placement included), and copies the
harness's initial weights (``nnx.state`` -> numpy) into the twin by a name mapping per module.
A harness weight the twin cannot place, or a twin weight left without a harness value, is an
error.

1. Equality check (always, before any timing): on ``lra.measure.bench.synthetic_batch`` in eval mode
   (no dropout) the twin's logits must equal the harness's within float32 tolerance,
   max |diff| <= tolerance * max(1, max |logit|). Any model that differs: exit 1, nothing
   timed. ``--check-only`` stops after the check.
2. Timing: train steps/sec (forward + backward + AdamW update) of the harness's compiled
   train step (``lra.train.compile.compile_steps``, the step lra-bench times, with the trainer's
   optimizer) and of the twin (``torch.optim.AdamW`` with the trainer's b1, b2, eps and
   weight decay at a constant learning rate), round-robin: for each round, for each length,
   for each model, for each attention-dropout value: the harness (warm-up steps awaited,
   then ``--steps`` timed steps awaited), then the twin (warm-up, then ``--steps`` timed
   steps). The table gives min-max over rounds, the harness's achieved FLOP/s (XLA's
   FLOPs per train step, ``lra.train.compile.train_step_flops``, times its steps/sec) and the most
   CPU other processes took during any of the cell's timings (``lra.device.machine_load``, in
   cores: 0 on a quiet machine). As lra-bench does, the script sets XLA's CPU flag of
   ``lra.device.measure.configure_cpu_memory_analysis`` (``--xla-flags default`` leaves XLA's
   defaults) and uses JAX's persistent compilation cache (``compile_cache.*``).

PyTorch is not a dependency of the harness; install it with the ``compare`` extra::

    pip install 'lra-harness[compare]'       # in a checkout: pip install -e '.[compare]'
    python scripts/compare_pytorch.py --check-only --lengths 1024 --check-batch-size 2
    python scripts/compare_pytorch.py --models transformer,performer --lengths 1024,2048 \\
        --rounds 3 --out results/compare_pytorch.json
    python scripts/compare_pytorch.py --check-only --lengths 64 task.arch.num_layers=2 \\
        protocol=transnormer                  # any lra-bench override after the options
    python -m lra.measure.compare --help     # the same program

Exit status: 0 done, 1 the equality check failed (nothing timed), 2 a usage or set-up error
(PyTorch missing, a config the twin does not implement, a weight it cannot place).

What the twin does not do: bfloat16 (``trainer.precision=bf16``) and gradient accumulation
(``trainer.grad_accum > 1``) are refused, and mechanisms other than those in
``lra.measure.compare.attention.TWIN_ATTENTION`` (softmax, transnormer_diag, transnormer_norm,
performer, cosformer, flash, flash_quad) are refused with the model that uses them.
"""

import sys

from lra.measure.compare_cli import compare_main

if __name__ == "__main__":
    sys.exit(compare_main())
