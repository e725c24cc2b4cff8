"""How many validation and test examples each task's evaluation passes cover, without its data.

``lra-plan`` opens no data file, yet a run's wall time includes its validation passes and its
test pass, whose cost is the number of eval batches. These are the prepared splits' sizes
(``split_sizes`` in every training record), per task name:

- official tasks: the LRA splits (REFERENCE.md, section 1). ListOps 96k / 2k / 2k; Text: IMDB's
  25k train less the harness's 10% hold-out (``val_source: train``) for validation, its 25k
  test; Retrieval: the AAN release's pairs (~147k / 18k / 17k; the TSVs' row counts); Image:
  CIFAR-10's 50k train less 10% for validation, its 10k test; Pathfinder and Path-X: 80 / 10 /
  10% of 200k images.
- tiny tasks: the prepared tiny splits, as their records give them (tests/test_plan.py checks
  the table against the committed records in ``results/cpu-tiny``).

A task's ``val_source: test`` validates on the test split, so its validation passes are the
test split's size.
"""

from lra.errors import ConfigError

#: task name -> (validation examples, test examples) of the prepared splits.
SPLIT_SIZES = {
    "listops": (2000, 2000),
    "text": (2500, 25000),
    "retrieval": (18090, 17437),
    "image": (5000, 10000),
    "pathfinder": (20000, 20000),
    "pathx": (20000, 20000),
    "listops_tiny": (500, 1000),
    "text_tiny": (100, 1000),
    "retrieval_tiny": (128, 128),
    "image_tiny": (80, 200),
    "pathfinder_tiny": (80, 80),
    "pathx_tiny": (24, 24),
}


def eval_examples(task_cfg) -> tuple[int, int]:
    """``(examples per validation pass, test examples)`` of ``task_cfg``."""
    name = str(task_cfg.name)
    if name not in SPLIT_SIZES:
        known = ", ".join(sorted(SPLIT_SIZES))
        raise ConfigError(
            f"lra-plan knows no split sizes for task {name} (it knows {known}); add the task's "
            "validation and test sizes to lra/plan/split_sizes.py (SPLIT_SIZES)"
        )
    val, test = SPLIT_SIZES[name]
    if str(task_cfg.get("val_source") or "") == "test":
        val = test
    return val, test
