"""Data parallelism over every device, on one host or many, with ``jax.sharding``.

One mesh covers the devices a run uses, with a single ``data`` axis
(``trainer.mesh``; the default ``{data: -1}`` takes every device of every
process). Batches are split along ``data`` with a :class:`NamedSharding`;
parameters and optimizer state are replicated, so a step computes the gradient
of the whole global batch on every device, and ``trainer.batch_size`` is the
global batch whatever the device count.

Many hosts: :func:`initialize_distributed` starts JAX's distributed runtime
(``jax.distributed.initialize``) when the run was launched on a cluster (SLURM
with several tasks, a multi-host TPU slice) or when ``distributed.*`` names a
coordinator. Each process then reads only its own rows of every global batch
(the pipeline's ``shard_index``/``shard_count``) and :meth:`Topology.put` makes
global arrays from them with ``jax.make_array_from_process_local_data``.
"""

import logging
import os
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra.config.schema import check_value
from lra.errors import ConfigError

DATA_AXIS = "data"
log = logging.getLogger("lra.train.parallel")


def _cluster_detected() -> str | None:
    """The cluster environment a multi-process launch comes from, or None."""
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in os.environ:
        return "SLURM"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if len([h for h in hosts.split(",") if h]) > 1:
        return "TPU slice"
    return None


def initialize_distributed(dist_cfg) -> bool:
    """Start ``jax.distributed`` if asked or on a detected cluster; True if it runs.

    Call before anything touches a JAX backend. ``dist_cfg`` is the ``distributed``
    config: ``enabled`` (``auto`` | true | false), ``coordinator_address``,
    ``num_processes``, ``process_id``, ``local_device_ids``, ``cpu_collectives``.
    """
    if dist_cfg is None:
        return False
    check_value("distributed", dist_cfg)  # allowed values; a coordinator needs both ids
    enabled = dist_cfg.enabled
    explicit = dist_cfg.coordinator_address is not None
    detected = _cluster_detected()
    if enabled is False or (enabled == "auto" and not explicit and detected is None):
        return False
    if jax.distributed.is_initialized():
        return True
    # CPU processes need a collectives backend to talk to each other (no effect on GPU/TPU).
    jax.config.update("jax_cpu_collectives_implementation", dist_cfg.cpu_collectives)
    kwargs = {}
    if explicit:
        kwargs = {
            "coordinator_address": str(dist_cfg.coordinator_address),
            "num_processes": int(dist_cfg.num_processes),
            "process_id": int(dist_cfg.process_id),
        }
    if dist_cfg.local_device_ids is not None:
        kwargs["local_device_ids"] = list(dist_cfg.local_device_ids)
    try:
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as err:
        where = kwargs.get("coordinator_address") or detected or "the cluster environment"
        raise ConfigError(
            f"cannot start jax.distributed with {where}: {str(err).splitlines()[0]}; check "
            "distributed.coordinator_address (host:port reachable from every process), "
            "distributed.num_processes and distributed.process_id"
        ) from err
    log.info(
        f"jax.distributed: process {jax.process_index()} of {jax.process_count()} "
        f"({detected or 'explicit coordinator'}), {jax.device_count()} devices in all"
    )
    return True


