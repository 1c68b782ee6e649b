"""Raw ids through vocabularies fit on train (``recformer data vocab``), cold items that keep their
side features, and string key columns carried into predictions."""

from __future__ import annotations

import collections
import dataclasses
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from recformer.__main__ import main as recformer_main
from recformer.batch import DataError
from recformer.cli import cli_main
from recformer.config import FeatureSpec
from recformer.data.datamodule import RecDataModule
from recformer.evaluate import evaluate
from tests.conftest import N_ITEMS, write_tiny_data

SIDE_ONLY = 7
"""Items the side table holds beyond the tiny data's 50, which no log row mentions."""


def raw_item(i: int) -> str:
    return f"item-{i:03d}"


def raw_user(u: int) -> int:
    return u * 1_000_003 + 7  # sparse and large, as hashed ids are


def _raw_log(t: pa.Table) -> pa.Table:
    items = [raw_item(i) for i in t["item_id"].to_pylist()]
    hist = [[raw_item(i) for i in h] for h in t["hist_items"].to_pylist()]
    t = t.set_column(t.schema.get_field_index("item_id"), "item_id", pa.array(items))
    t = t.set_column(
        t.schema.get_field_index("hist_items"), "hist_items", pa.array(hist, pa.list_(pa.string()))
    )
    users = pa.array([raw_user(u) for u in t["user_id"].to_pylist()], pa.int64())
    return t.set_column(t.schema.get_field_index("user_id"), "user_id", users)


def write_raw_data(root: Path) -> Path:
    """The tiny data with raw ids: string item ids (the target, the history, the side table, a key),
    sparse integer user ids (the group, a key, and now a categorical), and a spec naming vocab files
    without sizes, as a user writes it before ``recformer data vocab``."""
    write_tiny_data(root)
    for part in sorted(root.glob("*/*.parquet")):
        pq.write_table(_raw_log(pq.read_table(part)), part, row_group_size=64)
    side = pq.read_table(root / "items.parquet").to_pydict()
    n = N_ITEMS + SIDE_ONLY
    content = side["content"] + [[0.5] * len(side["content"][0])] * SIDE_ONLY
    pq.write_table(
        pa.table(
            {
                "item_id": [raw_item(i) for i in range(n)],
                "content": pa.array(content, pa.list_(pa.float32())),
                "cluster": pa.array([i % 5 for i in range(n)], pa.int16()),
            }
        ),
        root / "items.parquet",
    )
    raw = yaml.safe_load((root / "spec.yaml").read_text())
    raw["item"].pop("vocab_size")
    raw["item"]["vocab_file"] = "vocab/item.parquet"
    raw["categorical"].append({"name": "user_id", "vocab_file": "vocab/user.parquet"})
    (root / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory) -> Path:
    root = write_raw_data(tmp_path_factory.mktemp("raw") / "data")
    assert recformer_main(["data", "vocab", str(root), "--min-count", "2"]) == 0
    return root


def _train_counts(root: Path) -> collections.Counter:
    train = pa.concat_tables(pq.read_table(p) for p in sorted((root / "train").glob("*.parquet")))
    counts = collections.Counter(train["item_id"].to_pylist())
    for h in train["hist_items"].to_pylist():
        counts.update(h)
    return counts


def test_the_item_vocabulary_is_the_train_items_by_count_then_the_cold_ones(raw_data):
    spec = FeatureSpec.load(raw_data / "spec.yaml")
    vocab = pq.read_table(raw_data / "vocab" / "item.parquet").to_pydict()
    counts = _train_counts(raw_data)
    kept = sorted((v for v, c in counts.items() if c >= 2), key=lambda v: (-counts[v], v))
    assert vocab["value"][: len(kept)] == kept and vocab["count"][: len(kept)] == [counts[v] for v in kept]
    cold = sorted({raw_item(i) for i in range(N_ITEMS + SIDE_ONLY)} - set(kept))
    assert vocab["value"][len(kept) :] == cold
    assert spec.item.vocab_size == len(kept) and spec.item.cold_items == len(cold) >= SIDE_ONLY
    assert spec.categorical[-1].vocab_size == len(pq.read_table(raw_data / "vocab" / "user.parquet"))


def test_raw_ids_map_through_the_vocabulary_and_cold_items_keep_their_side_rows(raw_data):
    dm = RecDataModule(str(raw_data), batch_size=1024, num_workers=0, shuffle=False)
    spec = dm.spec
    vocab = pq.read_table(raw_data / "vocab" / "item.parquet")["value"].to_pylist()
    row_of = {v: i + 1 for i, v in enumerate(vocab)}
    batch = next(iter(dm.test_dataloader()))
    test = pq.read_table(sorted((raw_data / "test").glob("*.parquet"))[0]).to_pydict()
    assert batch.target_item.tolist() == [row_of.get(v, 0) for v in test["item_id"]]
    content, feats = dm.item_tables()
    assert content.shape[0] == feats.shape[0] == spec.item.vocab_size + spec.item.cold_items + 1
    for v in vocab[spec.item.vocab_size :]:  # a cold item: its own side row, from the side table
        i = int(v.removeprefix("item-"))
        assert feats[row_of[v], 0] == i % 5 + 1
        if i >= N_ITEMS:
            assert torch.allclose(content[row_of[v]].float(), torch.full((8,), 0.5))


