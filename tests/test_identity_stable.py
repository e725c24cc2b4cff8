"""Run identities of every committed model x task config, under both protocols, stay as they
were when ``tests/run_keys.json`` was written: a refactor, a new config key whose default
reproduces today's behaviour, or a moved check must not move any existing run folder (else a
campaign in progress stops resuming).

Regenerate the file only on purpose (a change that really changes results), with
``python tests/test_identity_stable.py --write``.
"""

import json
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lra.cli import CONFIG_DIR
from lra.config.identity import run_key

KEYS_FILE = Path(__file__).with_name("run_keys.json")
PROTOCOLS = ("lra_official", "transnormer")


def current_keys(protocols=PROTOCOLS) -> dict[str, str]:
    """``{"<protocol>/<model>/<task>": run key}`` composed as ``lra-train`` composes them."""
    config_dir = Path(CONFIG_DIR)
    models = sorted(p.stem for p in (config_dir / "model").glob("*.yaml"))
    tasks = sorted(p.stem for p in (config_dir / "task").glob("*.yaml"))
    keys = {}
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        for protocol in protocols:
            for model in models:
                for task in tasks:
                    overrides = [f"model={model}", f"task={task}", f"protocol={protocol}"]
                    config = compose(config_name="config", overrides=overrides)
                    keys[f"{protocol}/{model}/{task}"] = run_key(
                        OmegaConf.to_container(config, resolve=True)
                    )
    return keys


# One test per protocol (about 20 s of composes each), so that pytest-xdist's workers share them.
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_run_keys_of_committed_configs_are_unchanged(protocol):
    expected = {
        k: v for k, v in json.loads(KEYS_FILE.read_text()).items() if k.startswith(f"{protocol}/")
    }
    current = current_keys((protocol,))
    # A config added since the file was written has no old identity to keep; every old one must
    # still compose, to the same key.
    changed = {k: (was, current.get(k)) for k, was in expected.items() if current.get(k) != was}
    assert not changed, f"run identities moved (key: (was, now)): {changed}"
    assert len(expected) >= 17 * 12


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    KEYS_FILE.write_text(json.dumps(current_keys(), indent=1, sort_keys=True) + "\n")
