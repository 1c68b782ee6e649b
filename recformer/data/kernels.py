"""Compiled (numba) kernels that cut batches out of a window: the worker's half and the training
process's half.

The history columns dominate both the bytes and the work of a batch (up to ``L`` events x 3 columns
against a dozen scalars). A batch crosses from a worker to the training process *ragged*
(``BatchLayout.transit``), and is padded on arrival:

- decode (``map_ids``, ``map_gaps``, ``put_words``): once per row group, in sequential passes that
  also check the values, history ids become table rows and gaps bucket rows, in narrow dtypes;
- worker (``cut_plan``, ``gather_records``, ``gather_events``): each batch row's record is copied
  whole, and its newest ``keep = min(len, L)`` events are copied consecutively (OOV counted);
- training process (``scatter_records``, ``pad_events``): records become field columns and each
  row's events go to slots ``L - keep .. L - 1`` behind zero / False padding. This replaces the copy
  out of the worker's shared slot that the training process made anyway, and reads fewer bytes.

Inputs: ``off`` (int64 [S + 1]) are the window's list offsets, shared by every history column
(aligned lists have equal lengths, checked at decode); ``idx`` holds the window rows of the batch in
batch order.

Why they look as they do: a shuffled batch's rows sit at random places in a window of tens of MB,
so a plain loop waits on memory for every row; prefetching the rows a few ahead (``_PREFETCH_ROWS``)
hides that latency. A worker ships rows ragged, ids mapped once at decode, and plans each batch in
one kernel (``cut_plan``); the training process pads on arrival. The figures behind each choice are
in ``bench/bench_loader.py`` ("Design measurements"; ``--stages`` splits the CPU per row).
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
"""How many batch rows ahead the source events are prefetched (anything from 2 to 16 reads alike)."""


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
def _copy_rows(out, dst, rows, src, keep):
    """``out[dst + t] = rows[src + t]`` for ``t < keep``; returns how many are OOV (row 0)."""
    n_oov = 0
    for t in range(keep):
        v = rows[src + _U(t)]
        out[dst + _U(t)] = v
        n_oov += v == 0
    return n_oov


@_jit
def gather_events(off, items, cats, gaps, L, idx, pos, start, out_item, out_cat, out_gap, oov):
    """Worker side: the newest ``keep = min(len, L)`` events of window row ``idx[r]`` become events
    ``start[pos[r]] .. + keep`` of the batch's ragged event arrays, for every ``r``; adds the OOV
    counts to ``oov`` ([1 + C]: items, then each event categorical).

    The window's events are table rows already (``map_ids``, ``map_gaps`` at decode): ``items``
    [N], ``cats`` [C, N] (field-major; written event-major, event ``e``'s field ``j`` at
    ``out_cat[e * C + j]``), ``gaps`` [N] bucket rows, or [0] without a time-gap column (0s).

    Inner loops index with unsigned ints (``_U``): numba then skips its negative-index wraparound
    test, which otherwise stops LLVM from vectorising them (3x on the item loop).
    """
    B, C = idx.shape[0], cats.shape[0]
    n_item = 0
    n_cat = np.zeros(C, np.int64)
    for r in range(min(_PREFETCH_ROWS, B)):
        _prefetch_row(off, items, cats, gaps, idx[r], L)
    for r in range(B):
        if r + _PREFETCH_ROWS < B:
            _prefetch_row(off, items, cats, gaps, idx[r + _PREFETCH_ROWS], L)
        i = idx[r]
        end = off[i + 1]
        keep = min(end - off[i], L)
        src = _U(end - keep)  # event t of the row is src + t
        s = _U(start[pos[r]])
        n_item += _copy_rows(out_item, s, items, src, keep)
        if C == 1:  # the common case: a unit-stride loop, which LLVM vectorises
            n_cat[0] += _copy_rows(out_cat, s, cats[0], src, keep)
        else:
            for j in range(C):
                src_j, count = cats[j], 0
                for t in range(keep):
                    c = src_j[src + _U(t)]
                    out_cat[(s + _U(t)) * C + j] = c
                    count += c == 0
                n_cat[j] += count
        if gaps.shape[0]:
            for t in range(keep):
                out_gap[s + _U(t)] = gaps[src + _U(t)]
        else:
            for t in range(keep):
                out_gap[s + _U(t)] = 0
    oov[0] += n_item
    for j in range(C):
        oov[1 + j] += n_cat[j]


@_jit
def cut_plan(idx, starts, kept, rows, pos, bounds, lens, first):
    """Worker side, a batch's plan in one pass (rather than a dozen numpy calls per batch): batch row
    ``r`` (window row ``idx[r]``) keeps ``lens[r] = kept[idx[r]]`` events, from ``first[r]`` of the
    batch's ragged event arrays (rows in batch order); and the batch rows grouped by window part
    (``starts``: [P + 1] part starts), in batch order within a part: part ``p``'s are batch rows
    ``pos[bounds[p]:bounds[p + 1]]``, at part rows ``rows[...]``. Returns the events of the batch,
    or ``-1 - r`` when ``idx[r]`` is outside the window (nothing is read there)."""
    B, P = idx.shape[0], starts.shape[0] - 1
    for p in range(P + 1):
        bounds[p] = 0
    total = 0
    for r in range(B):
        i = idx[r]
        if i < 0 or i >= starts[P]:
            return -1 - r
        k = kept[i]
        lens[r] = k
        first[r] = total
        total += k
        p = 0
        while i >= starts[p + 1]:
            p += 1
        bounds[p + 1] += 1
    for p in range(P):
        bounds[p + 1] += bounds[p]
    for r in range(B):  # a stable counting sort by part; bounds[p] walks part p's run
        i = idx[r]
        p = 0
        while i >= starts[p + 1]:
            p += 1
        j = bounds[p]
        pos[j] = r
        rows[j] = i - starts[p]
        bounds[p] = j + 1
    for p in range(P, 0, -1):  # each bounds[p] stopped at its run's end, the next run's start
        bounds[p] = bounds[p - 1]
    bounds[0] = 0
    return total


@_jit
def _left_pad(row, vals, s, pad, k):
    """``row[:pad] = 0``, ``row[pad:pad + k] = vals[s:s + k]``."""
    for t in range(pad):
        row[_U(t)] = 0
    for t in range(k):
        row[_U(pad + t)] = vals[_U(s + t)]


@_jit
def pad_events(lens, ev_item, ev_cat, ev_gap, out_item, out_cat, out_gap, out_mask):
    """Training-process side: batch row ``r``'s ``lens[r]`` events (consecutive in the ragged
    ``ev_*`` arrays, rows in order) go to slots ``L - lens[r] .. L - 1`` of ``out_*`` row ``r``;
    the slots before are padding (0 / False). ``ev_cat`` is event-major [E * C]."""
    n, L = out_item.shape
    C = out_cat.shape[2]
    out_cat2 = out_cat.reshape(n, L * C)
    s = 0
    for r in range(n):
        k = lens[r]
        pad = L - k
        _left_pad(out_item[r], ev_item, s, pad, k)
        _left_pad(out_cat2[r], ev_cat, s * C, pad * C, k * C)
        _left_pad(out_gap[r], ev_gap, s, pad, k)
        row_mask = out_mask[r]
        for t in range(pad):
            row_mask[_U(t)] = False
        for t in range(k):
            row_mask[_U(pad + t)] = True
        s += k


@_jit
def map_ids(ids, limit, out):
    """Decode side, one sequential pass over a window's events: ``out[i]`` = table row of id
    ``ids[i]`` (``id + 1``, or the OOV row 0 when ``id >= limit``; ``out`` may be narrower than
    ``ids``: rows <= ``limit`` fit it). Returns ``min(0, min(ids))``, negative when any id is (the
    caller rejects those)."""
    lo = 0
    for i in range(ids.shape[0]):
        v = ids[_U(i)]
        lo = min(lo, v)
        out[_U(i)] = v + 1 if v < limit else 0
    return lo


@_jit
def map_gaps(gaps, unit_s, buckets, out):
    """Decode side: ``out[i]`` = bucket row of gap ``gaps[i]`` seconds,
    ``1 + min(floor(log2(1 + gap / unit_s)), buckets - 1)``, the floor of log2 read from the exponent
    of ``1 + gap / unit_s`` in float64 (exact for float32 gaps; a float64 gap within ~1e-16
    relative of an edge can round up into the next bucket). Returns the (non-finite, negative)
    counts, which the caller rejects; their rows are meaningless."""
    top = buckets - 1
    nonfinite, negative = 0, 0
    for i in range(gaps.shape[0]):
        g = np.float64(gaps[_U(i)])
        nonfinite += not np.isfinite(g)
        negative += g < 0
        e = (_float_bits(1.0 + g / unit_s) >> 52) - 1023
        out[_U(i)] = min(max(e, 0), top) + 1
    return nonfinite, negative


@_jit
def put_words(rows, at, src):
    """Words ``at .. at + w`` of every record ``rows[r]`` = ``src[r]`` ([n, w], 4-byte words)."""
    n, w = src.shape
    for r in range(n):
        for k in range(w):
            rows[r, _U(at + k)] = src[r, _U(k)]


@_jit
def count_oov(off, items, cats, L, oov):
    """Add to ``oov`` the OOV rows (0) among the kept (newest ``L``) events of every row."""
    C = cats.shape[0]
    for i in range(off.shape[0] - 1):
        end = off[i + 1]
        for s in range(end - min(end - off[i], L), end):
            if items[s] == 0:
                oov[0] += 1
            for j in range(C):
                if cats[j, s] == 0:
                    oov[1 + j] += 1


def bucket_gaps(gaps: np.ndarray, unit_s: float, buckets: int) -> np.ndarray:
    """``map_gaps``'s time-gap rule on a flat array, in numpy (for tests and summaries)."""
    e = np.frexp(1.0 + gaps.astype(np.float64) / unit_s)[1] - 1
    return np.minimum(e, buckets - 1) + 1


