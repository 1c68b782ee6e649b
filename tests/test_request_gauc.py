"""bench/request_gauc.py: each user's rows scored at the request side of the user's first row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tests._model_batches import random_batch, tiny_dims
from tests.conftest import load_bench

ROOT = Path(__file__).resolve().parents[1]


def test_the_anchor_is_the_users_earliest_row_then_the_first_in_file_order():
    rg = load_bench("request_gauc")
    batch = random_batch(tiny_dims(), batch_size=5)
    keys = torch.tensor([[5], [3], [1], [3], [0]])
    batch = type(batch)(**{**batch.__dict__, "group": torch.tensor([1, 1, 2, 1, 2]), "keys": keys})
    assert rg.anchors(batch, 0).tolist() == [1, 1, 4, 1, 4]
    assert rg.anchors(batch, None).tolist() == [0, 0, 2, 0, 2]  # no time key: file order


def test_the_request_side_is_copied_and_the_candidate_side_kept():
    rg = load_bench("request_gauc")
    batch = random_batch(tiny_dims(), batch_size=4, empty_history=0)
    first = np.array([0, 0, 2, 2])
    fixed = rg.at_request(batch, first, [0])
    for name in ("cat", "hist_item", "hist_cat", "hist_gap", "hist_mask"):
        assert torch.equal(getattr(fixed, name), getattr(batch, name)[first]), name
    assert torch.equal(fixed.target_item, batch.target_item)
    assert torch.equal(fixed.dense[:, 0], batch.dense[first, 0])  # a request-side column
    assert torch.equal(fixed.dense[:, 1:], batch.dense[:, 1:])  # the candidate's columns
    assert torch.equal(fixed.label, batch.label) and torch.equal(fixed.group, batch.group)


def test_request_gauc_scores_a_checkpoint_end_to_end(tiny_data, tmp_path):
    from tests.test_export import _checkpoint

    ckpt = _checkpoint(tiny_data, tmp_path / "fit")
    cmd = [sys.executable, "bench/request_gauc.py", "--data", str(tiny_data), "--runs-of"]
    cmd += ["--ckpt", str(ckpt), "--request-dense", "activity"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith(f"| {ckpt}")]
    auc, g, request = (float(x) for x in row.strip("|").split("|")[1:])
    from recformer.evaluate import evaluate

    want = evaluate(ckpt, tiny_data, split="val", num_workers=0)  # the rows as logged
    assert (auc, g) == (round(want["auc"], 4), round(want["gauc"], 4))
    assert 0.0 <= request <= 1.0
    bad = subprocess.run(cmd[:-1] + ["no_such"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--request-dense ['no_such']: not dense columns" in bad.stderr
