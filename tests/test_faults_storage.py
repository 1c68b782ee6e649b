"""The object store and the disk failing under a fit (``make faults``): S3 refusing, unreachable,
without the bucket, or dying mid-epoch, and the disk filling up. Each is one line (exit 2, no
traceback); a refusal at set-up leaves no run folder and no W&B run; a stop mid-run says which step
the surviving checkpoint holds and how to resume. The store is moto's S3 server on 127.0.0.1
(``tests/s3_server.py``), run with the defaults of configs/trainer.yaml."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recformer.__main__ import main as recformer_main
from tests._subprocess import recformer_env, run_recformer
from tests.test_faults import final_state, fit_args, runs, with_callback

pytestmark = pytest.mark.faults

BUCKET = "logs"

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class Server:
    """moto's S3 server in a process of its own (``auth``: every request must carry credentials
    it knows, which ``CREDENTIALS`` are not: access denied)."""

    def __init__(self, folder: Path, auth: bool = False):
        port_file = folder / f"port-{time.monotonic_ns()}"
        env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("s3_server.py")), str(port_file)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the S3 server did not start"
            time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{port_file.read_text()}"

    def env(self) -> dict[str, str]:
        return recformer_env(**CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint)

    def upload(self, folder: Path) -> str:
        """``folder`` as ``s3://logs/data``, its URI."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())
        client.create_bucket(Bucket=BUCKET)
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                client.upload_file(str(p), BUCKET, f"data/{p.relative_to(folder).as_posix()}")
        return f"s3://{BUCKET}/data"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_REGION"],
    }


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


def _line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("recformer fit: error:")]
    return line


def _nothing_left(cwd: Path) -> None:
    assert not runs(cwd), "a run folder was left"
    assert not list((cwd / "runs" / "wandb").glob("offline-run-*")), "a W&B run was left"


# -- refused at set-up ------------------------------------------------------------------------------


def test_s3_access_denied_is_one_line_and_leaves_no_run(tiny_data, tmp_path):
    denied = Server(tmp_path, auth=True)
    try:
        proc = run_recformer(fit_args("s3://logs/data"), cwd=tmp_path, env=denied.env())
    finally:
        denied.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _line(proc.stderr)
    assert "data.data_dir=s3://logs/data: access denied; check the credentials" in line, line
    assert "AWS Error ACCESS_DENIED" in line
    _nothing_left(tmp_path)


def test_s3_endpoint_down_is_one_line_and_leaves_no_run(tmp_path):
    env = recformer_env(**CREDENTIALS, AWS_ENDPOINT_URL="http://127.0.0.1:9")
    proc = run_recformer(fit_args("s3://logs/data"), cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _line(proc.stderr)
    assert "the store cannot be reached at http://127.0.0.1:9 (AWS_ENDPOINT_URL)" in line, line
    _nothing_left(tmp_path)


def test_a_missing_bucket_is_named_as_one(server, tmp_path):
    proc = run_recformer(fit_args("s3://no-such-bucket/data"), cwd=tmp_path, env=server.env())
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _line(proc.stderr)
    assert "data.data_dir=s3://no-such-bucket/data: the bucket 'no-such-bucket' does not exist" in line, line
    assert "no spec.yaml there" not in line
    _nothing_left(tmp_path)


def test_data_build_from_an_unreachable_store_is_one_line(tmp_path, capsys, monkeypatch):
    for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(k, v)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(
        "events: s3://logs/raw/*.csv\ncolumns: {user: uid, item: iid, time: ts, label: click}\n"
    )
    rc = recformer_main(["data", "build", str(mapping), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith(
        "recformer data build: error: events s3://logs/raw/*.csv: the store cannot be reached"
    )
    assert not (tmp_path / "out").exists()


# -- failing mid-run --------------------------------------------------------------------------------

_HINT = re.compile(r"stopped at step (\d+); (\S+) holds step (\d+) \(resume: --ckpt_path \2, or the same")


def test_the_store_dying_mid_epoch_says_where_the_state_is_and_how_to_resume(server, tiny_data, tmp_path):
    uri = server.upload(tiny_data)
    kill = with_callback("KillProcessAt", step=12, pid=server.proc.pid)
    args = fit_args(uri, "--trainer.max_epochs=3", *kill)
    proc = run_recformer(args, cwd=tmp_path, env=server.env())
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _line(proc.stderr)
    assert "the store cannot be reached" in line and "truncated or corrupt" not in line, line
    stopped, last, held = _HINT.search(line).groups()
    (run,) = runs(tmp_path)
    assert tmp_path / last == run / "checkpoints" / "last.ckpt"
    assert int(stopped) >= 12 and final_state(tmp_path / last)["step"] == int(held) == 9


def test_a_full_disk_is_one_line_and_the_checkpoints_survive(tiny_data, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)]
    made = subprocess.run(mount, capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        fill = with_callback("FillDiskAt", step=12, path=str(disk / "filler"))
        proc = run_recformer(fit_args(tiny_data, "--trainer.max_epochs=3", *fill), cwd=disk)
        assert proc.returncode == 2, proc.stderr[-3000:]
        line = _line(proc.stderr)
        assert "No space left on device" in line and "cannot write" in line, line
        stopped, last, held = _HINT.search(line).groups()
        (run,) = runs(disk)
        assert disk / last == run / "checkpoints" / "last.ckpt" and int(stopped) >= 12
        assert final_state(disk / last)["step"] == int(held) == 9  # whole, and the step the line says
        assert not list(run.glob("checkpoints/.*partial*"))  # no half-written checkpoint left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)  # lazily: W&B may hold a file there
