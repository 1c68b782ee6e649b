"""The fixed-shape tensor batch that the data layer hands to the model.

Shape legend: ``B`` batch, ``L`` history length (``FeatureDims.max_len``), ``F`` context
categorical fields, ``C`` per-event categorical fields, ``I`` item side features, ``E`` summed
per-row embedding dims, ``Dn`` dense features.

Id conventions (see ``recformer.config.OOV_ROW``): every id tensor (``ID_FIELDS``) holds *row
indices* into its field's own table: known id ``i`` is row ``i + 1``, row 0 is OOV and padding. They
are int64 once ``Batch.to(device)`` has run; the loader ships them narrower. Tables are per field;
``cat[:, f]`` indexes field ``f``'s table of ``FeatureDims.cat_rows[f]`` rows.
History is left-padded: the most recent event is always at position ``L - 1``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import numpy as np
import torch

ID_FIELDS = ("target_item", "cat", "hist_item", "hist_cat", "hist_gap")
"""Fields holding table rows; int64 at the model (``Batch.to``), possibly narrower before."""


@dataclass
class Batch:
    label: torch.Tensor
    """float32 [B], in [0, 1]."""
    weight: torch.Tensor
    """float32 [B], >= 0 (ones when the spec has no weight column)."""
    group: torch.Tensor
    """int64 [B], GAUC grouping key (user id; strings are hashed stably); -1 when no group column."""
    target_item: torch.Tensor
    """int64 [B], item row."""
    cat: torch.Tensor
    """int64 [B, F], per-field rows of the context categorical features."""
    dense: torch.Tensor
    """float32 [B, Dn], normalised dense features."""
    emb: torch.Tensor
    """float32 [B, E], per-row embedding columns concatenated in spec order."""
    hist_item: torch.Tensor
    """int64 [B, L], item rows of the history (0 = padding)."""
    hist_cat: torch.Tensor
    """int64 [B, L, C], per-event categorical rows (0 = padding/OOV)."""
    hist_gap: torch.Tensor
    """int64 [B, L], time-gap bucket rows (0 = padding)."""
    hist_mask: torch.Tensor
    """bool [B, L], True where a real event sits."""
    keys: torch.Tensor
    """int64 [B, K], the spec's key columns (for predictions), in spec order."""
    oov: torch.Tensor
    """int64 [K_ids], unknown ids in this batch per id field (``Decoder.oov_fields()`` order): they
    were mapped to the OOV row, and are counted here so that nothing is dropped silently."""

    def __len__(self) -> int:
        return self.label.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Moves every tensor, then widens the id fields to int64 *on the device*: the loader ships
        them compact (int32 / int16 / int8 / uint8), and ``row + offset`` in a narrow dtype would
        wrap.

        The copy keeps each tensor's dtype. ``t.to(device, dtype=torch.long)`` would widen on the CPU
        first (PyTorch converts host-to-device copies on the host), into a fresh unpinned tensor:
        the training process would write 2.6 MB per 1024-row batch of the bench spec instead of
        copying 0.58 MB, and a ``non_blocking`` copy from pinned memory would become a staged,
        synchronous one."""
        out = {}
        for f in fields(self):
            t = getattr(self, f.name).to(device, non_blocking=non_blocking)
            out[f.name] = t.long() if f.name in ID_FIELDS else t
        return Batch(**out)

    def pin_memory(self) -> Batch:
        # DataLoader(pin_memory=True) calls this on custom batch types.
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (``bool`` -> ``np.bool_``, ...)."""
    return torch.empty((), dtype=dtype).numpy().dtype


@dataclass
class PackedBatch:
    """Named fields in one contiguous byte buffer: a batch on the trip from a DataLoader worker
    (in the transit form of ``decode.BatchLayout.transit``), or a padded Batch (``unpack``).

    Measured on the 2-core dev machine (0.85 MB batch): a tensor crossing the worker queue is moved
    to a fresh shared-memory segment, ~11 ms per segment, so a 13-tensor Batch made the queue the
    bottleneck. So a worker writes the whole batch into one byte buffer: a reusable shared slot
    when it was forked (``ring.SlotRing``: only a semaphore post crosses), otherwise a numpy buffer
    pickled through the DataLoader queue's pipe. The training process turns it into a Batch in
    one fresh (pinned, when the loader pins) buffer: ``BatchLayout.to_batch``.
    """

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
        # One constructor call per field: slicing, viewing and reshaping took 2.5x as long.
        return {name: np.ndarray(shape, numpy_dtype(dt), buf, at) for name, dt, shape, at in self.layout}

    def unpack(self) -> Batch:
        """The Batch whose fields this buffer holds, as views into the buffer (no copy)."""
        return Batch(**self.views())