def test_a_cold_item_reads_the_oov_id_embedding_and_its_own_features(raw_data):
    from recformer.config import RankerConfig
    from recformer.model import Ranker

    dm = RecDataModule(str(raw_data), num_workers=0)
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2), dm.feature_dims)
    V = dm.spec.item.vocab_size
    rows = torch.tensor([[1, V, V + 1, V + 2]])
    assert ranker.tokens._item_embedding_rows(rows).tolist() == [[1, V, 0, 0]]
    # Every per-item id table does the same: the item bias and the popularity baseline's logit.
    from recformer.model import build_model

    biased = Ranker(RankerConfig(d_model=16, n_heads=2, item_bias=True), dm.feature_dims)
    popularity = build_model("popularity", RankerConfig(), dm.feature_dims)
    with torch.no_grad():
        biased.item_bias.weight[:, 0] = torch.arange(float(V + 1))
        popularity.item_logit.weight[:, 0] = torch.arange(float(V + 1))
    batch = next(iter(dm.test_dataloader())).to("cpu")
    batch = dataclasses.replace(batch, target_item=rows[0, : len(batch)].repeat(len(batch))[: len(batch)])
    want = torch.tensor([1.0, V, 0.0, 0.0]).repeat(len(batch))[: len(batch)]
    torch.testing.assert_close(popularity(batch) - popularity.bias, want)
    x_BTD, _ = biased.tokens(batch)
    torch.testing.assert_close(biased._beside(x_BTD, batch)[0], want)


def test_string_keys_come_back_in_the_predictions(raw_data, tmp_path):
    common = [f"--data.data_dir={raw_data}", "--data.num_workers=1", "--trainer.accelerator=cpu"]
    common += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    fit = cli_main(
        ["fit", *common, "--model.ranker.d_model=16", "--model.ranker.n_heads=2", "--data.batch_size=64"]
        + ["--model.optim.warmup_steps=2", "--trainer.max_epochs=1", "--trainer.logger=false"]
    )
    ckpt = Path(fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    cli_main(
        [
            "predict",
            *common,
            "--data.eval_batch_size=16",
            f"--ckpt_path={ckpt}",
            f"--output={tmp_path / 'p.parquet'}",
        ]
    )
    pred = pq.read_table(tmp_path / "p.parquet").to_pydict()
    test = pq.read_table(sorted((raw_data / "test").glob("*.parquet"))[0]).to_pydict()
    by_row = dict(zip(test["row_id"], zip(test["item_id"], test["user_id"])))
    assert sorted(pred["row_id"]) == sorted(test["row_id"])
    assert [(i, u) for i, u in zip(pred["item_id"], pred["user_id"])] == [by_row[r] for r in pred["row_id"]]
    r = evaluate(ckpt, raw_data, split="test", batch_size=32, num_workers=0)
    assert r["rows"] == 90 and r["unknown_ids"]["item_id"] >= 0


def test_a_checkpoint_refuses_data_whose_vocabulary_is_another(raw_data, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(raw_data, other)
    assert recformer_main(["data", "vocab", str(other), "--max-size", "30", "--refit"]) == 0
    a, b = RecDataModule(str(raw_data), num_workers=0), RecDataModule(str(other), num_workers=0)
    said = b.feature_dims.mismatch(a.feature_dims)
    assert said is not None and "item_id" in said and "vocabularies" in said
    # The same sizes in another order are refused too: what a row means is the vocabulary's order.
    t = pq.read_table(raw_data / "vocab" / "user.parquet")
    pq.write_table(t.take(list(range(len(t)))[::-1]), other / "vocab" / "user.parquet")
    shutil.copy(raw_data / "vocab" / "item.parquet", other / "vocab" / "item.parquet")
    shutil.copy(raw_data / "spec.yaml", other / "spec.yaml")
    said = RecDataModule(str(other), num_workers=0).feature_dims.mismatch(a.feature_dims)
    assert said is not None and "user_id" in said and "vocabularies" in said


def test_a_missing_or_resized_vocabulary_is_named(raw_data, tmp_path):
    data = tmp_path / "d"
    shutil.copytree(raw_data, data)
    (data / "vocab" / "user.parquet").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"user_id.vocab_file: vocabulary .*user.parquet does not exist; `recformer data vocab DIR`",
    ):
        RecDataModule(str(data), num_workers=0).setup("fit")
    shutil.copy(raw_data / "vocab" / "user.parquet", data / "vocab" / "user.parquet")
    t = pq.read_table(data / "vocab" / "user.parquet")
    pq.write_table(t.slice(1), data / "vocab" / "user.parquet")
    with pytest.raises(DataError, match=r"user.parquet holds \d+ values, the spec says \d+"):
        RecDataModule(str(data), num_workers=0).setup("fit")


def test_a_raw_column_of_the_other_kind_is_refused_naming_it(raw_data, tmp_path):
    data = tmp_path / "d"
    shutil.copytree(raw_data, data)
    part = sorted((data / "train").glob("*.parquet"))[0]
    t = pq.read_table(part)
    ints = pa.array([[7] * len(h) for h in t["hist_items"].to_pylist()], pa.list_(pa.int64()))
    pq.write_table(t.set_column(t.schema.get_field_index("hist_items"), "hist_items", ints), part)
    said = rf"{part}.*column 'hist_items' holds int64 values, its vocabulary holds strings"
    with pytest.raises(DataError, match=said):
        RecDataModule(str(data), num_workers=0).setup("fit")


def test_data_summary_reads_the_vocabularies(raw_data, tmp_path, capsys):
    assert recformer_main(["data", "summary", str(raw_data)]) == 0
    out = capsys.readouterr().out
    assert "vocab  user_id:" in out and "vocab  item_id:" in out and "cold (side features only)" in out
    data = tmp_path / "d"
    shutil.copytree(raw_data, data)
    (data / "vocab" / "item.parquet").unlink()
    assert recformer_main(["data", "summary", str(data)]) == 2
    assert "item.vocab_file: vocabulary" in capsys.readouterr().err
