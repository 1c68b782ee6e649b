"""Log rows as the raw requests a client would send (``recformer.data.requests``): to check a server
against ``recformer predict`` on the same rows, and to load-test it with real feature values.

Rows become requests with their raw values: ids through the artifact's item raw-id map back to what
a client holds (MovieLens' movieId), dense features as logged (before normalisation), and each
history event's time as ``timestamp - gap``. Consecutive rows of one user (``spec.group``) with the
same history and timestamp are one request with several candidates: a feature equal on all of
them goes in ``context``, the others per candidate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from recformer.config import FeatureSpec
from recformer.data.requests import ITEM, TIMESTAMP


def row_features(spec: FeatureSpec) -> list[str]:
    """The per-row features of ``spec`` (those a request gives in context or per candidate)."""
    return [f.name for f in [*spec.categorical, *spec.dense, *spec.embedding, *spec.bags]]


def log_requests(
    table: pa.Table,
    spec: FeatureSpec,
    item_ids: pa.Array | None = None,
    time_column: str | None = None,
    max_candidates: int = 100,
) -> Iterator[tuple[dict[str, Any], list[int]]]:
    """Each request of ``table``'s rows and the rows it scores, in row order. ``item_ids``: the
    artifact's map (item id -> raw id); ``time_column``: the rows' Unix time (else each request's
    ``timestamp`` is 0 and its events' times are ``-gap``: only the differences matter)."""
    cols = {name: table.column(name).to_pylist() for name in row_features(spec)}
    raw = item_ids.to_pylist() if item_ids is not None else None
    to_raw = (lambda i: raw[i]) if raw is not None else (lambda i: i)
    items = [to_raw(i) for i in table.column(spec.item.column).to_pylist()]
    events = _events(table, spec, to_raw)
    times = table.column(time_column).to_pylist() if time_column else [0] * table.num_rows
    groups = table.column(spec.group).to_pylist() if spec.group else list(range(table.num_rows))
    start = 0
    for i in range(1, table.num_rows + 1):
        same = (
            i < table.num_rows
            and i - start < max_candidates
            and groups[i] == groups[start]
            and times[i] == times[start]
            and (events is None or events[i] == events[start])
        )
        if same:
            continue
        rows = list(range(start, i))
        yield _request(rows, cols, items, events, times[start], spec), rows
        start = i


def _events(table: pa.Table, spec: FeatureSpec, to_raw) -> list[list[dict]] | None:
    """Each row's newest ``max_len`` events as request events (still gap-relative: ``timestamp``
    holds the gap)."""
    s = spec.sequence
    if s is None:
        return None
    items = table.column(s.item_column).to_pylist()
    cats = {f.name: table.column(f.name).to_pylist() for f in s.categorical}
    gaps = table.column(s.time_gap_column).to_pylist() if s.time_gap_column else None
    out = []
    for r, row in enumerate(items):
        evs = []
        first = max(len(row) - s.max_len, 0)  # the loader keeps the newest max_len; a client sends those
        for k in range(first, len(row)):
            item = row[k]
            ev = {ITEM: to_raw(item)} | {name: c[r][k] for name, c in cats.items()}
            if gaps is not None:
                ev[TIMESTAMP] = gaps[r][k]
            evs.append(ev)
        out.append(evs)
    return out


def _request(rows, cols, items, events, now, spec: FeatureSpec) -> dict[str, Any]:
    context, per_candidate = {}, []
    for name, values in cols.items():
        vals = [values[r] for r in rows]
        if all(v == vals[0] for v in vals):
            context[name] = vals[0]
        else:
            per_candidate.append(name)
    cands = [{ITEM: items[r]} | {name: cols[name][r] for name in per_candidate} for r in rows]
    request: dict[str, Any] = {"context": context, "candidates": cands}
    if events is not None:
        history = []
        for ev in events[rows[0]]:
            ev = dict(ev)
            if TIMESTAMP in ev:  # the gap, in seconds: the event happened that long before
                ev[TIMESTAMP] = now - _exact(ev[TIMESTAMP])
            history.append(ev)
        request["history"] = history
        if spec.sequence.time_gap_column:
            request[TIMESTAMP] = now
    return request


def _exact(gap: float) -> int | float:
    """A whole-second gap as an int (``now - gap`` then gives it back exactly)."""
    return int(gap) if float(gap).is_integer() else gap


def candidate_items(
    table: pa.Table, spec: FeatureSpec, item_ids: pa.Array | None, n: int, seed: int = 0
) -> list:
    """``n`` raw item ids drawn from ``table``'s target items (a load test's candidate lists)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(table.column(spec.item.column).to_numpy())
    picked = rng.choice(ids, size=n, replace=len(ids) < n)
    raw = item_ids.to_pylist() if item_ids is not None else None
    return [raw[int(i)] if raw is not None else int(i) for i in picked]
