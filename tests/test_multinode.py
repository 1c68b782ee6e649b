"""Two node ranks for real: ``torchrun --nnodes 2 --nproc-per-node 1`` on this machine, rendezvous
on 127.0.0.1, gloo, each node in a folder of its own, through ``recformer fit`` as the README's
multi-node section runs it. Sharding follows the global rank (every training row once per epoch
across the nodes, the same number of batches on each), only global rank 0 writes the run folder,
its checkpoints and W&B run, and a resume on another world size is refused by name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests._subprocess import ROOT, recformer_env, run_recformer
from tests.conftest import write_tiny_data

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_args(data: Path) -> list[str]:
    return [
        "fit",
        f"--config={ROOT / 'configs/model/tiny.yaml'}",
        f"--data.data_dir={data}",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--model.optim.warmup_steps=2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
    ]


def _fit_args(data: Path, rows: Path) -> list[str]:
    return [
        *_base_args(data),
        "--trainer.num_nodes=2",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=tests.fault_callbacks.RecordRows",
        f"--trainer.callbacks.out={rows}",
    ]


def _torchrun_node(rank: int, port: int, cwd: Path, args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    cmd += [f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "recformer"]
    cwd.mkdir(parents=True, exist_ok=True)
    log = (cwd.parent / f"node{rank}.log").open("w")
    return subprocess.Popen(
        cmd + args, cwd=cwd, env=recformer_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    """Both nodes end with 0; otherwise (one failed, or past ``timeout``) every node is stopped (a
    node whose peer died waits in its collective for good) and the test fails with their logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(1)
    codes = [p.poll() for p in procs]
    if codes != [0, 0]:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        said = "\n".join(f"node {r} (exit {c}):\n{logs[r].read_text()[-3000:]}" for r, c in enumerate(codes))
        pytest.fail(f"torchrun nodes did not both finish within {timeout} s:\n{said}")


def test_two_torchrun_nodes_shard_by_global_rank_and_only_rank_zero_writes(tmp_path):
    data = write_tiny_data(tmp_path / "data", train_files=(300, 170, 45))  # 515 rows: odd
    rows = tmp_path / "rows"
    port = _free_port()
    nodes = [_torchrun_node(r, port, tmp_path / f"node{r}", _fit_args(data, rows)) for r in (0, 1)]
    _wait(nodes, [tmp_path / f"node{r}.log" for r in (0, 1)], timeout=300)
    train_ids = set()
    for f in sorted((data / "train").glob("*.parquet")):
        train_ids.update(pq.read_table(f, columns=["row_id"]).column("row_id").to_pylist())
    for epoch in (0, 1):
        per_rank = []
        for rank in (0, 1):
            lines = (rows / f"rank{rank}-epoch{epoch}.txt").read_text().splitlines()
            per_rank.append((len(lines), [int(x) for line in lines for x in line.split()]))
        assert per_rank[0][0] == per_rank[1][0]  # the same number of batches on each node
        seen = per_rank[0][1] + per_rank[1][1]
        assert set(seen) == train_ids  # every row, across the nodes
        assert len(seen) - len(set(seen)) <= 1  # once; one row repeated to even out 515 rows
        assert not set(per_rank[0][1]) & set(per_rank[1][1]) or len(seen) - len(set(seen)) == 1
    # Global rank 0 alone writes the run folder, its checkpoints and its W&B run.
    (run,) = (tmp_path / "node0" / "runs" / "recformer").glob("version_*")
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()
    assert list((tmp_path / "node0" / "runs" / "wandb").glob("offline-run-*"))
    assert not (tmp_path / "node1" / "runs").exists()

    # A resume on one process (world size 1 against the checkpoint's 2) is refused by name.
    resume = [*_base_args(data), "--trainer.max_epochs=3", f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"]
    proc = run_recformer(resume, cwd=tmp_path / "node0", timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("recformer fit: error:")]
    assert "cannot resume the training stream exactly" in line and "number of devices" in line
