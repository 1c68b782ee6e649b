"""Compiled (numba) kernels that turn a window's ragged history into a batch's padded rows.

The history columns dominate both the bytes and the work of a batch (100 events x 3 columns against
a dozen scalars). Decoding them into a padded window and then gathering the shuffled batch rows out
of it touched every value twice, with numpy temporaries in between. ``pad_history`` reads each kept
value once, from the Arrow value buffers (zero-copy), and writes it into its slot of the batch
buffer: truncation to the newest ``L`` events, left padding, id -> table row, OOV counting and
time-gap bucketing in one pass over the batch's rows.

Inputs: ``off`` (int64 [S + 1]) are the window's list offsets, shared by every history column
(aligned lists have equal lengths, checked at decode); ``idx`` holds the window rows of the batch in
batch order. Row ``r`` of the output takes window row ``idx[r]``: its last ``keep = min(len, L)``
events go to slots ``L - keep .. L - 1``, and the slots before are padding (0 / False).

Measured on the 2-core dev machine (``bench/bench_loader.py``, 100-event histories): a shuffled
batch's rows sit at random places in a window of tens of MB, so the plain loop waits on memory for
every row (0.25 us/row for the item column alone, 0.11 in order). Prefetching the rows a few ahead
(``_PREFETCH_ROWS``) hides that latency: 0.10 us/row shuffled.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_jit = numba.njit(cache=True, nogil=True)
_U = numba.uint64

_PREFETCH_ROWS = 4
"""How many batch rows ahead the source events are prefetched (2 to 16 measured the same)."""


@intrinsic
def _prefetch(typingctx, arr, i):
    """Hint the CPU to bring ``arr[i]``'s cache line in (``llvm.prefetch``: read, high locality)."""

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        # declare_intrinsic mangles the pointer type the way this llvmlite's LLVM wants it.
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty)
        builder.call(
            fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        )
        return context.get_dummy_value()

    return types.void(arr, i), codegen


@intrinsic
def _float_bits(typingctx, x):
    """The IEEE-754 bits of a float64, as int64 (a register bitcast; ``math.frexp`` is a libm call
    and ten times slower here)."""

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@_jit
def _prefetch_row(off, items, cats, gaps, i, L):
    """Prefetch the events row ``i`` keeps, every 16 elements (a 64-byte line of 4-byte values)."""
    end = off[i + 1]
    start = end - min(end - off[i], L)
    for s in range(start, end, 16):
        _prefetch(items, s)
        if gaps.shape[0]:
            _prefetch(gaps, s)
        for j in range(cats.shape[0]):
            _prefetch(cats[j], s)


@_jit
def _pad_ids(row, vals, src, pad, keep, limit):
    """``row[:pad] = 0``; ``row[pad + t]`` = table row of id ``vals[src + t]`` (``id + 1``, or 0 when
    ``id >= limit``). Returns the OOV count."""
    for t in range(pad):
        row[_U(t)] = 0
    n_oov = 0
    for t in range(keep):
        v = vals[src + _U(t)]
        ok = v < limit
        row[_U(pad + t)] = v + 1 if ok else 0
        n_oov += not ok
    return n_oov


