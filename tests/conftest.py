"""Shared fixtures: tiny Parquet logs in the project's contract, written in milliseconds."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recformer.config import (
    CategoricalField,
    DenseField,
    EmbeddingField,
    FeatureSpec,
    ItemSpec,
    SequenceSpec,
)

os.environ.setdefault("WANDB_MODE", "disabled")


def load_bench(name: str):
    """The script ``bench/<name>.py`` as a module (bench/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


N_ITEMS = 50
N_USERS = 20
MAX_LEN = 6
CONTENT_DIM = 8


def tiny_spec(max_len: int = MAX_LEN) -> FeatureSpec:
    return FeatureSpec(
        label="label",
        weight="weight",
        group="user_id",
        keys=["row_id", "user_id", "item_id"],
        item=ItemSpec(
            column="item_id",
            vocab_size=N_ITEMS,
            side_table="items.parquet",
            content_column="content",
            content_dim=CONTENT_DIM,
            features=[CategoricalField(name="cluster", vocab_size=5)],
        ),
        categorical=[
            CategoricalField(name="hour", vocab_size=24),
            CategoricalField(name="device", vocab=["ios", "android", "web"]),
        ],
        dense=[DenseField(name="activity", mean=1.0, std=2.0, log1p=True), DenseField(name="age")],
        embedding=[EmbeddingField(name="query_vec", dim=4)],
        sequence=SequenceSpec(
            item_column="hist_items",
            max_len=max_len,
            categorical=[CategoricalField(name="hist_actions", vocab_size=3)],
            time_gap_column="hist_gaps",
            time_gap_buckets=8,
        ),
    )


def required_list(t: pa.DataType) -> pa.DataType:
    """A list column's type as the log writers store it: no nulls, and saying so (``schema.required``)."""
    return pa.list_(pa.field("element", t, nullable=False))


def log_table(rows: int, first_row: int, seed: int, max_hist: int = 10) -> pa.Table:
    """``rows`` impressions; ``row_id`` runs from ``first_row`` so coverage can be checked."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, max_hist + 1, rows)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(offsets[-1])
    hist_items = rng.integers(0, N_ITEMS, total).astype(np.int32)
    lst = lambda vals: pa.ListArray.from_arrays(pa.array(offsets), pa.array(vals))
    q = rng.normal(size=(rows, 4)).astype(np.float32)
    return pa.table(
        {
            "row_id": np.arange(first_row, first_row + rows, dtype=np.int64),
            "user_id": rng.integers(0, N_USERS, rows).astype(np.int64),
            "item_id": rng.integers(0, N_ITEMS, rows).astype(np.int32),
            "label": (rng.random(rows) < 0.4).astype(np.int8),
            "weight": np.ones(rows, np.float32),
            "hour": rng.integers(0, 24, rows).astype(np.int8),
            "device": pa.array(rng.choice(["ios", "android", "web"], rows)),
            "activity": rng.exponential(5.0, rows).astype(np.float32),
            "age": rng.normal(size=rows).astype(np.float32),
            "query_vec": pa.FixedSizeListArray.from_arrays(pa.array(q.ravel()), 4),
            "hist_items": lst(hist_items),
            "hist_actions": lst(rng.integers(0, 3, total).astype(np.int8)),
            "hist_gaps": lst(rng.exponential(3600.0, total).astype(np.float32)),
        }
    )


def write_tiny_data(root: Path, train_files=(300, 170, 45), val_rows=120, test_rows=90, row_group=64) -> Path:
    """A data dir with uneven train files (several row groups each), val, test, items, spec."""
    root.mkdir(parents=True, exist_ok=True)
    spec = tiny_spec()
    spec.save(root / "spec.yaml")
    rng = np.random.default_rng(0)
    content = rng.normal(size=(N_ITEMS, CONTENT_DIM)).astype(np.float16)
    pq.write_table(
        pa.table(
            {
                "item_id": np.arange(N_ITEMS, dtype=np.int32),
                "content": pa.FixedSizeListArray.from_arrays(pa.array(content.ravel()), CONTENT_DIM),
                "cluster": (np.arange(N_ITEMS) % 5).astype(np.int16),
            }
        ),
        root / "items.parquet",
    )
    row = 0
    for split, sizes in (("train", train_files), ("val", (val_rows,)), ("test", (test_rows,))):
        (root / split).mkdir(exist_ok=True)
        for i, n in enumerate(sizes):
            pq.write_table(
                log_table(n, row, seed=row + 1),
                root / split / f"part-{i:05d}.parquet",
                row_group_size=row_group,
            )
            row += n
    return root


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return write_tiny_data(tmp_path_factory.mktemp("tiny") / "data")


@pytest.fixture(autouse=True)
def _no_run_folder_in_the_working_tree(request):
    """A test that fits, validates or predicts must write its run folder under its own tmp path:
    the loggers' ``save_dir`` (``runs``) is relative to the working directory, and a folder left in
    the checkout's ``runs/recformer`` is what ``make demo`` then takes for its newest run."""
    runs = Path.cwd() / "runs" / "recformer"
    before = set(runs.glob("version_*"))
    yield
    # Only this process's folders (its pid in the writer lock): a demo run beside the tests is not one.
    ours = [p for p in set(runs.glob("version_*")) - before if _writer_pid(p) == os.getpid()]
    assert not ours, (
        f"{request.node.nodeid} wrote {sorted(p.name for p in ours)} into {runs}: chdir to tmp_path first"
    )


def _writer_pid(run: Path) -> int | None:
    try:
        return int(json.loads((run / ".writer.lock").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
