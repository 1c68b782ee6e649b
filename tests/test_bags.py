"""Multi-valued categoricals: bag fields (a list column of ids per row) and multi-valued item side
features (an item's several genres), from the Parquet file to the tokens."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recformer.batch import DataError
from recformer.cli import cli_main
from recformer.config import BagField, CategoricalField, FeatureSpec, RankerConfig
from recformer.data.datamodule import RecDataModule
from recformer.evaluate import evaluate
from recformer.model import Ranker
from tests._model_batches import random_batch, random_item_tables, tiny_dims
from tests.conftest import N_ITEMS, write_tiny_data

INTERESTS = ["art", "books", "cars", "dogs", "eggs", "film"]
GENRES = ["comedy", "drama", "horror", "sci-fi"]


def bag_spec(spec: FeatureSpec) -> FeatureSpec:
    spec.bags = [
        BagField(name="interests", vocab=INTERESTS, max_values=3, pooling="mean"),
        BagField(name="tags", vocab_size=10, max_values=4, pooling="tokens"),
    ]
    spec.item.features = [*spec.item.features, CategoricalField(name="genres", vocab=GENRES, max_values=2)]
    return FeatureSpec(**{**spec.to_dict(), "path": None})  # validated again


def add_bags(table: pa.Table, seed: int) -> pa.Table:
    """``interests``: 0-5 strings (one unknown now and then, some rows null); ``tags``: 0-6 ids."""
    rng = np.random.default_rng(seed)
    interests, tags = [], []
    for i in range(table.num_rows):
        k = int(rng.integers(0, 6))
        words = [str(w) for w in rng.choice(INTERESTS + ["zebra"], k)]
        interests.append(None if i % 17 == 5 else words)
        tags.append(rng.integers(0, 12, int(rng.integers(0, 7))).astype(np.int32).tolist())
    return table.append_column("interests", pa.array(interests, pa.list_(pa.string()))).append_column(
        "tags", pa.array(tags, pa.list_(pa.int32()))
    )


@pytest.fixture(scope="module")
def bag_data(tmp_path_factory) -> Path:
    root = write_tiny_data(tmp_path_factory.mktemp("bags") / "data")
    bag_spec(FeatureSpec.load(root / "spec.yaml")).save(root / "spec.yaml")
    for i, part in enumerate(sorted(root.glob("*/*.parquet"))):
        pq.write_table(add_bags(pq.read_table(part), seed=i), part, row_group_size=64)
    items = pq.read_table(root / "items.parquet")
    genres = [[GENRES[(i + k) % 4] for k in range(i % 4)] for i in range(N_ITEMS)]  # 0-3 genres
    pq.write_table(
        items.append_column("genres", pa.array(genres, pa.list_(pa.string()))), root / "items.parquet"
    )
    return root


def test_bags_decode_to_their_first_values_with_unknowns_and_leftovers_counted(bag_data, caplog):
    dm = RecDataModule(str(bag_data), batch_size=512, num_workers=0, shuffle=False)
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    part = sorted((bag_data / "train").glob("*.parquet"))[0]
    raw = pq.read_table(part).slice(0, 300).to_pydict()
    batch = next(iter(dm.train_dataloader()))
    rows = {int(r): i for i, r in enumerate(batch.keys[:, 0])}
    index = {w: j + 1 for j, w in enumerate(INTERESTS)}  # row j + 1 holds vocabulary entry j
    unknown_interests = 0
    for r in range(300):
        got = batch.bag[rows[raw["row_id"][r]]].tolist()
        words = (raw["interests"][r] or [])[:3]
        want = [index.get(w, 0) for w in words] + [-1] * (3 - len(words))  # unknown -> OOV row 0
        assert got[:3] == want, r
        tags = raw["tags"][r][:4]
        assert got[3:] == [t + 1 if t < 10 else 0 for t in tags] + [-1] * (4 - len(tags)), r
        unknown_interests += sum(w not in index for w in words)
    oov = dict(zip(dm.oov_fields, batch.oov.tolist()))
    assert "interests" in oov and "tags" in oov
    # Values past max_values are said at set-up, with their count (split total, not silently).
    assert "values past max_values" in caplog.text and "'interests'" in caplog.text
    train = pa.concat_tables(pq.read_table(p) for p in sorted((bag_data / "train").glob("*.parquet")))
    lens = [len(x or []) for x in train["interests"].to_pylist()]
    assert f"'interests': {sum(max(0, n - 3) for n in lens)}" in caplog.text
    assert unknown_interests > 0


def test_a_multi_valued_item_feature_lands_in_the_item_table(bag_data):
    dm = RecDataModule(str(bag_data), num_workers=0)
    _, feats = dm.item_tables()
    genres = feats[:, 1:3]  # after the single-valued 'cluster'
    for i in range(N_ITEMS):
        want = [(i + k) % 4 + 1 for k in range(i % 4)][:2]
        assert genres[i + 1].tolist() == want + [-1] * (2 - len(want)), i
    assert genres[0].tolist() == [0, -1]  # the OOV item: one OOV value


def _ranker_with_bags(**kw) -> tuple[Ranker, torch.Tensor]:
    dims = tiny_dims()
    dims.bag_rows, dims.bag_values, dims.bag_pooling = [7, 11], [3, 4], ["mean", "tokens"]
    dims.item_feat_rows, dims.item_feat_values = [5, 4], [1, 2]
    torch.manual_seed(0)
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, **kw), dims).eval()
    ranker.set_item_tables(*random_item_tables(dims))
    with torch.no_grad():
        ranker.head.out.weight.normal_()  # zero at init: every logit would sit at the base rate
    return ranker, random_batch(dims, batch_size=8)


def test_a_pooled_bag_token_is_the_mean_of_its_values():
    ranker, batch = _ranker_with_bags()
    tok = ranker.tokens
    x_BTD, valid_BT = tok(batch)
    at = 1 + tok.n_cat + tok.dense_tokens + len(tok.emb_dims)  # the first bag token
    start = tok.table_groups["bag"][0]
    for b in range(len(batch)):
        ids = [v for v in batch.bag[b, :3].tolist() if v >= 0]
        want = tok.table.weight[[start + v for v in ids]].mean(0) if ids else torch.zeros(16)
        torch.testing.assert_close(x_BTD[b, at] - tok.slot_emb[at], want)
    # The 'tokens' bag: one token per value, absent ones masked out of attention.
    assert torch.equal(valid_BT[:, at + 1 : at + 5], batch.bag[:, 3:] >= 0)
    assert tok.n_tokens == x_BTD.shape[1] == valid_BT.shape[1]


def test_absent_bag_values_change_nothing():
    ranker, batch = _ranker_with_bags()
    base = ranker(batch)
    tok = ranker.tokens
    with torch.no_grad():
        tok.table.weight[tok.pad_row] += 100.0  # the padding row: never read
    torch.testing.assert_close(ranker(batch), base)
    batch.bag[0, 3:] = torch.tensor([2, 3, -1, -1])  # a value present now: the output moves
    assert (ranker(batch)[0] - base[0]).abs() > 1e-6


def test_a_bag_of_the_wrong_type_is_refused_naming_file_and_column(bag_data, tmp_path):
    import shutil

    shutil.copytree(bag_data, tmp_path / "d")
    part = sorted((tmp_path / "d" / "train").glob("*.parquet"))[0]
    t = pq.read_table(part)
    t = t.set_column(t.schema.get_field_index("tags"), "tags", pa.array([[0.5]] * t.num_rows))
    pq.write_table(t, part)
    with pytest.raises(
        DataError,
        match=rf"{part}: column 'tags' has type list<\w+: double>, expected list of integer \(a bag\)",
    ):
        RecDataModule(str(tmp_path / "d"), num_workers=0).setup("fit")


def test_a_bag_model_trains_evaluates_and_predicts_through_the_cli(bag_data, tmp_path):
    common = [f"--data.data_dir={bag_data}", "--data.num_workers=0", "--trainer.accelerator=cpu"]
    common += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    fit = cli_main(
        ["fit", *common, "--model.ranker.d_model=16", "--model.ranker.n_heads=2", "--data.batch_size=64"]
        + ["--model.optim.warmup_steps=2", "--trainer.max_epochs=1", "--trainer.logger=false"]
    )
    ckpt = Path(fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    r = evaluate(ckpt, bag_data, split="test", batch_size=32, num_workers=0)
    assert r["rows"] == 90 and 0 < r["logloss"] < 2 and r["unknown_ids"]["interests"] > 0
    cli_main(["predict", *common, f"--ckpt_path={ckpt}", f"--output={tmp_path / 'p.parquet'}"])
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 90


def test_a_context_categorical_with_several_values_is_pointed_to_bags():
    with pytest.raises(ValueError, match=r"a context list column is a bag \(list it under bags\)"):
        FeatureSpec(
            label="y",
            item={"column": "i", "vocab_size": 3},
            categorical=[{"name": "c", "vocab_size": 2, "max_values": 3}],
        )
