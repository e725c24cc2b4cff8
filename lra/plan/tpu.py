"""A TPU plan from a CPU host: each cell compiled for a TPU topology, with no TPU present.

XLA's TPU compiler ships in ``libtpu`` and runs on any x86 host: with the ``tpu-aot`` extra
installed, ``jax.experimental.topologies.get_topology_desc(platform="tpu",
topology_name="v5e:2x2")`` gives the devices of that topology to compile for (JAX's deviceless
ahead-of-time compilation; MaxText's ``train_compile.py`` checks a job's memory this way).
:func:`measure_stage` compiles a cell's train and eval steps for them with the harness's
data-parallel mesh over every device, as ``lra-train`` would on that slice
(:class:`lra.train.parallel.Topology` with ``deviceless``: the state and batch are shapes only;
layers that choose a path by platform take the TPU's, :func:`lra.models.platform.compiling_for`).

What it gives:

- per-device compiled memory (XLA's memory analysis of the TPU program) against the device's
  HBM (:data:`CHIPS`, from ``tpu_chips.yaml``; a v4 chip's two TensorCores are two devices,
  each with half the chip's HBM), whether the cell fits, and where it does not the
  pre-flight's overrides that fit (each compiled for the TPU too);
- an ESTIMATE of the step times, never a measurement: a roofline from the compiled step's cost
  analysis, ``max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth)`` per device, at the
  chip's published bf16 peak (:data:`CHIPS`); XLA's own ``optimal_seconds`` is kept beside it.

libtpu never changes a CPU or GPU run: it is imported only here, and a host without a TPU keeps
the CPU as JAX's default backend (tests/test_plan_tpu.py checks both).
"""

import math
import os
from importlib.resources import files

import yaml
from omegaconf import OmegaConf

from lra.errors import ConfigError

#: generation -> per-chip figures (``peak_bf16_flops_per_sec``, ``hbm_bytes``,
#: ``hbm_bytes_per_sec``, ``device_kind``, ``source``).
CHIPS = yaml.safe_load(files("lra.plan").joinpath("tpu_chips.yaml").read_text())
#: TPU_ACCELERATOR_TYPE libtpu reads (else it warns), per generation, from the chip count.
_ACCELERATOR_TYPE = {"v4": "v4-{cores}", "v5e": "v5litepod-{chips}", "v6e": "v6e-{chips}"}


def parse_device(value: str) -> tuple[str, str]:
    """``("v5e", "v5e:2x2")`` from ``device=tpu:v5e:2x2``; a clear error for anything else."""
    text = str(value)
    head, _, topology = text.partition(":")
    generation = topology.split(":", 1)[0]
    if head != "tpu" or generation not in CHIPS or ":" not in topology:
        known = ", ".join(f"tpu:{g}:2x2" for g in CHIPS)
        raise ConfigError(
            f"device={text}: lra-plan compiles for device=tpu:<generation>:<topology> "
            f"(e.g. {known}; v4 topologies have three axes, tpu:v4:2x2x1); leave device out to "
            "measure on this machine"
        )
    return generation, topology


def _chip_count(topology: str) -> int:
    dims = topology.split(":", 1)[1].split("x")
    try:
        return math.prod(int(d) for d in dims)
    except ValueError:
        raise ConfigError(
            f"device=tpu:{topology}: the topology is chips per axis, e.g. 2x2"
        ) from None


def tpu_devices(topology: str) -> list:
    """The devices of ``topology`` (e.g. ``v5e:2x2``) to compile for, from libtpu."""
    generation = topology.split(":", 1)[0]
    chips = _chip_count(topology)
    os.environ.setdefault(
        "TPU_ACCELERATOR_TYPE", _ACCELERATOR_TYPE[generation].format(chips=chips, cores=2 * chips)
    )
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    try:
        import libtpu  # noqa: F401 - present only with the extra
    except ImportError:
        raise ConfigError(
            "device=tpu:... needs XLA's TPU compiler: pip install 'lra-harness[tpu-aot]' "
            "(libtpu; it never changes a CPU or GPU run)"
        ) from None
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices)
    except Exception as err:  # libtpu's own error types
        raise ConfigError(
            f"device=tpu:{topology}: libtpu knows no such topology ({str(err).splitlines()[0]})"
        ) from None


