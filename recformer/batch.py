"""The batch contract: every field the data layer hands the model, declared once (``FIELDS``).

``Batch`` (the dataclass the model reads), ``ID_FIELDS`` (the table rows ``Batch.to`` widens), the
loader's per-row record and its transit form (``recformer.data.decode.BatchLayout``) are all
derived from ``FIELDS``: adding a field is one line here, its producer (the decoder) and its
consumer (the tokenizer). ``DataError``, the error every data check raises, sits beside it.

Shapes use the project legend (``recformer/__init__.py``). Id conventions
(``recformer.config.OOV_ROW``): an id field holds *row indices* into its field's own table: known
id ``i`` is row ``i + 1``, row 0 is OOV and padding. History is left-padded: the most recent event
is always at position ``L - 1``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Role = Literal["row", "event", "mask", "count"]
"""How a field travels from a worker (``recformer.data.decode.BatchLayout.transit``):

- ``row``: a fixed-width value per row, packed with the row's other fields in one record;
- ``event``: a value per history event, ragged in transit, left-padded to ``L`` in the Batch;
- ``mask``: made from each row's event count while padding;
- ``count``: one vector per batch (summed over its rows).
"""

NarrowInt = Literal["item", "event_cat"]
"""A host dtype chosen per spec: the narrowest integer that holds every row of the item table or
of the event categoricals (``BatchLayout.item_dtype`` / ``cat_dtype``): the padded history is most
of a batch's bytes, so its width is what the training process writes and what crosses to the GPU."""


class DataError(ValueError):
    """Bad input data; the message names the file, column and what was expected."""


@dataclass(frozen=True)
class BatchField:
    name: str
    role: Role
    host: str
    """torch dtype name on the host (in transit from a worker and in the Batch the loader yields),
    or a ``NarrowInt``. Names, not dtypes: this module is imported by torch-free commands."""
    device: str
    """torch dtype name at the model: ``Batch.to`` converts on the device (ids widen to int64)."""
    shape: tuple[str, ...]
    """Axes, as letters of the shape legend."""
    doc: str


FIELDS: tuple[BatchField, ...] = (
    BatchField("label", "row", "float32", "float32", ("B",), "in [0, 1]"),
    BatchField("weight", "row", "float32", "float32", ("B",), ">= 0; ones without a weight column"),
    BatchField("group", "row", "int64", "int64", ("B",), "GAUC key (strings hashed stably); -1 without one"),
    BatchField("target_item", "row", "int32", "int64", ("B",), "item row of the target"),
    BatchField("cat", "row", "int32", "int64", ("B", "F"), "per-field rows of the context categoricals"),
    BatchField("dense", "row", "float32", "float32", ("B", "Dn"), "normalised dense features"),
    BatchField("emb", "row", "float32", "float32", ("B", "E"), "per-row embedding columns, in spec order"),
    BatchField("keys", "row", "int64", "int64", ("B", "K"), "the spec's key columns, for predictions"),
    BatchField(
        "bag", "row", "int32", "int64", ("B", "G"), "per-field rows of the bag fields' values; -1 = none"
    ),
    BatchField("hist_item", "event", "item", "int64", ("B", "L"), "item rows of the history (0 = padding)"),
    BatchField("hist_cat", "event", "event_cat", "int64", ("B", "L", "C"), "per-event categorical rows"),
    BatchField("hist_gap", "event", "uint8", "int64", ("B", "L"), "time-gap bucket rows (0 = padding)"),
    BatchField("hist_mask", "mask", "bool", "bool", ("B", "L"), "True where a real event sits"),
    BatchField(
        "oov",
        "count",
        "int64",
        "int64",
        ("O",),
        "unknown ids in the batch per id field (Decoder.oov_fields order): mapped to the OOV row "
        "and counted, so nothing is dropped silently",
    ),
)

ID_FIELDS = tuple(f.name for f in FIELDS if f.device == "int64" and f.host != "int64")
"""Fields holding table rows: shipped narrow, int64 at the model (``row + offset`` in a narrow
dtype would wrap)."""

_DEVICE_DTYPE = {f.name: f.device for f in FIELDS}


class _BatchOps:
    def __len__(self) -> int:
        return self.label.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Moves every tensor, then converts it to its ``BatchField.device`` dtype *on the device*.

        The copy keeps each tensor's dtype: ``t.to(device, dtype=torch.long)`` would widen on the
        CPU first (PyTorch converts host-to-device copies on the host), into a fresh unpinned tensor,
        several times the bytes, and a ``non_blocking`` copy from pinned memory would become a
        staged, synchronous one."""
        import torch  # here: the module itself stays importable without torch

        out = {}
        for f in dataclasses.fields(self):
            t = getattr(self, f.name).to(device, non_blocking=non_blocking)
            # Floating fields keep the dtype they have: a precision plugin (bf16-true) may have set it.
            dtype = getattr(torch, _DEVICE_DTYPE[f.name])
            out[f.name] = t.to(dtype) if not t.is_floating_point() and t.dtype != dtype else t
        return Batch(**out)

    def pin_memory(self) -> Batch:
        # DataLoader(pin_memory=True) calls this on custom batch types.
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in dataclasses.fields(self)})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _doc() -> str:
    rows = "\n".join(f"- ``{f.name}`` [{', '.join(f.shape)}], {f.role}: {f.doc}" for f in FIELDS)
    return f"One batch of fixed-shape tensors, a field per ``FIELDS`` entry:\n\n{rows}\n"


Batch = dataclasses.make_dataclass(
    "Batch", [(f.name, "torch.Tensor") for f in FIELDS], bases=(_BatchOps,), namespace={"__doc__": _doc()}
)
Batch.__module__ = __name__


def batch_of(**tensors: torch.Tensor) -> Batch:
    """A Batch of the given fields, every other field empty (zero along each axis but ``B``, as a
    spec without that input has it): for batches made outside the loader (tests, benches), which
    then need no change when a field is added."""
    import torch  # here: the module itself stays importable without torch

    B = next(t.shape[0] for name, t in tensors.items() if name != "oov")
    for f in FIELDS:
        if f.name not in tensors:
            shape = tuple(B if axis == "B" else 0 for axis in f.shape)
            tensors[f.name] = torch.zeros(shape, dtype=getattr(torch, f.device))
    return Batch(**tensors)
