"""Stand-in for the part of ``torch`` the allocator helper reads (torch is gigabytes; it is not
installed here): ``torch.cuda``'s ``is_available``, ``is_initialized``, ``device_count``,
``memory_reserved``, ``memory_allocated``, ``max_memory_reserved``, ``memory_stats`` (the keys
``num_alloc_retries`` and ``num_ooms`` as PyTorch names them) and ``get_device_properties(i).uuid``.

Behind them a toy caching allocator with PyTorch's observable behaviour: memory is reserved from
the device in segments and kept after tensors are freed (reserved stays, allocated drops); a
request no cached segment fits and the device cannot reserve frees the cached segments and retries
(``num_alloc_retries``), and raises ``OutOfMemoryError`` when it still does not fit (``num_ooms``).
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass, field
from typing import Any


class OutOfMemoryError(RuntimeError):
    pass


@dataclass
class _Device:
    capacity: int
    uuid: uuid_module.UUID
    segments: list[list[int]] = field(default_factory=list)
    """[size, used] per reserved segment (one tensor per segment, as for large allocations)."""
    max_reserved: int = 0
    retries: int = 0
    ooms: int = 0

    @property
    def reserved(self) -> int:
        return sum(size for size, _ in self.segments)

    @property
    def allocated(self) -> int:
        return sum(used for _, used in self.segments)


@dataclass(frozen=True)
class _Properties:
    name: str
    total_memory: int
    uuid: uuid_module.UUID


class _Cuda:
    def __init__(self, capacities: list[int], available: bool = True) -> None:
        self.devices = [_Device(c, uuid_module.UUID(int=i + 1)) for i, c in enumerate(capacities)]
        self.available = available
        self.initialized = False

    # the allocator, as training code drives it through tensors
    def malloc(self, device: int, nbytes: int) -> tuple[int, int]:
        """A tensor of ``nbytes`` on ``device``; returns its handle (device, segment index)."""
        self.initialized = True
        d = self.devices[device]
        for i, segment in enumerate(d.segments):
            if segment[1] == 0 and segment[0] >= nbytes:
                segment[1] = nbytes
                return device, i
        if d.reserved + nbytes > d.capacity:
            d.retries += 1
            d.segments = [s for s in d.segments if s[1] > 0]  # free the cache, retry
            if d.reserved + nbytes > d.capacity:
                d.ooms += 1
                raise OutOfMemoryError(f"CUDA out of memory on device {device}")
        d.segments.append([nbytes, nbytes])
        d.max_reserved = max(d.max_reserved, d.reserved)
        return device, len(d.segments) - 1

    def free(self, handle: tuple[int, int]) -> None:
        device, index = handle
        self.devices[device].segments[index][1] = 0

    # the torch.cuda API the helper reads
    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.devices)

    def memory_reserved(self, device: int) -> int:
        return self.devices[device].reserved

    def memory_allocated(self, device: int) -> int:
        return self.devices[device].allocated

    def max_memory_reserved(self, device: int) -> int:
        return self.devices[device].max_reserved

    def memory_stats(self, device: int) -> dict[str, Any]:
        d = self.devices[device]
        if not self.initialized:
            return {}
        return {"num_alloc_retries": d.retries, "num_ooms": d.ooms, "reserved_bytes.all.current": d.reserved,
                "allocated_bytes.all.current": d.allocated}

    def get_device_properties(self, device: int) -> _Properties:
        d = self.devices[device]
        return _Properties("NVIDIA H100 80GB HBM3", d.capacity, d.uuid)


class StandInTorch:
    """``import torch`` as the helper sees it: a module object with a ``cuda`` attribute."""

    __name__ = "torch"

    def __init__(self, capacities: list[int], available: bool = True) -> None:
        self.cuda = _Cuda(capacities, available)
