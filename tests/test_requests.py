"""The request encoder (recformer.data.requests): raw requests become exactly the tensors the loader
makes for the same rows, unknown ids are counted where they were given, and every bad request is
one line naming the field and what was expected."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recformer.batch import DataError
from recformer.config import FeatureSpec
from recformer.data.datamodule import RecDataModule
from recformer.data.encode import GAP_UNIT_S, Encoder
from recformer.data.requests import RequestEncoder, RequestError
from recformer.export import INPUTS
from recformer.serve.replay import log_requests


def _loader_batch(data, rows: int = 4096):
    dm = RecDataModule(str(data), eval_batch_size=rows, num_workers=0, predict_split="test")
    dm.setup("predict")
    return next(iter(dm.predict_dataloader())).to("cpu")


def _test_table(data) -> pa.Table:
    return pq.read_table(sorted((data / "test").glob("*.parquet")))


def _assert_same_inputs(got, want, rows=None):
    for name in INPUTS:
        a, b = getattr(got, name), getattr(want, name)
        b = b if rows is None else b[rows]
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), name


def test_requests_of_every_test_row_encode_to_the_loaders_tensors(tiny_data):
    """One request per row (every feature in context), then the same rows as multi-candidate requests
    (features that differ go per candidate): both give the loader's inputs, bit for bit."""
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    table = _test_table(tiny_data)
    want = _loader_batch(tiny_data)
    enc = RequestEncoder(spec)
    pairs = list(log_requests(table, spec, max_candidates=1))
    got = enc([json.loads(json.dumps(r)) for r, _ in pairs])  # through JSON, as a server receives them
    assert len(got.spans) == table.num_rows
    _assert_same_inputs(got.batch.to("cpu"), want)
    # The same rows grouped: a user's consecutive rows with one history are one request. Grouping by
    # user alone here (the tiny log's rows have different histories): regroup by hand.
    requests, order = [], []
    for start in range(0, table.num_rows, 7):
        rows = list(range(start, min(start + 7, table.num_rows)))
        base = copy.deepcopy(pairs[rows[0]][0])
        base["candidates"] = [pairs[r][0]["candidates"][0] | pairs[r][0]["context"] for r in rows]
        base["context"] = {}
        requests.append(base)
        order += [rows[0]] * len(rows)  # every candidate carries the first row's history
    got = enc(requests)
    assert [b - a for a, b in got.spans] == [
        len(range(s, min(s + 7, table.num_rows))) for s in range(0, 90, 7)
    ]
    row_batch = _loader_batch(tiny_data).to("cpu")
    for name in ("target_item", "cat", "dense", "emb"):
        assert torch.equal(
            getattr(got.batch, name).to(getattr(row_batch, name).dtype), getattr(row_batch, name)
        )
    for name in ("hist_item", "hist_cat", "hist_gap", "hist_mask"):
        assert torch.equal(getattr(got.batch.to("cpu"), name), getattr(row_batch, name)[order]), name


def test_unknown_ids_are_counted_where_given_and_go_to_the_oov_row(tiny_data):
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    enc = RequestEncoder(spec)
    request = {
        "timestamp": 1000,
        "context": {"hour": 99, "device": "tv", "activity": 3.0, "age": 0.5, "query_vec": [0, 0, 0, 1]},
        "history": [
            {"item": 3, "hist_actions": 1, "timestamp": 990},
            {"item": 10**6, "hist_actions": 7, "timestamp": 999},
        ],
        "candidates": [{"item": 1}, {"item": 10**7}, {"item": 10**8}],
    }
    out = enc([request])
    counts = dict(zip(enc.oov_names, out.unknown[0].tolist()))
    # The context's unknown hour and device count once, not once per candidate.
    assert counts == {
        "item": 2,
        "hour": 1,
        "device": 1,
        "history.item": 1,
        "history.hist_actions": 1,
    }
    b = out.batch
    assert b.target_item.tolist() == [2, 0, 0] and (b.cat[:, 0] == 0).all() and (b.cat[:, 1] == 0).all()
    assert b.hist_item[0, -2:].tolist() == [4, 0] and b.hist_mask[0].sum() == 2
    # Gaps 10 s and 1 s, bucketed with the 60 s unit: floor(log2(1 + gap / 60)) + 1 = 1.
    assert b.hist_gap[0, -2:].tolist() == [1, 1] and GAP_UNIT_S == 60.0


def test_the_gap_unit_is_the_encoders_setting(tiny_data):
    """A gap of 3600 s is bucket 6 in minutes (log2(61) = 5.9), bucket 12 in seconds (log2(3601))."""
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    req = {
        "timestamp": 3600,
        "context": {"hour": 1, "device": "ios", "activity": 3.0, "age": 0.5, "query_vec": [0, 0, 0, 1]},
        "history": [{"item": 3, "hist_actions": 1, "timestamp": 0}],
        "candidates": [{"item": 1}],
    }
    assert RequestEncoder(spec)([req]).batch.hist_gap[0, -1].item() == 6
    assert RequestEncoder(spec, gap_unit_s=1.0)([req]).batch.hist_gap[0, -1].item() == 8  # 8 buckets: clipped
    assert Encoder(spec, gap_unit_s=1.0).gap_unit_s == 1.0