@dataclass(frozen=True)
class Topology:
    """The mesh a run uses and how its global batch splits over it."""

    mesh: Mesh
    global_batch: int
    # A mesh of devices this host cannot run on (a TPU topology compiled for from a CPU host,
    # lra.plan.tpu): arrays are placed as shapes only, for ahead-of-time compilation.
    deviceless: bool = False

    @property
    def num_devices(self) -> int:
        return int(self.mesh.devices.size)

    @property
    def num_processes(self) -> int:
        return jax.process_count()

    @property
    def process_index(self) -> int:
        return jax.process_index()

    @property
    def is_main(self) -> bool:
        """Whether this process writes records, logs and the lock (process 0)."""
        return self.process_index == 0

    @property
    def per_device_batch(self) -> int:
        return self.global_batch // self.num_devices

    @property
    def per_process_batch(self) -> int:
        return self.global_batch // self.num_processes

    @property
    def batch_sharding(self) -> NamedSharding:
        """Leading (batch) axis split over ``data``, the rest whole."""
        return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def shard_args(self) -> dict:
        """``shard_index``/``shard_count`` for this process's rows of every batch."""
        return {"shard_index": self.process_index, "shard_count": self.num_processes}

    def put(self, local_batch):
        """A global batch (sharded over ``data``) from this process's rows of it."""
        sharding = self.batch_sharding

        def to_global(x):
            x = np.asarray(x)
            shape = (x.shape[0] * self.num_processes, *x.shape[1:])
            return jax.make_array_from_process_local_data(sharding, x, shape)

        return jax.tree.map(to_global, local_batch)

    def replicate(self, tree):
        """``tree`` placed whole on every device of the mesh (a deviceless mesh: its shapes and
        dtypes, with the replicated sharding)."""
        if self.deviceless:
            return jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated), tree
            )
        if self.num_processes == 1:
            return jax.device_put(tree, self.replicated)

        def to_global(x):
            if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
                data = to_global(jax.random.key_data(x))
                return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
            return jax.make_array_from_process_local_data(self.replicated, np.asarray(x))

        return jax.tree.map(to_global, tree)

    def gather(self, tree):
        """``tree``'s arrays (global, sharded over the mesh) whole as NumPy arrays on every
        process."""
        if self.num_processes == 1:
            return jax.tree.map(np.asarray, jax.device_get(tree))
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))

    def any_process(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over all processes (so every process takes the same branch)."""
        if self.num_processes == 1:
            return tuple(bool(f) for f in flags)
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.asarray(flags, np.int32))
        return tuple(bool(v) for v in np.asarray(gathered).reshape(-1, len(flags)).any(axis=0))

    def barrier(self, name: str) -> None:
        """Wait until every process reaches this point (no-op on one process)."""
        if self.num_processes > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    def describe(self) -> dict:
        """The record fields that say how the run was spread over devices."""
        return {
            "num_devices": self.num_devices,
            "num_processes": self.num_processes,
            "mesh_shape": {name: int(n) for name, n in self.mesh.shape.items()},
            "global_batch_size": self.global_batch,
            "per_device_batch_size": self.per_device_batch,
        }


def _mesh_size(mesh_cfg, available: int) -> int:
    mesh = dict(mesh_cfg or {DATA_AXIS: -1})
    unknown = sorted(set(mesh) - {DATA_AXIS})
    if unknown:
        raise ConfigError(
            f"trainer.mesh has unknown axes {unknown}; only data parallelism is supported: "
            f"trainer.mesh={{{DATA_AXIS}: -1}} (every device) or {{{DATA_AXIS}: N}}"
        )
    size = int(mesh.get(DATA_AXIS, -1))
    if size == -1:
        return available
    if not 1 <= size <= available:
        raise ConfigError(
            f"trainer.mesh.{DATA_AXIS}={size}, but {available} devices are visible; "
            f"use a size from 1 to {available}, or -1 for all of them"
        )
    if jax.process_count() > 1 and size != available:
        raise ConfigError(
            f"trainer.mesh.{DATA_AXIS}={size} with {jax.process_count()} processes: a "
            f"multi-process run uses every device; set trainer.mesh.{DATA_AXIS}=-1"
        )
    return size


def make_topology(mesh_cfg, global_batch: int, grad_accum: int = 1, devices=None) -> Topology:
    """The data-parallel mesh of ``trainer.mesh`` for a global batch of ``global_batch``.

    The batch must split evenly over the devices, and each device's share over
    ``grad_accum`` micro-batches. ``devices``: a deviceless topology's (compiled for, never
    run on; :attr:`Topology.deviceless`) instead of this host's.
    """
    available = jax.device_count() if devices is None else len(devices)
    size = _mesh_size(mesh_cfg, available)
    global_batch, grad_accum = int(global_batch), int(grad_accum)
    unit = size * grad_accum
    if global_batch % unit:
        lower = max(unit, global_batch - global_batch % unit)
        parts = (
            f"the {size} devices"
            if grad_accum == 1
            else (f"{size} devices x trainer.grad_accum={grad_accum} micro-batches")
        )
        raise ConfigError(
            f"trainer.batch_size={global_batch} does not split evenly over {parts}; use a "
            f"multiple of {unit} (e.g. {lower} or {lower + unit})"
        )
    if devices is not None:
        return Topology(Mesh(np.asarray(devices[:size]), (DATA_AXIS,)), global_batch, True)
    return Topology(Mesh(np.asarray(jax.devices()[:size]), (DATA_AXIS,)), global_batch)
