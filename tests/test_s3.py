"""Data in object storage: ``data build``, ``fit`` and ``evaluate`` on ``s3://`` URIs, against a real
S3-compatible server (moto's, ``tests/s3_server.py``) on 127.0.0.1, not a mock of the client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from recformer.data import storage
from recformer.datasets.build import build
from recformer.datasets.build_config import BuildConfig
from tests.test_build import _events, _mapping
from tests.test_module import fit_args

BUCKET = "logs"


class S3:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        import boto3

        self.client = boto3.client("s3", endpoint_url=endpoint)

    def upload(self, folder: Path, prefix: str) -> dict[str, int]:
        """Every file under ``folder`` to ``s3://logs/<prefix>/...``; their sizes by key."""
        sizes = {}
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                key = f"{prefix}/{p.relative_to(folder).as_posix()}"
                self.client.upload_file(str(p), BUCKET, key)
                sizes[f"{BUCKET}/{key}"] = p.stat().st_size
        return sizes

    def sent(self, reset: bool = False) -> dict[str, dict[str, int]]:
        """Body bytes the server sent, and GET requests, per object key since the last reset."""
        req = urllib.request.Request(f"{self.endpoint}/_bytes", method="DELETE" if reset else "GET")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    port_file = tmp_path_factory.mktemp("s3") / "port"
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("s3_server.py")), str(port_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert server.poll() is None and time.monotonic() < deadline, "the S3 server did not start"
        time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port_file.read_text()}"
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",  # polars (data build) refuses a plain-HTTP endpoint without it
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        storage._filesystem.cache_clear()
        store = S3(endpoint)
        store.client.create_bucket(Bucket=BUCKET)
        yield store
    server.kill()
    server.wait()
    storage._filesystem.cache_clear()


@pytest.fixture(scope="module")
def local_and_remote(s3, tmp_path_factory) -> tuple[Path, str, dict[str, int]]:
    """The same data folder built from local events, and uploaded."""
    tmp = tmp_path_factory.mktemp("data")
    _events().write_parquet(tmp / "events.parquet")
    build(BuildConfig.load(_mapping(tmp, "events.parquet")), tmp / "out", progress=False)
    sizes = s3.upload(tmp / "out", "data")
    return tmp / "out", f"s3://{BUCKET}/data", sizes


def test_build_reads_events_from_s3_as_from_local_files(s3, tmp_path):
    df = _events(seed=2)
    half = df.height // 2
    (tmp_path / "raw").mkdir()
    df[:half].write_csv(tmp_path / "raw" / "a.csv")
    df[half:].write_csv(tmp_path / "raw" / "b.csv")
    s3.upload(tmp_path / "raw", "raw")
    local, remote = tmp_path / "local", tmp_path / "remote"
    build(BuildConfig.load(_mapping(tmp_path, "raw/*.csv")), local, progress=False)
    assert (
        recformer_main(
            ["data", "build", str(_mapping(tmp_path, f"s3://{BUCKET}/raw/*.csv")), "--out", str(remote)]
        )
        == 0
    )
    files = sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file() and p.name != "build.json")
    assert files == sorted(
        p.relative_to(remote) for p in remote.rglob("*") if p.is_file() and p.name != "build.json"
    )
    for f in files:
        assert (local / f).read_bytes() == (remote / f).read_bytes(), f


def test_fit_and_evaluate_read_s3_as_local_folders(s3, local_and_remote, tmp_path, capsys):
    """The same run on the local folder and on its S3 copy (one forked loader worker, as users
    run it): the same losses and validation AUC; the train files fetched once per epoch at most,
    by range; evaluate gives the same figures."""
    local, remote, sizes = local_and_remote
    common = ("--trainer.max_epochs=1", "--data.num_workers=1")
    here = cli_main(fit_args(local, tmp_path / "local", *common))
    s3.sent(reset=True)
    there = cli_main(fit_args(remote, tmp_path / "remote", *common))
    sent = s3.sent()
    for key in ("val/auc", "val/loss", "train/loss"):
        assert float(here.trainer.callback_metrics[key]) == float(there.trainer.callback_metrics[key]), key
    train = {k: v for k, v in sizes.items() if "/train/" in k}
    fetched = sum(sent["bytes"].get(k, 0) for k in train)
    # Two passes over the rows (set-up validation, the epoch), and each open reads the file's
    # tail for its footer (pyarrow asks for the last 64 KiB: on a tiny file, the whole file).
    opens = 8
    assert sum(train.values()) < fetched <= 2.2 * sum(train.values()) + opens * 65536, (fetched, train)
    assert sum(sent["gets"].get(k, 0) for k in train) < 100

    ckpt = next(Path(there.trainer.checkpoint_callback.dirpath).glob("epoch*.ckpt"))
    results = []
    for data in (str(local), remote):
        out = tmp_path / f"eval-{len(results)}.json"
        args = ["evaluate", "--ckpt", str(ckpt), "--data", data, "--num-workers", "0", "--out", str(out)]
        assert recformer_main([*args, "--no-wandb"]) == 0
        results.append(json.loads(out.read_text()))
    for r in results:
        del r["data"], r["seconds"]
    assert results[0]["rows"] > 0 and results[0] == results[1]


def test_missing_remote_folder_is_named(s3, tmp_path, capsys):
    assert recformer_main(fit_args("s3://logs/nothing-here", tmp_path)) == 2  # type: ignore[arg-type]
    assert "data.data_dir=s3://logs/nothing-here: no spec.yaml there" in capsys.readouterr().err