GOOD = {
    "timestamp": 1000,
    "context": {"hour": 3, "device": "ios", "activity": 3.0, "age": 0.5, "query_vec": [0, 0, 0, 1]},
    "history": [{"item": 3, "hist_actions": 1, "timestamp": 990}],
    "candidates": [{"item": 1}, {"item": 2}],
}


def _bad(path: str, value) -> dict:
    """GOOD with ``path`` (dotted, list indices as ints) set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(GOOD)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = out
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out


BAD = [
    (_bad("candidates", ...), "candidates: missing; expected a list of objects"),
    (_bad("candidates", []), "candidates: expected a non-empty list"),
    (_bad("candidates.0.item", ...), "candidates[0].item: missing; expected an integer >= 0 id"),
    (_bad("candidates.1.item", "abc"), "candidates[1].item: expected an integer >= 0 id, got 'abc'"),
    (_bad("candidates.1.item", -3), "candidates[1].item: expected an integer >= 0 id, got -3"),
    (_bad("candidates.1.item", True), "candidates[1].item: expected an integer >= 0 id, got True"),
    (_bad("candidates.1.item", 2**70), "candidates[1].item: expected an integer >= 0 id"),
    (
        _bad("context.activity", ...),
        "context.activity: missing; expected a finite number, in context or in every",
    ),
    (
        _bad("context.activity", ...) | {"candidates": [{"item": 1, "activity": 2.0}, {"item": 2}]},
        "candidates[1].activity: missing; expected a finite number",
    ),
    (_bad("context.activity", float("nan")), "context.activity: expected a finite number, got nan"),
    (_bad("context.activity", float("inf")), "context.activity: expected a finite number, got inf"),
    (_bad("context.activity", "3"), "context.activity: expected a finite number, got '3'"),
    (_bad("context.device", 1), "context.device: expected a string id or null, got 1"),
    (_bad("context.query_vec", [0, 1]), "context.query_vec: expected a list of 4 finite numbers"),
    (_bad("context.colour", "red"), "context.colour: not a feature of this model"),
    (_bad("candidates.0.hour", 3), "candidates[0].hour: also given in context; give it once"),
    (_bad("history", [GOOD["history"][0]] * 7), "history: 7 events; the model reads at most 6"),
    (_bad("history", ...), "history: missing; expected a list of the user's events"),
    (_bad("history.0.timestamp", 2000), "history[0].timestamp: 2000 is after the request's timestamp 1000"),
    (_bad("history.0.hist_actions", None), "history[0].hist_actions: missing; expected an integer >= 0 id"),
    (_bad("history.0.mood", 1), "history[0].mood: not a field of an event"),
    (_bad("timestamp", ...), "timestamp: missing; expected Unix seconds"),
    (_bad("extra", 1), "extra: not a field of this model's requests"),
    ([1, 2], "body: expected a JSON object"),
]


@pytest.mark.parametrize(
    "request_, message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)]
)
def test_a_bad_request_is_one_line_naming_the_field(tiny_data, request_, message):
    enc = RequestEncoder(FeatureSpec.load(tiny_data / "spec.yaml"), max_candidates=5)
    enc([GOOD])  # the good request encodes
    with pytest.raises(RequestError) as e:
        enc([request_])
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_too_many_candidates_names_the_setting(tiny_data):
    enc = RequestEncoder(FeatureSpec.load(tiny_data / "spec.yaml"), max_candidates=5)
    with pytest.raises(
        RequestError, match=r"candidates: 6 given; this server scores at most 5 .*--max-candidates"
    ):
        enc([_bad("candidates", [{"item": 1}] * 6)])


def test_a_value_only_the_encoder_can_judge_is_a_data_error_naming_the_column(tiny_data):
    """activity = 1e38 passes the request's checks; log1p and standardising keep it finite, but age =
    1e39 overflows float32 (the model's dtype): the encoder says which column."""
    enc = RequestEncoder(FeatureSpec.load(tiny_data / "spec.yaml"))
    age = r"request: column 'age' after normalisation has values beyond float32"
    with pytest.raises(DataError, match=age):
        enc([_bad("context.age", 1e39)])
    assert np.isfinite(enc([_bad("context.activity", 1e38)]).batch.dense.numpy()).all()


def test_the_example_request_is_valid_and_names_every_feature(tiny_data):
    enc = RequestEncoder(FeatureSpec.load(tiny_data / "spec.yaml"))
    example = enc.example()
    assert set(example["context"]) == {"hour", "device", "activity", "age", "query_vec"}
    assert example["context"]["device"] == "ios" and example["history"][0]["timestamp"] < example["timestamp"]
    out = enc([example])
    assert out.batch.target_item.tolist() == [1] and out.unknown.sum() == 0
