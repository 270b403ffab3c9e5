"""Hardware topologies: devices, full-duplex links and memory tiers, loaded from YAML."""

from conduit.topology.library import DEFAULT_TOPOLOGY, library_names, resolve
from conduit.topology.loader import load_topology, topology_from_dict
from conduit.topology.model import Device, Link, MemoryTier, TierKind, Topology

__all__ = [
    "DEFAULT_TOPOLOGY",
    "Device",
    "Link",
    "MemoryTier",
    "TierKind",
    "Topology",
    "library_names",
    "load_topology",
    "resolve",
    "topology_from_dict",
]
