"""Serving requests to the model's inputs with the loader's own code: ``RequestEncoder``.

A request ranks the candidates of one user; ids are raw, as the logs hold them (through the spec's
vocabularies and the artifact's item map). For the MovieLens spec::

    {"timestamp": 1537799250,
     "context": {"user_id": 414, "hour": 13, "dow": 2, "user_n_prior": 120, "user_pos_rate_prior": 0.55},
     "history": [{"item": 296, "hist_ratings": 9, "timestamp": 1537790000}, ...],
     "candidates": [{"item": 1, "item_n_prior": 50, "item_pos_rate_prior": 0.6,
                     "days_since_release": 9000.5}, ...]}

- Every per-row feature of the spec (categorical, dense, embedding, bag) is given once: in
  ``context``, shared by every candidate, or in each candidate. Raw values: dense features before
  their log1p and standardisation, categoricals as the logs hold them.
- ``history``: the user's events, oldest first, at most ``sequence.max_len`` of them; each names its
  ``item``, its event categoricals by column and, when the spec has a time-gap column, its Unix
  ``timestamp`` in seconds: its gap is the request's ``timestamp`` minus it (the log's gap column).
- ``candidates``: at least one; each has its ``item``.

``parse`` checks one request: a bad one raises ``RequestError``, one line naming the field and what
was expected; nothing is dropped silently (an unknown key is an error; an unknown id goes to the
OOV row and is counted). ``encode`` turns parsed requests into one padded ``Batch``, a row per
candidate, through ``recformer.data.encode.Encoder`` and the loader's ``Decoder.pack`` and
``Window.gather``: the tensors the loader makes for the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from recformer.batch import Batch
from recformer.config import FeatureSpec
from recformer.data.decode import Decoder, Window
from recformer.data.encode import GAP_UNIT_S, History
from recformer.data.schema import Where

WHERE = Where("request")
"""How encoder errors name a request (``DataError``: "request: column 'x' ...")."""
ITEM, TIMESTAMP = "item", "timestamp"
TOP_KEYS = ("timestamp", "context", "history", "candidates")
INT64 = 2**63


class RequestError(ValueError):
    """A bad request; the message is one line naming the field and what was expected."""


@dataclass(frozen=True)
class Field:
    """One raw input of a request: what it holds and how it becomes an Arrow column."""

    name: str
    kind: str
    """``id`` (an integer or a string), ``dense`` (a number), ``vector`` (``dim`` numbers), ``bag``
    (a list of ids), ``time`` (Unix seconds)."""
    ids: str = "int"
    """For ids: ``int`` (integers, ``>= 0`` unless ``signed``) or ``str``."""
    signed: bool = False
    """Integer ids looked up in a vocabulary: any integer (an unknown one goes to the OOV row)."""
    nullable: bool = False
    """A JSON null is an unknown id (OOV, counted), as a null is in the logs."""
    size: int = 0
    """``vector``: its length; ``bag``: the most values the model reads."""

    def expected(self) -> str:
        if self.kind == "id":
            what = "a string" if self.ids == "str" else "an integer" if self.signed else "an integer >= 0"
            return f"{what} id" + (" or null" if self.nullable else "")
        return {
            "dense": "a finite number",
            "vector": f"a list of {self.size} finite numbers",
            "bag": f"a list of at most {self.size} ids",
            "time": "Unix seconds (a finite number)",
        }[self.kind]


@dataclass
class Parsed:
    """One checked request, values still raw."""

    n: int
    """Candidates."""
    rows: dict[str, tuple[bool, Any]]
    """Per row field: (given in context, its value) or (False, a value per candidate)."""
    events: dict[str, list]
    """Per history column (``item``, each event categorical, the gaps in seconds): a value per event."""


@dataclass
class Encoded:
    """Parsed requests as the model's inputs: ``batch`` (a row per candidate, request after
    request), each request's row span, and its unknown ids per id field (``RequestEncoder.oov_names``)."""

    batch: Batch
    spans: list[tuple[int, int]]
    unknown: np.ndarray
    """int64 [requests, fields]: context ids count once, candidate ids per candidate, events once."""


