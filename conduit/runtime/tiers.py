"""Runtime memory tiers: a medium (real memory), an extent allocator, and capacity accounting.

A :class:`RuntimeTier` is what placement decisions name. Its ``id``, ``kind``, ``node`` and
``device`` follow the topology model (``dram0:pageable``, ``gpu0:hbm``...), so a policy that was
tuned in the simulator on a topology of this machine sees the same tier names here. ``capacity``
is what the runtime really allocated (not the machine's total RAM), and ``used`` is the sum of live
extents: exactly what :class:`~conduit.runtime.view.RuntimeClusterView` reports, so the policy and
the auditor see the same numbers as the allocator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from conduit.runtime.allocator import ExtentAllocator
from conduit.runtime.media import Medium
from conduit.runtime.schema import Schema
from conduit.topology.model import TierKind


@dataclass
class Extent:
    """A chunk's (or a batch's) bytes in one tier: ``steps`` samples laid out by the schema."""

    tier: RuntimeTier
    offset: int
    steps: int
    nbytes: int  # extent size as allocated (what capacity accounting counts)

    def columns(self) -> dict[str, Any]:
        return self.tier.medium.columns(self.tier.schema, self.offset, self.steps)

    def free(self) -> None:
        self.tier.release(self)


@dataclass(eq=False)
class RuntimeTier:
    """A place experience can live, with real memory behind it."""

    id: str
    kind: TierKind
    node: str
    device: str
    medium: Medium
    schema: Schema
    read_bandwidth: float
    write_bandwidth: float
    allocator: ExtentAllocator = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.allocator = ExtentAllocator(self.medium.capacity)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def used(self) -> int:
        return self.allocator.used

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    def fits(self, steps: int) -> bool:
        return self.allocator.fits(self.schema.extent_bytes(steps))

    def allocate(self, steps: int) -> Extent | None:
        """An extent for ``steps`` samples, or None when no free range is large enough."""
        nbytes = self.schema.extent_bytes(steps)
        with self.lock:
            offset = self.allocator.allocate(nbytes)
            if offset is None:
                return None
            return Extent(self, offset, steps, self.allocator.size_of(offset))

    def claim(self, offset: int, steps: int) -> Extent:
        """The extent of ``steps`` samples at ``offset`` (which must be free): a restarted plane
        taking over a chunk its durable tier still holds."""
        with self.lock:
            size = self.allocator.claim(offset, self.schema.extent_bytes(steps))
            return Extent(self, offset, steps, size)

    def release(self, extent: Extent) -> None:
        with self.lock:
            self.allocator.free(extent.offset)

    def close(self) -> None:
        self.medium.close()

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind.value, "medium": self.medium.name, "node": self.node,
            "device": self.device, "capacity": self.capacity, "used": self.used,
            "extents": self.allocator.live_extents,
        }
