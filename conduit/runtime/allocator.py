"""First-fit extent allocator over one preallocated buffer.

Every runtime tier is one buffer allocated (or mapped, or pinned) once when the plane starts; chunks
and batches get **extents** of it, byte ranges aligned to :data:`~conduit.runtime.schema.ALIGN`. So
ingesting a chunk never calls ``malloc``/``cudaMalloc``/``cudaHostAlloc``: it takes a free range
and, when done, gives it back, where it merges with free neighbours.

The free list is kept sorted by offset; allocation is first fit (O(free ranges)), freeing is a
binary search plus at most two merges. Runtime tiers hold tens to thousands of extents, so this is
never the bottleneck next to the copies themselves; ``largest_free`` lets the plane tell "full"
from "fragmented" when it refuses a chunk.
"""

from __future__ import annotations

import bisect

from conduit.errors import CapacityError
from conduit.runtime.schema import ALIGN, align_up


class ExtentAllocator:
    """Hands out aligned byte ranges of ``[0, capacity)``; :attr:`used` counts allocated bytes."""

    def __init__(self, capacity: int, alignment: int = ALIGN):
        if capacity <= 0:
            raise CapacityError(f"an allocator needs a positive capacity, got {capacity}")
        self.capacity = int(capacity) // alignment * alignment
        self.alignment = alignment
        self._starts: list[int] = [0]
        self._sizes: list[int] = [self.capacity]
        self._live: dict[int, int] = {}
        self.used = 0

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a free extent of at least ``nbytes`` (rounded up to the alignment), or None."""
        size = align_up(max(int(nbytes), 1), self.alignment)
        for i, free in enumerate(self._sizes):
            if free >= size:
                start = self._starts[i]
                if free == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] = start + size
                    self._sizes[i] = free - size
                self._live[start] = size
                self.used += size
                return start
        return None

    def free(self, offset: int) -> int:
        """Give an extent back; returns its size. Freeing twice, or an unknown offset, is an error."""
        size = self._live.pop(offset, None)
        if size is None:
            raise CapacityError(f"no live extent at offset {offset}")
        self.used -= size
        i = bisect.bisect_left(self._starts, offset)
        merge_prev = i > 0 and self._starts[i - 1] + self._sizes[i - 1] == offset
        merge_next = i < len(self._starts) and offset + size == self._starts[i]
        if merge_prev and merge_next:
            self._sizes[i - 1] += size + self._sizes[i]
            del self._starts[i], self._sizes[i]
        elif merge_prev:
            self._sizes[i - 1] += size
        elif merge_next:
            self._starts[i] = offset
            self._sizes[i] += size
        else:
            self._starts.insert(i, offset)
            self._sizes.insert(i, size)
        return size

    def claim(self, offset: int, nbytes: int) -> int:
        """Allocate exactly ``[offset, offset + size)`` (``size`` = ``nbytes`` rounded up to the
        alignment), which must be free: how a restarted plane takes over the extents its durable
        tier's index lists. Returns the size."""
        size = align_up(max(int(nbytes), 1), self.alignment)
        i = bisect.bisect_right(self._starts, offset) - 1
        if offset % self.alignment or i < 0 or self._starts[i] + self._sizes[i] < offset + size:
            raise CapacityError(f"extent [{offset}, {offset + size}) is not free")
        start, free = self._starts[i], self._sizes[i]
        del self._starts[i], self._sizes[i]
        if offset + size < start + free:
            self._starts.insert(i, offset + size)
            self._sizes.insert(i, start + free - offset - size)
        if offset > start:
            self._starts.insert(i, start)
            self._sizes.insert(i, offset - start)
        self._live[offset] = size
        self.used += size
        return size

    def size_of(self, offset: int) -> int:
        return self._live[offset]

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    @property
    def live_extents(self) -> int:
        return len(self._live)

    def fits(self, nbytes: int) -> bool:
        return self.largest_free >= align_up(max(int(nbytes), 1), self.alignment)
