"""The streaming DataModule: sharding, equal batch counts, reshuffling, exact resume, decoding."""

from __future__ import annotations

import dataclasses
import errno
import math
import shutil
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from recformer.batch import DataError
from recformer.config import CategoricalField, FeatureSpec
from recformer.data import dataset
from recformer.data.datamodule import RecDataLoader, RecDataModule
from recformer.data.dataset import ParquetStream, StreamPlan
from recformer.data.shards import pieces_for, round_robin_resume
from tests.conftest import N_USERS, write_tiny_data

TRAIN_ROWS = 300 + 170 + 45


def make_stream(dm: RecDataModule, split: str, train: bool, rank: int, world: int, bs: int) -> ParquetStream:
    dm.setup()
    return ParquetStream(
        dm.splits[split],
        dm.spec,
        batch_size=bs,
        train=train,
        shuffle=True,
        seed=3,
        window=96,
        plan=StreamPlan(rank=rank, world=world),
    )


def row_ids(loader) -> list[int]:
    return [int(r) for b in loader for r in b.keys[:, 0]]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_eval_shards_disjoint_and_complete(tiny_data, world, workers):
    dm = RecDataModule(str(tiny_data), num_workers=workers, validate="footer")
    seen = []
    for rank in range(world):
        s = make_stream(dm, "train", train=False, rank=rank, world=world, bs=32)
        s.plan.num_workers = max(1, workers)
        seen += row_ids(RecDataLoader(s, num_workers=workers))
    assert sorted(seen) == list(range(TRAIN_ROWS))  # every row exactly once across ranks and workers


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_train_ranks_get_equal_batches_and_cover_all_rows(tiny_data, world, workers):
    dm = RecDataModule(str(tiny_data), num_workers=workers, validate="footer")
    per_rank_batches, seen = [], []
    for rank in range(world):
        s = make_stream(dm, "train", train=True, rank=rank, world=world, bs=32)
        loader = RecDataLoader(s, num_workers=workers)
        batches = list(loader)
        assert len(batches) == len(loader)
        per_rank_batches.append(len(batches))
        seen += [int(r) for b in batches for r in b.keys[:, 0]]
    assert len(set(per_rank_batches)) == 1, per_rank_batches
    assert set(seen) == set(range(TRAIN_ROWS))
    # Padding repeats at most world - 1 rows, each once.
    assert len(seen) == math.ceil(TRAIN_ROWS / world) * world
    assert max(Counter(seen).values()) <= 2


def test_reshuffles_per_epoch_and_is_reproducible(tiny_data):
    dm = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, shuffle_window=96, seed=5)
    loader = dm.train_dataloader()  # no trainer: epoch counts iterations
    e0, e1 = row_ids(loader), row_ids(loader)
    assert sorted(e0) == sorted(e1) == list(range(TRAIN_ROWS))
    assert e0 != e1
    again = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, shuffle_window=96, seed=5)
    assert row_ids(again.train_dataloader()) == e0
    other_seed = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, shuffle_window=96, seed=6)
    assert row_ids(other_seed.train_dataloader()) != e0


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("consumed", [0, 1, 4, 7, 13, 15])
def test_resume_mid_epoch_is_exact(tiny_data, workers, consumed):
    make = lambda: RecDataModule(
        str(tiny_data), batch_size=32, num_workers=workers, shuffle_window=96, validate="footer"
    )
    ref = [b.keys[:, 0].tolist() for b in make().train_dataloader()]
    assert len(ref) == 17  # ceil(515 / 32): three workers get unequal blocks
    loader = make().train_dataloader()
    it = iter(loader)
    head = [next(it).keys[:, 0].tolist() for _ in range(consumed)]
    state = loader.resume_state()
    del it
    resumed = make().train_dataloader()
    resumed.load_resume_state(state)
    tail = [b.keys[:, 0].tolist() for b in resumed]
    assert head + tail == ref


@pytest.mark.parametrize(
    "change, key",
    [
        ({"batch_size": 16}, "batch_size"),
        ({"shuffle": False}, "shuffle"),
        ({"drop_last": True}, "drop_last"),
        ({"group_rows": 4}, "group_rows"),
    ],
)
def test_resume_refuses_a_different_setup(tiny_data, change, key):
    a = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, validate="footer").train_dataloader()
    b = RecDataModule(
        str(tiny_data), **{"batch_size": 32, "num_workers": 0, "validate": "footer", **change}
    ).train_dataloader()
    with pytest.raises(ValueError, match=key):
        b.load_resume_state(a.resume_state())


