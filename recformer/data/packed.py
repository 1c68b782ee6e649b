"""A batch in one contiguous byte buffer, for the trip from a DataLoader worker (loader-internal).

A tensor crossing the DataLoader's worker queue is moved to a fresh shared-memory segment, about
11 ms a segment (``bench/bench_loader.py`` header), so a 13-tensor Batch made the queue the
bottleneck: a worker writes the whole batch into one byte buffer instead, a reusable shared slot
when it was forked (``ring.SlotRing``: only a semaphore post crosses), otherwise a numpy buffer
pickled through the queue's pipe. The training process turns it into a ``Batch`` in one fresh
(pinned, when the loader pins) buffer: ``decode.BatchLayout.to_batch``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from recformer.batch import Batch


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (``bool`` -> ``np.bool_``, ...)."""
    return torch.empty((), dtype=dtype).numpy().dtype


@dataclass
class PackedBatch:
    """Named fields in one contiguous byte buffer: a batch in transit form (``decode.BatchLayout.transit``)
    or a padded Batch (``unpack``)."""

    buffer: np.ndarray | torch.Tensor
    """uint8 [nbytes]: numpy in transit, a (pinned) tensor once padded into a Batch."""
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]
    """(field, dtype, shape, byte offset) per field; offsets are 8-byte aligned."""

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def plan(specs: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]) -> tuple[tuple, int]:
        """The layout of fields (name, dtype, shape) and the buffer bytes it needs."""
        layout, offset = [], 0
        for name, dtype, shape in specs:
            layout.append((name, dtype, tuple(shape), offset))
            offset += -(-math.prod(shape) * numpy_dtype(dtype).itemsize // 8) * 8
        return tuple(layout), offset

    @staticmethod
    def empty(plan: tuple[tuple, int], buffer: np.ndarray | None = None) -> PackedBatch:
        """An uninitialised batch of a planned layout (``plan``: ``(layout, nbytes)``), in a fresh
        buffer or at the start of ``buffer`` (uint8, at least ``nbytes``)."""
        layout, nbytes = plan
        if buffer is None:
            return PackedBatch(np.empty(nbytes, dtype=np.uint8), layout)
        if buffer.nbytes < nbytes:
            raise ValueError(f"a batch needs {nbytes} bytes; the buffer has {buffer.nbytes}")
        return PackedBatch(buffer[:nbytes], layout)

    def views(self) -> dict[str, torch.Tensor]:
        buf = torch.from_numpy(self.buffer) if isinstance(self.buffer, np.ndarray) else self.buffer
        out = {}
        for name, dtype, shape, offset in self.layout:
            n = math.prod(shape) * numpy_dtype(dtype).itemsize
            out[name] = buf[offset : offset + n].view(dtype).view(shape)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """numpy views of the fields (for the kernels that fill them in or read them)."""
        buf = self.buffer.numpy() if isinstance(self.buffer, torch.Tensor) else self.buffer
        # One constructor call per field: slicing, viewing and reshaping takes 2.5x as long.
        return {name: np.ndarray(shape, numpy_dtype(dt), buf, at) for name, dt, shape, at in self.layout}

    def unpack(self) -> Batch:
        """The Batch whose fields this buffer holds, as views into the buffer (no copy)."""
        return Batch(**self.views())