@_jit
def pad_history(
    off,
    items,
    item_limit,
    cats,
    cat_limits,
    gaps,
    unit_s,
    gap_buckets,
    idx,
    pos,
    out_item,
    out_cat,
    out_gap,
    out_mask,
    oov,
):
    """Write window row ``idx[r]`` into batch row ``pos[r]`` of ``out_*``, for every ``r``, and
    add the OOV counts to ``oov`` ([1 + C]: items, then each event categorical).

    - ``items`` [N] raw item ids (checked >= 0): row ``id + 1``, or OOV row 0 when ``id >= item_limit``;
    - ``cats`` [C, N] raw event-categorical ids (field-major), the same rule with ``cat_limits[j]``;
    - ``gaps`` [N] seconds (checked finite, >= 0): bucket row
      ``1 + min(floor(log2(1 + gap / unit_s)), gap_buckets - 1)``, the floor of log2 read from the
      exponent of ``1 + gap / unit_s`` in float64 (exact for float32 gaps; a float64 gap within
      ~1e-16 relative of an edge can round up into the next bucket); ``gap_buckets == 0`` (no gap
      column) writes 0.

    Inner loops index with unsigned ints (``_U``): numba then skips its negative-index wraparound
    test, which otherwise stops LLVM from vectorising them (3x on the item loop).
    """
    B, L, C = idx.shape[0], out_item.shape[1], cats.shape[0]
    n_out = out_item.shape[0]
    top = gap_buckets - 1
    n_item = 0
    n_cat = np.zeros(C, np.int64)
    out_cat2 = out_cat.reshape(n_out, L * C)
    for r in range(min(_PREFETCH_ROWS, B)):
        _prefetch_row(off, items, cats, gaps, idx[r], L)
    for r in range(B):
        if r + _PREFETCH_ROWS < B:
            _prefetch_row(off, items, cats, gaps, idx[r + _PREFETCH_ROWS], L)
        i = idx[r]
        end = off[i + 1]
        keep = min(end - off[i], L)
        pad = L - keep
        src = _U(end - keep)  # event of slot pad + t is src + t
        o = pos[r]
        n_item += _pad_ids(out_item[o], items, src, pad, keep, item_limit)
        # Slot t of field j is element t * C + j of the row; C == 1 (the common case) gets its own
        # unit-stride loop, which LLVM vectorises.
        row_cat = out_cat2[o]
        for j in range(C):
            limit, src_j, count = cat_limits[j], cats[j], 0
            if C == 1:
                count = _pad_ids(row_cat, src_j, src, pad, keep, limit)
            else:
                for t in range(pad):
                    row_cat[_U(t * C + j)] = 0
                for t in range(keep):
                    c = src_j[src + _U(t)]
                    ok = c < limit
                    row_cat[_U((pad + t) * C + j)] = c + 1 if ok else 0
                    count += not ok
            n_cat[j] += count
        row_gap = out_gap[o]
        for t in range(pad):
            row_gap[_U(t)] = 0
        if gap_buckets:
            for t in range(keep):
                e = (_float_bits(1.0 + gaps[src + _U(t)] / unit_s) >> 52) - 1023
                row_gap[_U(pad + t)] = min(e, top) + 1
        else:
            for t in range(keep):
                row_gap[_U(pad + t)] = 0
        row_mask = out_mask[o]
        for t in range(pad):
            row_mask[_U(t)] = False
        for t in range(keep):
            row_mask[_U(pad + t)] = True
    oov[0] += n_item
    for j in range(C):
        oov[1 + j] += n_cat[j]


@_jit
def count_oov(off, items, item_limit, cats, cat_limits, L, oov):
    """Add to ``oov`` the OOV values among the kept (newest ``L``) events of every row."""
    C = cats.shape[0]
    for i in range(off.shape[0] - 1):
        end = off[i + 1]
        for s in range(end - min(end - off[i], L), end):
            if items[s] >= item_limit:
                oov[0] += 1
            for j in range(C):
                if cats[j, s] >= cat_limits[j]:
                    oov[1 + j] += 1


def bucket_gaps(gaps: np.ndarray, unit_s: float, buckets: int) -> np.ndarray:
    """``pad_history``'s time-gap rule on a flat array, in numpy (for tests and summaries)."""
    e = np.frexp(1.0 + gaps.astype(np.float64) / unit_s)[1] - 1
    return np.minimum(e, buckets - 1) + 1


@_jit
def gather_rows(rows, oov_rows, idx, pos, src_off, dst_off, width, out, oov):
    """Copy record ``rows[idx[r]]`` (4-byte words) into batch row ``pos[r]`` of the batch's field
    columns: field ``f`` is ``width[f]`` words at ``src_off[f]`` of a record and goes to words
    ``dst_off[f] + pos[r] * width[f]`` of ``out``. Adds the rows' OOV flags (``oov_rows``) to ``oov``.
    A shuffled batch's records are random cache misses; prefetching them ahead overlaps those."""
    B, F, K = idx.shape[0], src_off.shape[0], oov_rows.shape[1]
    W = rows.shape[1]
    flat = rows.reshape(-1)
    ahead = _PREFETCH_ROWS * 4
    for r in range(min(ahead, B)):
        _prefetch(flat, idx[r] * W)
    for r in range(B):
        if r + ahead < B:
            _prefetch(flat, idx[r + ahead] * W)
            _prefetch(flat, idx[r + ahead] * W + W - 1)  # a record may straddle two lines
        i = idx[r]
        for f in range(F):
            w = width[f]
            s = _U(src_off[f])
            d = _U(dst_off[f] + pos[r] * w)
            for k in range(w):
                out[d + _U(k)] = rows[i, s + _U(k)]
        for k in range(K):
            oov[k] += oov_rows[i, k]
