"""Training from ``s3://``: bytes fetched against the files' sizes, and time against the local folder.

    python bench/bench_s3.py                       # MovieLens (data/movielens; made if missing)
    python bench/bench_s3.py --data DIR --epochs 2

Starts the test suite's S3-compatible server (``tests/s3_server.py``: moto's server, counting the
body bytes it sends per object), uploads the data folder, then runs the same one-epoch fit
(``configs/model/tiny.yaml``, one forked loader worker) on the local folder and on its S3 copy, with
``data.validate`` full (the default: every row decoded once at set-up) and footer. Per split: the
files' bytes, the bytes the server sent for them, their ratio and the GET requests; and the wall
time of each fit. A streaming reader fetches each needed column chunk about once per pass (set-up
validation, each training epoch, each validation run) plus each footer per open.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "s3_server.py"), str(port_file)])
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the S3 server did not start")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def counts(endpoint: str, reset: bool = False) -> dict:
    req = urllib.request.Request(f"{endpoint}/_bytes", method="DELETE" if reset else "GET")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def fit(data: str, root: Path, validate: str, epochs: int, env: dict) -> float:
    cmd = [
        sys.executable, "-m", "recformer", "fit", "--config", str(ROOT / "configs/model/tiny.yaml"),
        "--config", str(ROOT / "configs/data/movielens.yaml"), f"--data.data_dir={data}",
        f"--data.validate={validate}",
        "--data.num_workers=1", f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    root.mkdir(parents=True)  # the run folders (runs/ of the working directory) go there
    t0 = time.perf_counter()
    env = dict(env, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "movielens")
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    if not (args.data / "spec.yaml").is_file():
        make = [sys.executable, "-m", "recformer", "data", "movielens", "--out", str(args.data)]
        subprocess.run(make, check=True, cwd=ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench_s3_"))
    server, endpoint = start_server(tmp)
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_EC2_METADATA_DISABLED="true",
        WANDB_MODE="disabled",
    )
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench")
        sizes = {}
        for f in sorted(args.data.rglob("*")):
            if f.is_file():
                key = f"data/{f.relative_to(args.data).as_posix()}"
                s3.upload_file(str(f), "bench", key)
                sizes[f"bench/{key}"] = f.stat().st_size
        print(f"data {args.data}, {args.epochs} epoch(s), model configs/model/tiny.yaml")
        print("| validate | where | fit s | split | file MiB | fetched MiB | fetched / size | GETs |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for validate in ("full", "footer"):
            local = fit(str(args.data), tmp / f"local-{validate}", validate, args.epochs, env)
            print(f"| {validate} | local | {local:.1f} | | | | | |", flush=True)
            counts(endpoint, reset=True)
            remote = fit("s3://bench/data", tmp / f"s3-{validate}", validate, args.epochs, env)
            got = counts(endpoint)
            for split in ("train", "val", "test", "vocab", "items.parquet", "spec.yaml"):
                keys = [k for k in sizes if k.startswith(f"bench/data/{split}")]
                size = sum(sizes[k] for k in keys)
                sent = sum(got["bytes"].get(k, 0) for k in keys)
                gets = sum(got["gets"].get(k, 0) for k in keys)
                print(
                    f"| {validate} | s3 | {remote:.1f} | {split} | {size / 2**20:.2f} | {sent / 2**20:.2f} "
                    f"| {sent / size:.2f} | {gets} |",
                    flush=True,
                )
    finally:
        server.kill()


if __name__ == "__main__":
    main()