@_jit
def gather_records(rows, idx, pos, oov_at, out, oov):
    """Worker side: record ``rows[idx[r]]`` (4-byte words) becomes ``out[pos[r]]``, for every ``r``; the
    per-row OOV flags (``len(oov)`` words from ``oov_at`` of each record) are added to ``oov``. A
    shuffled batch's records are random cache misses; prefetching them ahead overlaps those.
    Whole records are copied (one contiguous run per row, about a tenth of the cost of writing
    each field to its own column); the training process splits them with ``scatter_records``."""
    B, W, K = idx.shape[0], rows.shape[1], oov.shape[0]
    flat = rows.reshape(-1)
    ahead = _PREFETCH_ROWS * 4
    for r in range(min(ahead, B)):
        _prefetch(flat, idx[r] * W)
    for r in range(B):
        if r + ahead < B:
            _prefetch(flat, idx[r + ahead] * W)
            _prefetch(flat, idx[r + ahead] * W + W - 1)  # a record may straddle two lines
        i, o = idx[r], pos[r]
        for k in range(W):
            out[o, _U(k)] = rows[i, _U(k)]
        for k in range(K):
            oov[k] += rows[i, _U(oov_at + k)]


@_jit
def scatter_records(rec, src_off, dst_off, width, out):
    """Training-process side: field ``f`` of record ``r`` (``width[f]`` words at ``src_off[f]``)
    goes to words ``dst_off[f] + r * width[f]`` of ``out``: one column per field."""
    B, F = rec.shape[0], src_off.shape[0]
    for r in range(B):
        for f in range(F):
            w = width[f]
            s = _U(src_off[f])
            d = _U(dst_off[f] + r * w)
            for k in range(w):
                out[d + _U(k)] = rec[r, s + _U(k)]