class RequestEncoder:
    """Checks and encodes the requests of one feature spec (see the module docstring)."""

    def __init__(
        self,
        spec: FeatureSpec,
        item_ids: pa.Array | None = None,
        gap_unit_s: float = GAP_UNIT_S,
        max_candidates: int = 1000,
    ):
        self.decoder = Decoder(spec, item_ids, gap_unit_s)
        self.spec, self.max_candidates = spec, max_candidates
        self.item = self._id_field(spec.item.column, ITEM)
        self.row_fields = self._row_fields(spec)
        seq = spec.sequence
        self.event_fields = [self._id_field(seq.item_column, ITEM)] if seq else []
        self.event_fields += [self._id_field(f.name) for f in seq.categorical] if seq else []
        self.time = Field(TIMESTAMP, "time") if seq and seq.time_gap_column else None
        if ITEM in self.row_fields:
            raise ValueError(f"the spec names a feature {ITEM!r}, which requests use for the item id")
        # Unknown ids are counted under the names requests use for them (``Decoder.oov_fields`` order).
        self.oov_names = [ITEM, *(f.name for f in spec.categorical), *(f.name for f in spec.bags)]
        self.oov_names += [f"history.{f.name}" for f in self.event_fields]

    def __call__(self, requests: list[Any]) -> Encoded:
        """Raw requests (JSON objects) checked and encoded: the one call from a request to the
        model's inputs."""
        return self.encode([self.parse(r) for r in requests])

    def _id_field(self, column: str, name: str | None = None, nullable: bool = False) -> Field:
        """An id read as ``column`` is (through its vocabulary, if it has one)."""
        vocab = self.decoder.vocabs.get(column)
        strings = vocab is not None and pa.types.is_string(vocab.type)
        return Field(name or column, "id", "str" if strings else "int", vocab is not None, nullable)

    def _row_fields(self, spec: FeatureSpec) -> dict[str, Field]:
        out = {f.name: self._id_field(f.name, nullable=True) for f in spec.categorical}
        out |= {f.name: Field(f.name, "dense") for f in spec.dense}
        out |= {f.name: Field(f.name, "vector", size=f.dim) for f in spec.embedding}
        for f in spec.bags:
            base = self._id_field(f.name, nullable=True)
            out[f.name] = Field(f.name, "bag", base.ids, base.signed, True, f.max_values)
        return out

    def describe(self) -> dict[str, Any]:
        """What a request holds, field by field (the server's /info)."""
        show = lambda fields: {f.name: f.expected() for f in fields}
        out: dict[str, Any] = {"candidates": {ITEM: self.item.expected()}}
        out["context or candidates"] = show(self.row_fields.values())
        if self.spec.sequence is not None:
            events = self.event_fields + ([self.time] if self.time else [])
            out["history"] = {"max_events": self.spec.sequence.max_len, "event": show(events)}
        if self.time:
            out[TIMESTAMP] = self.time.expected()
        return out

    def example(self) -> dict[str, Any]:
        """A valid request of this spec (one candidate, one event; first known ids, zero dense
        values): the server scores it once before it reports healthy, and /info shows it."""
        first = self._known
        value = {"id": first, "dense": lambda f: 0.0, "vector": lambda f: [0.0] * f.size, "bag": lambda f: []}
        out: dict[str, Any] = {"context": {n: value[f.kind](f) for n, f in self.row_fields.items()}}
        out["candidates"] = [{ITEM: first(self.item)}]
        if self.spec.sequence is not None:
            event = {f.name: first(f) for f in self.event_fields}
            out["history"] = [event | ({TIMESTAMP: 1_700_000_000 - 3600} if self.time else {})]
        if self.time:
            out[TIMESTAMP] = 1_700_000_000
        return out

    def _known(self, f: Field) -> Any:
        """The first known raw id of an id field: its vocabulary's first value, else id 0."""
        vocab = self.decoder.vocabs.get(self.spec.item.column if f.name == ITEM else f.name)
        return vocab[0].as_py() if vocab is not None else 0

    # -- one request ---------------------------------------------------------------------------
    def parse(self, request: Any) -> Parsed:
        """``request`` checked (``RequestError`` names the first bad field)."""
        if not isinstance(request, dict):
            raise RequestError(f"body: expected a JSON object with {list(self._top_keys())}")
        unknown = sorted(set(request) - set(self._top_keys()))
        if unknown:
            raise RequestError(
                f"{unknown[0]}: not a field of this model's requests; expected {list(self._top_keys())}"
            )
        candidates = self._candidates(request.get("candidates"))
        context = request.get("context", {})
        if not isinstance(context, dict):
            raise RequestError(f"context: expected an object of features, got {_show(context)}")
        rows = self._rows(context, candidates)
        events = self._history(request) if self.spec.sequence is not None else {}
        return Parsed(len(candidates), rows, events)

    def _top_keys(self) -> tuple[str, ...]:
        keys = ("context", "candidates")
        keys += ("history",) if self.spec.sequence is not None else ()
        return (TIMESTAMP, *keys) if self.time else keys

    def _candidates(self, cands: Any) -> list[dict]:
        if cands is None:
            raise RequestError(f"candidates: missing; expected a list of objects, each with an {ITEM!r}")
        if not isinstance(cands, list) or not cands:
            raise RequestError(f"candidates: expected a non-empty list of objects, got {_show(cands)}")
        if len(cands) > self.max_candidates:
            raise RequestError(
                f"candidates: {len(cands)} given; this server scores at most {self.max_candidates} per "
                "request (recformer serve --max-candidates)"
            )
        for i, c in enumerate(cands):
            if not isinstance(c, dict):
                raise RequestError(f"candidates[{i}]: expected an object with an {ITEM!r}, got {_show(c)}")
            extra = sorted(set(c) - {ITEM, *self.row_fields})
            if extra:
                raise RequestError(
                    f"candidates[{i}].{extra[0]}: not a feature of this model; expected {ITEM!r} and "
                    f"features among {sorted(self.row_fields)}"
                )
            if ITEM not in c:
                raise RequestError(f"candidates[{i}].{ITEM}: missing; expected {self.item.expected()}")
        return cands

    def _rows(self, context: dict, cands: list[dict]) -> dict[str, tuple[bool, Any]]:
        extra = sorted(set(context) - set(self.row_fields))
        if extra:
            raise RequestError(
                f"context.{extra[0]}: not a feature of this model; expected features among "
                f"{sorted(self.row_fields)}"
            )
        rows = {
            ITEM: (
                False,
                [_value(self.item, c[ITEM], f"candidates[{i}].{ITEM}") for i, c in enumerate(cands)],
            )
        }
        for name, field in self.row_fields.items():
            if name in context:
                both = next((i for i, c in enumerate(cands) if name in c), None)
                if both is not None:
                    raise RequestError(f"candidates[{both}].{name}: also given in context; give it once")
                rows[name] = (True, _value(field, context[name], f"context.{name}"))
                continue
            missing = next((i for i, c in enumerate(cands) if name not in c), None)
            if missing is not None:
                where = (
                    f"candidates[{missing}].{name}" if any(name in c for c in cands) else f"context.{name}"
                )
                raise RequestError(
                    f"{where}: missing; expected {field.expected()}, in context or in every candidate"
                )
            rows[name] = (
                False,
                [_value(field, c[name], f"candidates[{i}].{name}") for i, c in enumerate(cands)],
            )
        return rows

    def _history(self, request: dict) -> dict[str, list]:
        events, L = request.get("history"), self.spec.sequence.max_len
        if events is None:
            raise RequestError(
                "history: missing; expected a list of the user's events, oldest first ([] for none)"
            )
        if not isinstance(events, list):
            raise RequestError(f"history: expected a list of events, oldest first, got {_show(events)}")
        if len(events) > L:
            raise RequestError(
                f"history: {len(events)} events; the model reads at most {L} (sequence.max_len): send the "
                f"{L} most recent, oldest first"
            )
        now = _value(self.time, request.get(TIMESTAMP), TIMESTAMP) if self.time else None
        keys = [f.name for f in self.event_fields] + ([TIMESTAMP] if self.time else [])
        out: dict[str, list] = {k: [] for k in keys}
        for i, ev in enumerate(events):
            if not isinstance(ev, dict):
                raise RequestError(f"history[{i}]: expected an object with {keys}, got {_show(ev)}")
            extra = sorted(set(ev) - set(keys))
            if extra:
                raise RequestError(f"history[{i}].{extra[0]}: not a field of an event; expected {keys}")
            for f in [*self.event_fields, *([self.time] if self.time else [])]:
                out[f.name].append(_value(f, ev.get(f.name), f"history[{i}].{f.name}"))
            if now is not None and out[TIMESTAMP][-1] > now:
                raise RequestError(
                    f"history[{i}].{TIMESTAMP}: {out[TIMESTAMP][-1]!r} is after the request's timestamp "
                    f"{now!r}; expected events before the impression"
                )
        if now is not None:
            out[TIMESTAMP] = [now - t for t in out[TIMESTAMP]]  # the log's gap column, in seconds
        return out

    # -- a batch of requests -------------------------------------------------------------------
    def encode(self, requests: list[Parsed]) -> Encoded:
        """Parsed requests as one padded Batch (host dtypes, as the loader yields it), a row per
        candidate. Raises ``DataError`` on a value only the encoder can judge (a dense value past
        float32 after normalisation); the caller can then encode the requests one by one."""
        dec = self.decoder
        sizes = np.array([p.n for p in requests], np.int64)
        n = int(sizes.sum())
        columns = {self.spec.item.column: self._column(self.item, requests, ITEM)}
        columns |= {name: self._column(f, requests, name) for name, f in self.row_fields.items()}
        features, _ = dec.row_features(columns.__getitem__, n, WHERE)
        hist, hist_unknown = self._encoded_history(requests, sizes)
        decoded = dec.pack(dec.unlabelled(n) | features, hist)
        batch = Window([decoded]).gather(slice(None))
        ends = np.cumsum(sizes)
        spans = [(int(e - s), int(e)) for s, e in zip(sizes, ends)]
        return Encoded(batch, spans, self._unknown(features["row_oov"], requests, spans, hist_unknown))

    def _column(self, f: Field, requests: list[Parsed], name: str) -> pa.Array:
        """A row field over every candidate of ``requests``, as an Arrow column."""
        values: list = []
        for p in requests:
            shared, v = p.rows[name]
            values.extend([v] * p.n if shared else v)
        if f.kind == "dense":
            return pa.array(np.asarray(values, np.float64))
        if f.kind in ("vector", "bag"):
            lens = np.array([len(v) for v in values], np.int64)
            offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
            flat = [x for v in values for x in v]
            inner = pa.array(flat, pa.float64() if f.kind == "vector" else _id_type(f))
            return pa.ListArray.from_arrays(offsets, inner)
        return pa.array(values, _id_type(f))

    def _encoded_history(
        self, requests: list[Parsed], sizes: np.ndarray
    ) -> tuple[History | None, np.ndarray]:
        """The history of each request encoded once (``Encoder.sequence`` over a row per request),
        then repeated on each of its candidates' rows; and each request's unknown event ids."""
        s = self.spec.sequence
        if s is None:
            return None, np.zeros((len(requests), 0), np.int64)
        lens = np.array([len(p.events[ITEM]) for p in requests], np.int64)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        cols = {
            s.item_column: self.event_fields[0],
            **{f.name: g for f, g in zip(s.categorical, self.event_fields[1:])},
        }
        table = {}
        for column, f in cols.items():
            flat = [x for p in requests for x in p.events[f.name]]
            table[column] = pa.ListArray.from_arrays(offsets, pa.array(flat, _id_type(f)))
        if s.time_gap_column:
            gaps = np.fromiter(
                (g for p in requests for g in p.events[TIMESTAMP]), np.float64, int(lens.sum())
            )
            table[s.time_gap_column] = pa.ListArray.from_arrays(offsets, pa.array(gaps))
        per_request = self.decoder.sequence(table.__getitem__, len(requests), WHERE)
        unknown = _span_counts(np.vstack([per_request.items[None], per_request.cats]) == 0, per_request.off)
        # Row r of the batch is a candidate of request req[r]: its events are that request's.
        req = np.repeat(np.arange(len(requests)), sizes)
        row_lens = lens[req]
        off = np.concatenate([[0], np.cumsum(row_lens)])
        idx = np.repeat(per_request.off[req] - off[:-1], row_lens) + np.arange(off[-1])
        gaps = per_request.gaps[idx] if s.time_gap_column else per_request.gaps
        return History(off, per_request.items[idx], per_request.cats[:, idx], gaps), unknown

    def _unknown(
        self, row_oov: np.ndarray, requests: list[Parsed], spans: list[tuple[int, int]], hist: np.ndarray
    ) -> np.ndarray:
        """Unknown ids per request and field: a context id once, a candidate id per candidate."""
        names = [ITEM, *(f.name for f in self.spec.categorical), *(f.name for f in self.spec.bags)]
        out = np.zeros((len(requests), len(names) + hist.shape[1]), np.int64)
        for r, (p, (a, b)) in enumerate(zip(requests, spans)):
            for j, name in enumerate(names):
                shared = p.rows[name][0]
                out[r, j] = row_oov[a, j] if shared else row_oov[a:b, j].sum()
        out[:, len(names) :] = hist
        return out