def _cost(compiled, grad_accum: int) -> tuple[float | None, float | None, float | None]:
    """``(FLOPs, bytes accessed, XLA's optimal seconds)`` per device of one step (the
    micro-batch loop's body, which XLA counts once, scaled by ``grad_accum``)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - a backend without a cost model
        return None, None, None
    cost = cost[0] if isinstance(cost, list) else cost
    values = [cost.get(k) for k in ("flops", "bytes accessed", "optimal_seconds")]
    return tuple(None if v is None else float(v) * grad_accum for v in values)


def roofline_seconds(flops, bytes_accessed, chip: dict, cores_per_chip: int) -> float | None:
    """One device's step time by the roofline: the slower of compute and HBM traffic."""
    if not flops and not bytes_accessed:
        return None
    peak = chip["peak_bf16_flops_per_sec"] / cores_per_chip
    bandwidth = chip["hbm_bytes_per_sec"] / cores_per_chip
    return max((flops or 0.0) / peak, (bytes_accessed or 0.0) / bandwidth)


def measure_stage(config: dict, options: dict) -> dict:
    """Compile one stage's config for ``options["device"]`` (``tpu:<topology>``): per-device
    memory, fit and advice, and roofline estimates of the train and eval steps/sec.

    The keys match :func:`lra.plan.measure.measure_stage`'s where they mean the same
    (``fits``, ``advice``, ``compiled_memory_bytes``, ``train_steps_per_sec``, ...);
    ``estimate`` says the speeds are a roofline, not a measurement.
    """
    from lra.device import measure
    from lra.models.platform import compiling_for
    from lra.train import parallel
    from lra.train.compile import abstract_batch
    from lra.train.fields import compiled_fields
    from lra.train.memory import compile_or_explain, preflight
    from lra.train.preflight import OutOfMemory

    generation, topology_name = parse_device(options["device"])
    chip = CHIPS[generation]
    devices = tpu_devices(topology_name)
    cores_per_chip = len(devices) // len({tuple(d.coords) for d in devices})
    per_device_hbm = chip["hbm_bytes"] // cores_per_chip
    cfg = OmegaConf.create(config)
    cfg.trainer.memory_limit_gb = per_device_hbm / 1e9  # what the pre-flight judges against
    trainer = cfg.trainer
    batch_size, grad_accum = int(trainer.batch_size), int(trainer.grad_accum)
    topology = parallel.make_topology(trainer.mesh, batch_size, grad_accum, devices=devices)
    out = {
        "device": devices[0].device_kind,
        "platform": "tpu",
        "device_count": len(devices),
        "topology": topology_name,
        "num_devices": topology.num_devices,
        "per_device_batch_size": topology.per_device_batch,
        "batch_size": batch_size,
        "length": int(cfg.task.max_length),
        "device_memory_bytes": per_device_hbm,
        "device_memory_source": f"{chip['device_kind']} HBM per device ({chip['source']})",
        "estimate": "roofline",
    }
    example = abstract_batch(cfg.task, batch_size, topology.batch_sharding)
    with compiling_for("tpu"):
        try:
            compiled = compile_or_explain(cfg, example, topology)
        except OutOfMemory as err:
            return {**out, "fits": False, "advice": str(err)}
        out.update(compiled_fields(compiled, {"dir": None}))
        out["eval_compiled_memory_bytes"] = measure.compiled_memory_bytes(compiled.eval_step)
        try:
            preflight(cfg, compiled, topology)
            out.update(fits=True, advice=None)
        except OutOfMemory as err:
            out.update(fits=False, advice=str(err))
    steps = {"train": (compiled.train_step, grad_accum), "eval": (compiled.eval_step, 1)}
    for kind, (step, accum) in steps.items():
        flops, traffic, optimal = _cost(step, accum)
        seconds = roofline_seconds(flops, traffic, chip, cores_per_chip)
        out[f"{kind}_flops_per_device"] = flops
        out[f"{kind}_bytes_accessed_per_device"] = traffic
        out[f"{kind}_xla_optimal_seconds"] = optimal
        out[f"{kind}_roofline_seconds"] = seconds
        out[f"{kind}_steps_per_sec"] = None if not seconds else 1.0 / seconds
    out["checkpoint_seconds"] = 0.0  # not estimated: a TPU host's disk is unknown here
    return out