def test_resume_refuses_other_files_of_the_same_size(tiny_data, tmp_path):
    """The same rows written in other row groups give another batch sequence: refused. A state
    saved before ``groups`` (and the other newer keys) were recorded still resumes."""
    other = tmp_path / "other"
    shutil.copytree(tiny_data, other)
    for f in sorted((other / "train").glob("*.parquet")):
        pq.write_table(pq.read_table(f), f, row_group_size=7)
    make = lambda d: RecDataModule(str(d), batch_size=32, num_workers=0, validate="footer").train_dataloader()
    state = make(tiny_data).resume_state()
    with pytest.raises(ValueError, match="groups"):
        make(other).load_resume_state(state)
    old = {k: v for k, v in state.items() if k not in ("groups", "shuffle", "drop_last", "epoch_batches")}
    make(tiny_data).load_resume_state(old)


def test_partitioned_split_folders_are_read_whole(tiny_data, tmp_path, caplog):
    """Logs partitioned into sub-folders (``train/date=.../part.parquet``) are all read; hidden and
    bookkeeping files (``.crc``, ``_SUCCESS``, ``_temporary/``) are skipped; any other file is named
    in a warning rather than skipped silently."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data, ignore=shutil.ignore_patterns("train"))
    files = sorted((tiny_data / "train").glob("*.parquet"))
    for k, f in enumerate(files):
        (data / "train" / f"date=2026-01-0{k + 1}").mkdir(parents=True)
        shutil.copy(f, data / "train" / f"date=2026-01-0{k + 1}" / f.name)
    (data / "train" / "_SUCCESS").touch()
    (data / "train" / "_temporary").mkdir()
    shutil.copy(files[0], data / "train" / "_temporary" / "half-written.parquet")
    (data / "train" / ".part.parquet.crc").touch()
    (data / "train" / "notes.txt").write_text("not data")

    def rows(d):
        dm = RecDataModule(str(d), batch_size=64, num_workers=0, shuffle=False, validate="footer")
        return sorted(r for b in dm.train_dataloader() for r in b.keys[:, 0].tolist())

    with caplog.at_level("WARNING", logger="recformer.data.shards"):
        assert rows(data) == rows(tiny_data)
    assert "notes.txt" in caplog.text and "_SUCCESS" not in caplog.text


def test_round_robin_replay_matches_dataloader_order():
    # Worker blocks of 3, 2, 2 batches: round robin 0,1,2,0,1,2,0.
    taken, order = round_robin_resume([3, 2, 2], 5)
    assert taken == [2, 2, 1] and order == [2, 0]
    taken, order = round_robin_resume([3, 2, 2], 6)
    assert taken == [2, 2, 2] and order == [0]
    with pytest.raises(ValueError):
        round_robin_resume([1, 1], 3)


def test_pieces_wrap_around_row_groups(tiny_data):
    dm = RecDataModule(str(tiny_data), validate="footer")
    dm.setup("fit")
    groups = dm.splits["train"].groups
    pieces = pieces_for(groups, TRAIN_ROWS - 10, TRAIN_ROWS + 70)
    assert sum(p.stop - p.start for p in pieces) == 80
    assert pieces[0].group == groups[-1] and pieces[1].group == groups[0] and pieces[1].start == 0


def test_decoded_history_matches_reference(tiny_data):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, shuffle=False, validate="footer")
    dm.setup("fit")
    L = dm.spec.sequence.max_len
    table = pq.read_table(tiny_data / "train" / "part-00000.parquet").to_pylist()
    by_id = {r["row_id"]: r for r in table}
    batch = next(iter(dm.val_dataloader()))
    for split_file in [tiny_data / "val" / "part-00000.parquet"]:
        by_id.update({r["row_id"]: r for r in pq.read_table(split_file).to_pylist()})
    for i in range(len(batch)):
        r = by_id[int(batch.keys[i, 0])]
        items, acts, gaps = r["hist_items"][-L:], r["hist_actions"][-L:], r["hist_gaps"][-L:]
        pad = L - len(items)
        assert batch.hist_mask[i].tolist() == [False] * pad + [True] * len(items)
        assert batch.hist_item[i].tolist() == [0] * pad + [x + 1 for x in items]
        assert batch.hist_cat[i, :, 0].tolist() == [0] * pad + [a + 1 for a in acts]
        want_gap = [0] * pad + [min(int(np.floor(np.log2(1 + g / 60.0))), 7) + 1 for g in gaps]
        assert batch.hist_gap[i].tolist() == want_gap
        assert int(batch.target_item[i]) == r["item_id"] + 1
        assert int(batch.cat[i, 1]) == ["ios", "android", "web"].index(r["device"]) + 1
        expect_act = np.sign(r["activity"]) * np.log1p(abs(r["activity"]))
        assert float(batch.dense[i, 0]) == pytest.approx((expect_act - 1.0) / 2.0, rel=1e-5)
        assert batch.emb[i].tolist() == pytest.approx(r["query_vec"])


def test_item_tables_follow_the_side_table(tiny_data):
    dm = RecDataModule(str(tiny_data), validate="footer")
    content, feats = dm.item_tables()
    side = pq.read_table(tiny_data / "items.parquet").to_pydict()
    assert content.shape == (51, 8) and content.dtype == torch.float16
    assert torch.all(content[0] == 0) and feats[0, 0] == 0  # OOV row
    assert content[1 + 7].tolist() == pytest.approx(side["content"][7], abs=1e-3)
    assert feats[1 + 7, 0] == side["cluster"][7] + 1


def test_batch_to_copies_compact_and_widens_after_the_copy(tiny_data, monkeypatch):
    """The host-to-device copy keeps the shipped dtypes: asked for a dtype, PyTorch widens on the
    host into unpinned memory and the pinned, asynchronous copy is lost (not observable without a
    GPU, hence the spy)."""
    dm = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, validate="footer")
    raw = next(iter(dm.train_dataloader()))
    calls = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((self.dtype, args, kwargs))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    moved = raw.to("cpu", non_blocking=True)
    monkeypatch.undo()
    copies = [c for c in calls if c[1] and c[1][0] == "cpu"]
    assert len(copies) == len(raw.tensors())
    assert all(
        "dtype" not in kw and len(args) == 1 and kw == {"non_blocking": True} for _, args, kw in copies
    )
    assert moved.hist_item.dtype == torch.long and torch.equal(moved.hist_item, raw.hist_item.long())


def test_batch_to_widens_the_compact_id_fields(tiny_data):
    from recformer.batch import ID_FIELDS

    dm = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, validate="footer")
    raw = next(iter(dm.train_dataloader()))
    assert raw.hist_gap.dtype == torch.uint8  # shipped compact
    assert raw.hist_cat.dtype == torch.int8  # hist_actions has 4 rows
    assert raw.hist_item.dtype == torch.int16  # 50 items
    moved = raw.to("cpu")
    for name in ID_FIELDS:
        assert getattr(moved, name).dtype == torch.long, name
        assert torch.equal(getattr(moved, name), getattr(raw, name).long()), name
    assert moved.label.dtype == torch.float32 and moved.hist_mask.dtype == torch.bool


def test_open_files_stay_under_the_cap_with_the_same_batches(tiny_data, monkeypatch):
    """Row groups come shuffled across the three train files; with a cap of two open files the
    reader closes the least recently read one and reopens it later, and the batches are unchanged."""
    dm = RecDataModule(str(tiny_data), validate="footer")
    free = [b.keys[:, 0].tolist() for b in RecDataLoader(make_stream(dm, "train", True, 0, 1, 32))]
    monkeypatch.setattr(dataset, "open_file_cap", lambda: 2)
    s = make_stream(dm, "train", True, 0, 1, 32)
    opened, most = Counter(), 0
    real_open = dataset.pq.ParquetFile

    def counting_open(path, *args, **kwargs):
        opened[path] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(dataset.pq, "ParquetFile", counting_open)
    capped = []
    for data, idx in s.worker_batches(0, 1):
        most = max(most, len(s._files))
        capped.append(data.gather(idx).keys[:, 0].tolist())
    assert capped == free
    assert most == 2 and sum(opened.values()) > len(opened) == 3  # some file was closed and reopened


def test_running_out_of_file_descriptors_is_not_called_corruption(tiny_data, monkeypatch):
    dm = RecDataModule(str(tiny_data), validate="footer")
    s = make_stream(dm, "train", True, 0, 1, 32)

    def no_fds(path, *args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(dataset.pq, "ParquetFile", no_fds)
    where = r"part-\d+\.parquet \(row group \d+\)"
    with pytest.raises(DataError, match=where + r".*run out of file descriptors.*ulimit"):
        next(s.worker_batches(0, 1))


def test_the_group_column_can_also_be_a_categorical_feature(tmp_path):
    """The user id as GAUC group and as a feature: one column, read once, in both roles."""
    root = write_tiny_data(tmp_path / "d", train_files=(100,), val_rows=20, test_rows=20)
    spec = FeatureSpec.load(root / "spec.yaml")
    spec.categorical.append(CategoricalField(name="user_id", vocab_size=N_USERS))
    spec.save(root / "spec.yaml")
    assert spec.columns().count("user_id") == 1
    dm = RecDataModule(str(root), batch_size=16, num_workers=0)
    dm.setup("test")
    b = next(iter(dm.test_dataloader()))
    users = pq.read_table(root / "test", columns=["user_id"])["user_id"].to_numpy()[:16]
    assert b.group.tolist() == users.tolist()
    assert b.cat[:, -1].tolist() == (users + 1).tolist()  # table rows: 0 is the OOV row


@pytest.mark.parametrize("k", [1, 3, 8, 1000])
def test_grouped_permutation_keeps_each_groups_rows_in_chunks_of_k(k):
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 12, size=500)
    perm = rng.permutation(500)
    out = dataset.grouped_permutation(perm, groups, k, np.random.default_rng(1))
    assert sorted(out.tolist()) == list(range(500))  # every row once
    # per group: its rows in perm's order, cut k at a time, each cut consecutive in the output
    where = {r: i for i, r in enumerate(out.tolist())}
    for grp in range(12):
        mine = [r for r in perm if groups[r] == grp]
        chunks = [mine[i : i + k] for i in range(0, len(mine), k)]
        for chunk in chunks:
            at = [where[r] for r in chunk]
            assert at == list(range(at[0], at[0] + len(chunk)))  # consecutive, in perm's order
    g = groups[out]
    runs = 1 + int((g[1:] != g[:-1]).sum())  # maximal runs of one group
    if k >= 500:  # one chunk per group: each group's rows are contiguous
        assert runs == len(set(groups.tolist()))
    else:  # chunks in random order: a group's chunks are not all side by side
        assert runs > len(set(groups.tolist()))


@pytest.mark.parametrize("k", [1, 4, 16])
def test_grouped_permutation_in_log_order_cuts_each_groups_consecutive_rows(k):
    """With positions, a chunk is k rows adjacent in the log, in log order, cut at a random phase
    per group (the function's first draw), each chunk consecutive in the output."""
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 5, size=300)
    position = rng.permutation(300) * 7  # any order of the rows in the log
    perm = rng.permutation(300)
    sizes = set()
    for seed in range(4):
        out = dataset.grouped_permutation(perm, groups, k, np.random.default_rng(seed), position)
        assert sorted(out.tolist()) == list(range(300))  # every row once
        where = {r: i for i, r in enumerate(out.tolist())}
        phase = np.random.default_rng(seed).integers(0, k, 5)  # groups in sorted order: 0..4
        for grp in range(5):
            in_log = sorted((r for r in range(300) if groups[r] == grp), key=lambda r: position[r])
            chunk = [(i + phase[grp]) // k for i in range(len(in_log))]
            for c in set(chunk):
                rows = [r for r, ci in zip(in_log, chunk) if ci == c]
                at = [where[r] for r in rows]
                assert at == list(range(at[0], at[0] + len(rows))), (seed, grp, c)
            sizes.add(chunk.count(0))
    assert k == 1 or len(sizes) > 1  # the first chunk's size moves with the phase


def test_group_rows_gives_batches_of_same_user_runs_and_every_row_once(tiny_data):
    def rows_and_users(group_rows):
        dm = RecDataModule(
            str(tiny_data), batch_size=32, num_workers=0, validate="footer", group_rows=group_rows
        )
        batches = list(dm.train_dataloader())
        ids = [int(r) for b in batches for r in b.keys[:, 0]]
        users = [b.group.tolist() for b in batches]
        return ids, users

    plain_ids, plain_users = rows_and_users(0)
    ids, users = rows_and_users(4)
    assert sorted(ids) == sorted(plain_ids) and len(ids) == TRAIN_ROWS
    same = lambda batches: sum(sum(a == b for a, b in zip(u, u[1:])) for u in batches)
    assert same(users) > 2 * same(plain_users)  # neighbours share a user far more often


def test_group_rows_needs_a_group_column(tiny_data, tmp_path):
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    dm = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, validate="footer")
    dm.setup("fit")
    with pytest.raises(ValueError, match="names no group column"):
        ParquetStream(dm.splits["train"], dataclasses.replace(spec, group=None), 32, True, group_rows=4)
