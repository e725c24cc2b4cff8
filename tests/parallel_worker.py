"""Run the small listops_tiny training in a fresh process with N CPU devices.

    python tests/parallel_worker.py DATA_DIR RESULTS_DIR NUM_DEVICES [override ...]

Prints ``RESULT <json>`` with the record's numbers and, for NUM_DEVICES > 1, the
error a batch that does not divide over the devices gets. Used by test_parallel.py.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={sys.argv[3]}"
)
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(__file__))

from conftest import train_small  # noqa: E402

from lra.errors import ConfigError  # noqa: E402
from lra.train import parallel  # noqa: E402

record = train_small(sys.argv[1], sys.argv[2], *sys.argv[4:])
out = {
    key: record[key]
    for key in (
        "test_accuracy",
        "num_devices",
        "num_processes",
        "mesh_shape",
        "global_batch_size",
        "per_device_batch_size",
        "record_path",
        "history",
    )
}
if int(sys.argv[3]) > 1:
    try:
        parallel.make_topology({"data": -1}, 15)
    except ConfigError as err:
        out["indivisible_error"] = str(err)
print("RESULT " + json.dumps(out), flush=True)