def _span_counts(flags: np.ndarray, off: np.ndarray) -> np.ndarray:
    """[rows, fields]: per row ``off[i]:off[i + 1]``, how many of each field's ``flags`` are set."""
    cum = np.concatenate([np.zeros((len(flags), 1), np.int64), np.cumsum(flags, axis=1)], axis=1)
    return (cum[:, off[1:]] - cum[:, off[:-1]]).T


def _id_type(f: Field) -> pa.DataType:
    return pa.string() if f.ids == "str" else pa.int64()


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _value(f: Field, v: Any, path: str) -> Any:
    """``v`` checked as ``f`` says; ``RequestError`` names ``path`` and what was expected."""
    bad = lambda: RequestError(f"{path}: expected {f.expected()}, got {_show(v)}")
    if v is None:
        if f.kind == "id" and f.nullable:
            return None
        raise RequestError(f"{path}: missing; expected {f.expected()}")
    if f.kind in ("dense", "time"):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise bad()
        return v
    if f.kind == "vector":
        if not isinstance(v, list) or len(v) != f.size:
            raise bad()
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
                raise bad()
        return v
    if f.kind == "bag":
        if not isinstance(v, list) or len(v) > f.size:
            raise bad()
        one = Field(f.name, "id", f.ids, f.signed, f.nullable)
        return [_value(one, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if f.ids == "str":
        if not isinstance(v, str):
            raise bad()
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not -INT64 <= v < INT64 or (v < 0 and not f.signed):
        raise bad()
    return v
