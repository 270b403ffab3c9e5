"""The runtime's tiers on this machine: which memory exists, how much of it the plane takes.

The plane runs on one node of a topology: a topology file (a library name, a YAML path, or what
``conduit calibrate`` wrote) or, by default, :func:`local_topology`, a probe of this machine (cores,
RAM, disk, CUDA devices) with conservative bandwidth priors that live measurements then replace.
Every memory tier of the node becomes a :class:`~conduit.runtime.tiers.RuntimeTier` with the same
id the simulator uses, backed by real memory of the matching medium:

* ``gpuN:hbm`` -> CUDA memory (only where CUDA is, on the learner's device);
* ``dramN:pinned`` -> one pinned staging ring (only where CUDA is: elsewhere the tier is left out and
  :attr:`MachineTiers.unavailable` says why);
* ``dramN:pageable`` -> process memory; ``dramN:shm`` -> a shared-memory segment, when asked for;
* ``nvmeN:nvme`` -> a memmap spill file.

``capacities`` says how many bytes the plane takes per tier (by tier id or by kind:
``{"pageable": "2 GiB", "nvme0:nvme": 8e9}``); never more than the topology says the tier has. The
tiers the plane can run without -- the pinned staging ring and the NVMe spill file -- are left out
with a capacity of 0 (``{"pinned": 0}``: page-lock nothing on a host whose GPUs other processes need;
``{"nvme": 0}``: never spill, push back instead); the tier is then listed in
:attr:`MachineTiers.unavailable` with that reason. A learner's own tier (host memory, a CUDA device's
HBM) cannot be left out: 0 for it is refused.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conduit.errors import CapacityError, ConduitError, UnknownNameError
from conduit.runtime.media import (
    CudaMedium,
    HostMedium,
    MediumUnavailable,
    MemmapMedium,
    PinnedMedium,
    SharedMedium,
    cuda_available,
    pinned_available,
)
from conduit.runtime.schema import Schema
from conduit.runtime.tiers import RuntimeTier
from conduit.topology.model import TierKind, Topology
from conduit.units import Kind, parse_quantity

DEFAULT_CAPACITY = {"hbm": 1 << 30, "pinned": 256 << 20, "pageable": 1 << 30, "shm": 256 << 20, "nvme": 4 << 30}
"""Bytes the plane allocates per tier unless told otherwise (capped by the topology)."""

OPTIONAL_KINDS = ("pinned", "nvme")
"""Tier kinds the plane can run without: a capacity of 0 leaves such a tier out."""

LEFT_OUT = "left out: capacities gives it 0 bytes"


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def local_topology(spill_dir: str | os.PathLike | None = None) -> Topology:
    """A topology of this machine from what the OS and CUDA report, with bandwidth priors.

    The priors (10 GB/s memcpy, 2 GB/s disk, 25 GB/s PCIe) only seed the estimator; the first
    copies replace them. ``conduit calibrate`` measures them properly.
    """
    from conduit.topology import load_topology

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    disk = shutil.disk_usage(spill_dir or "/tmp").total
    devices: list[dict[str, Any]] = [
        {"id": "cpu0", "kind": "cpu", "cores": cores},
        {"id": "dram0", "kind": "memory", "capacity": _meminfo_total(), "bandwidth": 10e9,
         "pageable_copy_bandwidth": 10e9},
        {"id": "nvme0", "kind": "nvme", "capacity": disk, "read_bandwidth": 2e9, "write_bandwidth": 1.5e9},
    ]
    links: list[dict[str, Any]] = [
        {"src": "cpu0", "dst": "dram0", "bandwidth": 10e9, "latency": 1e-7},
        {"src": "cpu0", "dst": "nvme0", "bandwidth": 2e9, "latency": 80e-6},
    ]
    if cuda_available():
        import torch

        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append({"id": f"gpu{i}", "kind": "gpu", "memory": props.total_memory,
                            "memory_bandwidth": 1e12, "model": props.name})
            links.append({"src": f"gpu{i}", "dst": "cpu0", "bandwidth": 25e9, "latency": 2e-6})
    return load_topology({"name": f"local-{socket.gethostname()}", "devices": devices, "links": links})


def resolve_topology(spec: Topology | str | os.PathLike | Mapping | None) -> Topology:
    if spec is None:
        return local_topology()
    if isinstance(spec, Topology):
        return spec
    from conduit.topology import load_topology

    return load_topology(spec)


@dataclass
class MachineTiers:
    """The tiers the plane runs on, and the ones it could not have (with the reason)."""

    node: str
    tiers: dict[str, RuntimeTier]
    learner_tier: dict[str, str]  # learner device -> the tier a delivered batch lives in
    unavailable: dict[str, str] = field(default_factory=dict)

    def close(self) -> None:
        for t in self.tiers.values():
            t.close()


def parse_capacity(key: str, value: Any) -> int:
    """One ``capacities`` entry in bytes, checked: > 0, or exactly 0 for a tier kind the plane can run
    without (``OPTIONAL_KINDS``; ``key`` is a kind or a tier id such as ``"nvme0:nvme"``)."""
    try:
        nbytes = int(parse_quantity(value, Kind.BYTES))
    except ConduitError as exc:
        raise ConduitError(f"capacities[{key!r}]: {exc}") from None
    optional = key.rsplit(":", 1)[-1] in OPTIONAL_KINDS
    if nbytes < 0 or (nbytes == 0 and not optional):
        what = "must be >= 0 bytes (0 leaves the tier out)" if optional else "must be > 0 bytes"
        raise ConduitError(f"capacities[{key!r}]: {what}, got {value!r}")
    return nbytes


def _capacity_for(tier_id: str, kind: str, capacities: Mapping[str, Any], available: float) -> int:
    """Bytes the plane takes for one tier, never more than it has; 0 means the tier is left out."""
    key = tier_id if tier_id in capacities else kind
    if key not in capacities:
        value = DEFAULT_CAPACITY[kind]
    elif (value := parse_capacity(key, capacities[key])) == 0:
        return 0
    return int(min(value, available)) if available else value


def build_tiers(
    topology: Topology,
    schema: Schema,
    *,
    node: str | None = None,
    learner_devices: tuple[str, ...] = ("cpu",),
    capacities: Mapping[str, Any] | None = None,
    spill_dir: str | os.PathLike | None = None,
    shared: bool = False,
    durable_dir: str | os.PathLike | None = None,
) -> MachineTiers:
    """Allocate the node's tiers. ``learner_devices`` are ``"cpu"`` or ``"cuda:N"`` strings.

    With ``durable_dir``, each NVMe tier's spill file is ``<durable_dir>/<tier id>.spill`` and is
    mapped again as it is when it exists (a restarted plane; see :mod:`conduit.plane.recovery`)."""
    capacities = dict(capacities or {})
    node = node or (topology.nodes[0] if topology.nodes else "node0")
    if node not in topology.nodes:
        raise UnknownNameError("node", node, topology.nodes)
    local = [t for t in topology.tiers if t.node == node]
    known = {t.id for t in local} | {k.value for k in TierKind} | {"shm"}
    # the node's host memory (a CPU learner's tier): its first memory device in natural id order,
    # the one the simulator's layout gives the node's learners, whatever order the file lists them in
    memory = next((t for m in topology.devices_of("memory", node) for t in local
                   if t.device == m.id and t.kind is TierKind.PAGEABLE), None)
    if memory is None:
        raise ConduitError(f"topology {topology.name!r}: node {node!r} has no host memory device")
    if shared:
        known.add(f"{memory.device}:shm")
    for key in capacities:
        if key not in known:
            raise UnknownNameError("tier", key, sorted(known))
        parse_capacity(key, capacities[key])  # every entry checked, also one for a tier not built here

    tiers: dict[str, RuntimeTier] = {}
    unavailable: dict[str, str] = {}
    cuda_devices = [d for d in learner_devices if d.startswith("cuda")]
    gpus = [t for t in local if t.kind is TierKind.HBM]
    try:
        for t in local:
            kind = t.kind.value
            if t.kind is TierKind.HBM:
                idx = gpus.index(t)
                wanted = f"cuda:{idx}"
                if wanted not in cuda_devices:
                    continue
                if not cuda_available():
                    unavailable[t.id] = "no CUDA device"
                    continue
                medium = CudaMedium(_capacity_for(t.id, kind, capacities, t.capacity), wanted)
            elif t.kind is TierKind.PINNED:
                ok, why = pinned_available()
                if not ok:
                    unavailable[t.id] = why
                    continue
                if (capacity := _capacity_for(t.id, kind, capacities, t.capacity)) == 0:
                    unavailable[t.id] = LEFT_OUT
                    continue
                medium = PinnedMedium(capacity)
            elif t.kind is TierKind.PAGEABLE:
                medium = HostMedium(_capacity_for(t.id, kind, capacities, t.capacity))
            else:
                if (capacity := _capacity_for(t.id, kind, capacities, t.capacity)) == 0:
                    unavailable[t.id] = LEFT_OUT
                    continue
                path = Path(durable_dir) / f"{t.id.replace(':', '.')}.spill" if durable_dir is not None else None
                medium = MemmapMedium(capacity, spill_dir, path=path)
            tiers[t.id] = RuntimeTier(t.id, t.kind, node, t.device, medium, schema,
                                      t.read_bandwidth, t.write_bandwidth)
        if shared:
            sid = f"{memory.device}:shm"
            medium = SharedMedium(_capacity_for(sid, "shm", capacities, memory.capacity))
            tiers[sid] = RuntimeTier(sid, TierKind.PAGEABLE, node, memory.device, medium, schema,
                                     memory.read_bandwidth, memory.write_bandwidth)
    except (MediumUnavailable, CapacityError, MemoryError, OSError) as exc:
        for t in tiers.values():
            t.close()
        if isinstance(exc, ConduitError):
            raise
        raise CapacityError(f"cannot allocate the plane's tiers on {node!r}: {exc}") from exc

    learner_tier = {}
    for dev in learner_devices:
        if dev.startswith("cuda"):
            idx = int(dev.split(":")[1]) if ":" in dev else 0
            if idx >= len(gpus) or gpus[idx].id not in tiers:
                for t in tiers.values():
                    t.close()
                raise ConduitError(f"learner device {dev!r}: no CUDA tier for it on node {node!r} "
                                   f"({unavailable.get(gpus[idx].id, 'not in the topology') if idx < len(gpus) else 'not in the topology'})")
            learner_tier[dev] = gpus[idx].id
        elif dev == "cpu":
            learner_tier[dev] = memory.id
        else:
            for t in tiers.values():
                t.close()
            raise ConduitError(f"learner device {dev!r}: expected 'cpu' or 'cuda:N'")
    return MachineTiers(node, tiers, learner_tier, unavailable)
