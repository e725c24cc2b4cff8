"""Steps/sec and memory of the official ListOps setting (REFERENCE section 1) for 10 steps.

Synthetic full-length inputs (length 2000), so no data is needed. Prints one JSON line
per batch size; compiled memory is reported even where a batch does not fit this machine.

    python scripts/measure_official_listops.py [batch sizes ...]   # default: 32 4
"""

import json
import sys

from lra.device import measure

measure.configure_cpu_memory_analysis()

from hydra import compose, initialize_config_dir  # noqa: E402

from lra.cli import CONFIG_DIR  # noqa: E402
from lra.measure.bench import measure_length  # noqa: E402


def main(batch_sizes: list[int]) -> None:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=listops", "model=transformer"])
    total_memory = measure_total_memory()
    for batch_size in batch_sizes:
        probe = measure_length(cfg, cfg.task.max_length, batch_size, time_steps=False)
        fits = probe.get("compiled_memory_bytes") and probe["compiled_memory_bytes"] < total_memory
        result = (
            measure_length(cfg, cfg.task.max_length, batch_size, windows=2, steps_per_window=5)
            if fits
            else dict(probe, note="compiled memory exceeds this machine's RAM; not run")
        )
        print(json.dumps(result), flush=True)


def measure_total_memory() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [32, 4])
