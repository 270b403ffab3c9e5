"""The memory behind each runtime tier, allocated once.

A **medium** is one preallocated buffer of a given kind, with zero-copy column views over extents of
it (:meth:`Medium.columns`):

==========  =====================================================  ============  ===============
medium      what it is                                             tier kind     views
==========  =====================================================  ============  ===============
``cuda``    one ``torch.empty`` on a CUDA device                   ``hbm``       torch tensors
``pinned``  one page-locked host buffer (``pin_memory``), the      ``pinned``    numpy arrays
            staging ring that host<->device DMA copies read from
``host``    ordinary (pageable) process memory                     ``pageable``  numpy arrays
``shm``     a ``multiprocessing.shared_memory`` segment, readable  ``pageable``  numpy arrays
            by every process on the node by name
``memmap``  a file on local disk mapped with ``numpy.memmap``      ``nvme``      numpy arrays
            (spill)
==========  =====================================================  ============  ===============

Pinned memory exists only where CUDA does: page-locking host memory is a CUDA driver call, and
without a GPU there is nothing to DMA into. :func:`pinned_available` says so and
:class:`PinnedMedium` refuses to start, with the reason, rather than fake it with pageable memory.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from conduit._extras import install_hint, installed, require
from conduit.errors import CapacityError, ConduitError
from conduit.runtime.schema import Schema


class MediumUnavailable(ConduitError):
    """A medium this machine cannot provide (pinned or CUDA memory without CUDA)."""


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except (ImportError, RuntimeError):  # torch is optional: conduit-rl[runtime]
        return False


def pinned_available() -> tuple[bool, str]:
    """Whether page-locked host memory can be had here, and why not."""
    if not installed("torch"):
        return False, f"torch is not installed: pinned (page-locked) host memory needs it ({install_hint('runtime')})"
    if not cuda_available():
        return False, "no CUDA device: pinned (page-locked) host memory needs the CUDA driver"
    return True, ""


def torch_dtype(dtype: np.dtype) -> Any:
    torch = require("torch", "a tensor tier (CUDA or pinned memory)")

    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class Medium(ABC):
    """One preallocated buffer; subclasses say what memory it is."""

    name: str = "abstract"
    #: views are torch tensors on a device (not numpy arrays in host memory)
    device_side: bool = False

    def __init__(self, capacity: int):
        self.capacity = int(capacity)

    @abstractmethod
    def columns(self, schema: Schema, offset: int, steps: int) -> dict[str, Any]:
        """Zero-copy views of a columnar extent at ``offset`` holding ``steps`` samples."""

    def close(self) -> None:
        """Release the memory (idempotent)."""


class HostMedium(Medium):
    """Pageable process memory: a numpy buffer the kernel backs on first touch."""

    name = "host"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.buffer: np.ndarray = np.empty(self.capacity, dtype=np.uint8)

    def columns(self, schema: Schema, offset: int, steps: int) -> dict[str, np.ndarray]:
        return schema.views(self.buffer[offset:], steps)

    def close(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)


class SharedMedium(HostMedium):
    """A shared-memory segment: other processes on the node attach by :attr:`segment_name`."""

    name = "shm"

    def __init__(self, capacity: int):
        from multiprocessing import shared_memory

        Medium.__init__(self, capacity)
        try:
            self._shm = shared_memory.SharedMemory(create=True, size=self.capacity)
        except OSError as exc:
            raise CapacityError(f"cannot create {capacity} bytes of shared memory: {exc}") from exc
        self.segment_name = self._shm.name
        self.buffer = np.ndarray((self.capacity,), dtype=np.uint8, buffer=self._shm.buf)

    def close(self) -> None:
        if self._shm is None:
            return
        self.buffer = np.empty(0, dtype=np.uint8)
        shm, self._shm = self._shm, None
        try:
            shm.close()
        except BufferError:  # a view is still exported somewhere; unlinking still frees the name
            pass
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


class MemmapMedium(HostMedium):
    """A spill file on local disk, mapped into memory; the file is removed on close.

    With ``path`` the file has that fixed name and is **durable**: an existing file of the same size
    is mapped again as it is (its bytes are those a previous, dead process of the plane left there;
    see :mod:`conduit.plane.recovery`), and ``close(keep=True)`` leaves it in place.
    """

    name = "memmap"

    def __init__(self, capacity: int, directory: str | os.PathLike | None = None,
                 path: str | os.PathLike | None = None):
        Medium.__init__(self, capacity)
        self.reopened = False
        if path is not None:
            self.path = Path(path)
            if not self.path.parent.is_dir():
                raise ConduitError(f"spill directory {self.path.parent} does not exist")
            self.reopened = self.path.exists() and self.path.stat().st_size == self.capacity
            mode = "r+" if self.reopened else "w+"
        else:
            directory = Path(directory) if directory is not None else Path(tempfile.gettempdir())
            if not directory.is_dir():
                raise ConduitError(f"spill directory {directory} does not exist")
            fd, name = tempfile.mkstemp(prefix="conduit-spill-", suffix=".bin", dir=directory)
            os.close(fd)
            self.path = Path(name)
            mode = "w+"
        self.buffer = np.memmap(self.path, dtype=np.uint8, mode=mode, shape=(self.capacity,))

    def close(self) -> None:
        buf = self.buffer
        self.buffer = np.empty(0, dtype=np.uint8)
        if isinstance(buf, np.memmap):
            del buf
        self.path.unlink(missing_ok=True)


class PinnedMedium(HostMedium):
    """Page-locked host memory, pinned once (the staging ring); numpy views over it."""

    name = "pinned"

    def __init__(self, capacity: int):
        ok, why = pinned_available()
        if not ok:
            raise MediumUnavailable(f"pinned memory unavailable: {why}")
        import torch

        Medium.__init__(self, capacity)
        self.tensor = torch.empty(self.capacity, dtype=torch.uint8, pin_memory=True)
        self.buffer = self.tensor.numpy()

    def close(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)
        self.tensor = None


class CudaMedium(Medium):
    """Device memory on one CUDA device: one allocation, torch tensor views."""

    name = "cuda"
    device_side = True

    def __init__(self, capacity: int, device: str = "cuda:0"):
        if not installed("torch"):
            raise MediumUnavailable(f"CUDA memory unavailable: torch is not installed ({install_hint('runtime')})")
        if not cuda_available():
            raise MediumUnavailable("CUDA memory unavailable: no CUDA device")
        import torch

        super().__init__(capacity)
        self.device = torch.device(device)
        self.tensor = torch.empty(self.capacity, dtype=torch.uint8, device=self.device)

    def columns(self, schema: Schema, offset: int, steps: int) -> dict[str, Any]:
        offsets, _ = schema.layout(steps)
        out = {}
        for c, off in zip(schema.columns, offsets, strict=True):
            n = steps * c.step_bytes
            start = offset + off
            out[c.name] = self.tensor[start : start + n].view(torch_dtype(c.dtype)).view((steps, *c.shape))
        return out

    def close(self) -> None:
        self.tensor = None


MEDIA = {"host": HostMedium, "shm": SharedMedium, "memmap": MemmapMedium, "pinned": PinnedMedium, "cuda": CudaMedium}
