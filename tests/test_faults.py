"""Fault injection (``make faults``): every fault a user's job meets, each asserting the promise.

Nothing lost (a killed or stopped run resumes to the weights an uninterrupted run reaches; a killed
checkpoint write leaves the old checkpoint; a result is printed before anything can fail to write
it), nothing silently wrong (flipped bits, NaN losses on any rank), no hang (every run under
``run_recformer``'s guard), one clear line (bad settings, files, checkpoints: exit 2, the setting or
file named, no traceback).

The runs go through ``python -m recformer`` with configs/trainer.yaml's defaults (CSV and W&B
offline loggers, every callback, the progress bar) wherever the fault involves the process, and
in-process through ``recformer.__main__.main`` where only a message is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from recformer.__main__ import main as recformer_main
from recformer.batch import DataError
from recformer.data.datamodule import RecDataModule
from recformer.data.schema import CHECKSUMS
from tests._subprocess import ROOT, recformer_env, run_recformer
from tests.conftest import write_tiny_data

pytestmark = pytest.mark.faults

TINY = f"--config={ROOT / 'configs/model/tiny.yaml'}"
STEPS_PER_EPOCH = 9  # 515 training rows in batches of 64


def fit_args(data: Path, *extra: str) -> list[str]:
    return [
        "fit",
        TINY,
        f"--data.data_dir={data}",
        "--data.batch_size=64",
        "--model.optim.warmup_steps=2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=2",
        *extra,
    ]


def with_callback(cls: str, **init_args: object) -> list[str]:
    return [f"--trainer.callbacks+=tests.fault_callbacks.{cls}"] + [
        f"--trainer.callbacks.{k}={v}" for k, v in init_args.items()
    ]


def runs(cwd: Path) -> list[Path]:
    return sorted((cwd / "runs" / "recformer").glob("version_*"), key=lambda p: int(p.name[8:]))


def final_state(ckpt: Path) -> dict:
    c = torch.load(ckpt, map_location="cpu", weights_only=True)
    return {"weights": c["state_dict"], "adam": c["optimizer_states"][0]["state"], "step": c["global_step"]}


def assert_same_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for name, w in a["weights"].items():
        assert torch.equal(w, b["weights"][name]), name
    for i, st in a["adam"].items():
        for k, v in st.items():
            assert torch.equal(v, b["adam"][i][k]), (i, k)


def one_line(err: str) -> list[str]:
    """The error lines of a refused command: Lightning's start-up notes ("Seed set to 0") and the
    traceback hint aside, there must be no traceback."""
    assert "Traceback" not in err, err[-3000:]
    return [line for line in err.strip().splitlines() if line.startswith("recformer ")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """Tiny data and the final state of an uninterrupted 2-epoch fit on it."""
    root = tmp_path_factory.mktemp("reference")
    data = write_tiny_data(root / "data")
    proc = run_recformer(fit_args(data), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data, final_state(runs(root)[0] / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def trained(reference, tmp_path_factory) -> Path:
    """A checkpoint (d_model 16) of the tiny ranker on the reference data."""
    root = tmp_path_factory.mktemp("trained")
    proc = run_recformer(fit_args(reference[0], "--trainer.max_epochs=1"), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return runs(root)[0] / "checkpoints" / "last.ckpt"


# -- kill and resume ------------------------------------------------------------------------------


def test_kill_9_mid_epoch_then_resume_ends_where_an_uninterrupted_run_ends(reference, tmp_path):
    data, uninterrupted = reference
    killed = run_recformer(fit_args(data, *with_callback("SignalAt", step=12)), cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    (run,) = runs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"  # written at the end of epoch 0 (step 9)
    assert final_state(last)["step"] == STEPS_PER_EPOCH
    resumed = run_recformer(fit_args(data, f"--ckpt_path={last}"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_state(final_state(runs(tmp_path)[-1] / "checkpoints" / "last.ckpt"), uninterrupted)


def _stopped_at(err: str, cwd: Path) -> tuple[int, Path]:
    """The step and checkpoint of the one line a SIGTERM-stopped fit prints."""
    (line,) = [x for x in err.splitlines() if "stopped by SIGTERM" in x]
    match = re.fullmatch(
        r"recformer fit: stopped by SIGTERM at step (\d+); the state is in (\S+) \(resume: --ckpt_path \2\)",
        line,
    )
    assert match, line
    return int(match[1]), cwd / match[2]


def test_sigterm_saves_the_state_says_so_exits_143_and_resumes_exactly(reference, tmp_path):
    data, uninterrupted = reference
    stopped = run_recformer(
        fit_args(data, *with_callback("SignalAt", step=12, signal="SIGTERM")), cwd=tmp_path
    )
    assert stopped.returncode == 143
    step, last = _stopped_at(stopped.stderr, tmp_path)
    assert last == runs(tmp_path)[0] / "checkpoints" / "last.ckpt"
    # Stopped at the next optimizer-step boundary after the signal, mid-epoch: the stream position
    # is in the checkpoint with the weights.
    assert step in (12, 13) and final_state(last)["step"] == step
    resumed = run_recformer(fit_args(data, f"--ckpt_path={last}"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_state(final_state(runs(tmp_path)[-1] / "checkpoints" / "last.ckpt"), uninterrupted)


def test_sigterm_under_ddp_stops_every_rank_at_one_step_with_one_line(reference, tmp_path):
    """Rank 0 alone is signalled (Lightning's handler broadcast from inside the signal handler and
    hung here); the ranks agree on the step, save one checkpoint, print one line."""
    args = fit_args(reference[0], "--trainer.devices=2", "--trainer.strategy=ddp")
    stopped = run_recformer([*args, *with_callback("SignalAt", step=3, signal="SIGTERM")], cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    step, last = _stopped_at(stopped.stderr, tmp_path)
    assert 3 <= step <= 5 and final_state(last)["step"] == step


# -- a checkpoint write killed half-way, with the temp folder on another file system ---------------

_WRITER = """
import sys, torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from recformer.checkpoints import AtomicCheckpointIO
io = AtomicCheckpointIO() if sys.argv[2] == "atomic" else TorchCheckpointIO()
io.save_checkpoint({"w": torch.ones(50_000_000)}, sys.argv[1])  # 200 MB
"""


def _kill_mid_write(target: Path, which: str, partial_glob: str) -> None:
    """Start a 200 MB checkpoint write over ``target`` and SIGKILL it while the bytes land: once a
    file of ``partial_glob`` (beside ``target``) is no longer the old file (its size changed: the
    copy truncates first) and not yet the new one."""
    old = {p: p.stat().st_size for p in target.parent.glob(partial_glob)}
    env = recformer_env(TMPDIR="/dev/shm")  # tmpfs: not the file system of the checkpoint folder
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), which], env=env)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        sizes = {p: p.stat().st_size for p in target.parent.glob(partial_glob) if p.exists()}
        if any(size != old.get(p) and size < 150_000_000 for p, size in sizes.items()):
            proc.kill()
            break
    proc.wait()


def test_a_checkpoint_write_killed_half_way_leaves_the_old_checkpoint(tmp_path):
    from recformer.checkpoints import AtomicCheckpointIO

    target = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10)}, target)
    _kill_mid_write(target, "atomic", ".last.ckpt.partial-*")
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.zeros(10))  # the old state
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, target)
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # the killed part is gone


def test_lightnings_own_write_would_have_lost_it(tmp_path):
    """The control: the same kill against Lightning's TorchCheckpointIO destroys the old file."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    target = tmp_path / "last.ckpt"
    for _ in range(3):  # the kill must land during the copy; the window is a fraction of a second
        TorchCheckpointIO().save_checkpoint({"w": torch.zeros(10)}, target)
        _kill_mid_write(target, "torch", "last.ckpt")
        with contextlib.suppress(Exception):
            torch.load(target, weights_only=True)
            continue
        return
    pytest.fail("the kill never landed inside Lightning's copy")


# -- corrupt data -----------------------------------------------------------------------------------


def _checksummed_copy(src: Path, dst: Path) -> Path:
    """``src`` data with its first train file rewritten with page checksums (as recformer writes)."""
    shutil.copytree(src, dst)
    part = sorted((dst / "train").glob("*.parquet"))[0]
    pq.write_table(pq.read_table(part), part, row_group_size=64, compression="zstd", **CHECKSUMS)
    return part


def _flip_and_read(part: Path, offset: int, bit: int) -> str:
    """``refused``, ``same`` (the values read back unchanged) or ``changed`` after flipping one
    bit of ``part`` and reading its split as the loader's set-up check does."""
    original = part.read_bytes()
    flipped = bytearray(original)
    flipped[offset] ^= 1 << bit
    part.write_bytes(bytes(flipped))
    try:
        dm = RecDataModule(str(part.parents[1]), num_workers=0)
        dm.check_values(dm.index_split("train"))
        changed = not pq.read_table(part).equals(pq.read_table(pa.BufferReader(original)))
        return "changed" if changed else "same"
    except (DataError, OSError):
        return "refused"
    finally:
        part.write_bytes(original)


def test_forty_bit_flips_in_data_pages_are_refused_or_harmless(reference, tmp_path):
    part = _checksummed_copy(reference[0], tmp_path / "data")
    footer = pq.ParquetFile(part).metadata.serialized_size + 8
    rng = np.random.default_rng(0)
    offsets = rng.integers(4, part.stat().st_size - footer, 40)
    outcomes = [_flip_and_read(part, int(o), int(rng.integers(8))) for o in offsets]
    assert "changed" not in outcomes, outcomes  # never a changed value trained on silently
    assert outcomes.count("refused") >= 36, outcomes  # the rest hit bytes no value depends on


def test_without_checksums_flipped_bits_are_trained_on_silently(reference, tmp_path):
    """The control: the same flips in a file without page checksums change values unnoticed."""
    shutil.copytree(reference[0], tmp_path / "data")
    part = sorted((tmp_path / "data" / "train").glob("*.parquet"))[0]
    pq.write_table(pq.read_table(part), part, row_group_size=64, compression="zstd")
    footer = pq.ParquetFile(part).metadata.serialized_size + 8
    rng = np.random.default_rng(0)
    offsets = rng.integers(4, part.stat().st_size - footer, 40)
    outcomes = [_flip_and_read(part, int(o), int(rng.integers(8))) for o in offsets]
    assert outcomes.count("changed") >= 5, outcomes


def test_a_truncated_training_file_is_one_line_and_leaves_no_run(reference, tmp_path):
    shutil.copytree(reference[0], tmp_path / "data")
    part = sorted((tmp_path / "data" / "train").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:-100])
    proc = run_recformer(fit_args(tmp_path / "data"), cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = one_line(proc.stderr)
    assert str(part.relative_to(tmp_path)) in line and "not a readable Parquet file" in line, proc.stderr[
        -2000:
    ]
    assert not runs(tmp_path) and not list((tmp_path / "runs" / "wandb").glob("offline-run-*"))


def test_an_inf_in_a_dense_column_is_refused_naming_file_and_column(reference, tmp_path):
    shutil.copytree(reference[0], tmp_path / "data")
    part = sorted((tmp_path / "data" / "train").glob("*.parquet"))[0]
    t = pq.read_table(part)
    x = t.column("activity").to_numpy().copy()
    x[5] = np.inf
    pq.write_table(t.set_column(t.schema.get_field_index("activity"), "activity", pa.array(x)), part)
    proc = run_recformer(fit_args(tmp_path / "data"), cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{part} (row group 0): column 'activity' has NaN or Inf in 1 row(s)" in proc.stderr
    assert not runs(tmp_path)


def test_a_data_error_found_at_the_first_batch_leaves_no_run_and_no_wandb_run(reference, tmp_path):
    """``validate: footer`` checks values as batches are read: the error comes after the run
    folder and the W&B run were made, which go again."""
    shutil.copytree(reference[0], tmp_path / "data")
    for part in (tmp_path / "data" / "train").glob("*.parquet"):
        t = pq.read_table(part)
        labels = np.full(t.num_rows, 7, np.int8)  # outside [0, 1]
        pq.write_table(t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels)), part)
    proc = run_recformer(fit_args(tmp_path / "data", "--data.validate=footer"), cwd=tmp_path)
    assert proc.returncode == 2 and "outside [0, 1]" in proc.stderr, proc.stderr[-2000:]
    assert not runs(tmp_path) and not list((tmp_path / "runs" / "wandb").glob("offline-run-*"))


# -- NaN and Inf ------------------------------------------------------------------------------------


def _health(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "health.jsonl").read_text().splitlines()]


def test_a_nan_loss_with_zero_gradients_is_skipped_counted_and_diagnosed(reference, tmp_path):
    proc = run_recformer(fit_args(reference[0], *with_callback("HugeWeightsAt", step=3)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs(tmp_path)
    counts = [r["health/nonfinite_steps"] for r in _health(run) if "health/nonfinite_steps" in r]
    assert max(counts) == 1.0
    doctor = run_recformer(["doctor", str(run)], cwd=tmp_path)
    assert doctor.returncode == 1
    assert "nonfinite_steps" in doctor.stdout and "nonfinite_loss" in doctor.stdout


def test_a_nan_loss_on_one_ddp_rank_is_skipped_on_every_rank(reference, tmp_path):
    args = fit_args(reference[0], "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.max_epochs=1")
    proc = run_recformer([*args, *with_callback("HugeWeightsAt", step=2, rank=1)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs(tmp_path)
    # Rank 0 logs: its own loss was finite, yet it skipped (and counted) the step with rank 1.
    counts = [r["health/nonfinite_steps"] for r in _health(run) if "health/nonfinite_steps" in r]
    assert max(counts) == 1.0
    state = final_state(run / "checkpoints" / "last.ckpt")
    assert {int(s["step"]) for s in state["adam"].values()} == {state["step"] - 1}  # one update skipped
    assert all(torch.isfinite(w).all() for w in state["weights"].values() if w.is_floating_point())


# -- outputs that cannot be written -----------------------------------------------------------------


@pytest.fixture
def read_only(tmp_path):
    """A read-only file system (tmpfs mounted ro; root ignores file modes, not this)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs here: {made.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_evaluate_refuses_an_unwritable_out_before_evaluating(reference, trained, read_only, capsys):
    args = [
        "evaluate",
        "--ckpt",
        str(trained),
        "--data",
        str(reference[0]),
        "--out",
        str(read_only / "e.json"),
    ]
    assert recformer_main(args) == 2
    out, err = capsys.readouterr()
    assert f"cannot write --out {read_only / 'e.json'}: the folder {read_only} is not writable" in err
    assert "AUC" not in out  # refused before the evaluation


def test_evaluate_prints_its_result_when_the_write_fails(reference, trained, tmp_path, capsys, monkeypatch):
    import recformer.evaluate as ev

    def full_disk(path, value):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(ev, "write_json_atomic", full_disk)
    out_file = tmp_path / "e.json"
    assert (
        recformer_main(
            ["evaluate", "--ckpt", str(trained), "--data", str(reference[0]), "--out", str(out_file)]
        )
        == 2
    )
    out, err = capsys.readouterr()
    assert "AUC" in out and '"gauc"' in out  # the table, then the JSON: nothing lost
    assert f"could not write {out_file} (No space left on device)" in err


def test_fit_into_a_read_only_runs_folder_is_one_line(reference, tmp_path, read_only):
    proc = run_recformer(fit_args(reference[0], f"--trainer.default_root_dir={read_only}"), cwd=read_only)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = one_line(proc.stderr)
    assert line == "recformer fit: error: cannot write runs: Read-only file system"


# -- two runs at once -------------------------------------------------------------------------------


def test_two_fits_started_at_once_get_a_run_folder_each(reference, tmp_path):
    env = recformer_env()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "recformer",
                *fit_args(reference[0], "--trainer.max_epochs=1", f"--seed_everything={s}"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in (1, 2)
    ]
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errs]
    folders = runs(tmp_path)
    assert len(folders) == 2
    seeds = sorted(yaml.safe_load((f / "config.yaml").read_text())["seed_everything"] for f in folders)
    assert seeds == [1, 2]  # each folder holds its own run's config
    assert all((f / "checkpoints" / "last.ckpt").is_file() for f in folders)


# -- W&B unreachable --------------------------------------------------------------------------------


def test_wandb_online_without_a_server_costs_seconds_and_no_metrics(reference, tmp_path):
    loggers = tmp_path / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        "      init_args: {save_dir: runs, name: recformer}\n"
        "    - class_path: recformer.loggers.SafeWandbLogger\n"
        "      init_args: {save_dir: runs, online: true, init_timeout: 5}\n"
    )
    env = recformer_env(WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY="x" * 40)
    start = time.monotonic()
    proc = run_recformer(
        fit_args(reference[0], f"--config={loggers}", "--trainer.max_epochs=1"), cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "W&B logging is off for this run" in proc.stderr
    assert time.monotonic() - start < 120
    (run,) = runs(tmp_path)
    assert "val/auc" in (run / "metrics.csv").read_text()


# -- checkpoints that are not what they seem --------------------------------------------------------


class _Touch:
    """Unpickling this runs ``touch`` (what a malicious checkpoint would do)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def bad_checkpoints(trained, tmp_path) -> dict[str, Path]:
    good = trained.read_bytes()
    files = {"empty": b"", "truncated": good[: len(good) // 2], "text": b"# not a checkpoint\n"}
    out = {}
    for name, content in files.items():
        out[name] = tmp_path / f"{name}.ckpt"
        out[name].write_bytes(content)
    ckpt = torch.load(trained, map_location="cpu", weights_only=True)
    ckpt["hyper_parameters"]["evil"] = _Touch(tmp_path / "PWNED")
    out["pickled code"] = tmp_path / "evil.ckpt"
    torch.save(ckpt, out["pickled code"])
    return out


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict", "evaluate"])
@pytest.mark.parametrize("kind", ["empty", "truncated", "text", "pickled code"])
def test_a_bad_checkpoint_is_one_line_and_runs_no_code(
    reference, bad_checkpoints, tmp_path, capsys, command, kind
):
    path = bad_checkpoints[kind]
    if command == "evaluate":
        args = ["evaluate", "--ckpt", str(path), "--data", str(reference[0])]
    else:
        args = [
            command,
            TINY,
            f"--data.data_dir={reference[0]}",
            "--trainer.accelerator=cpu",
            f"--ckpt_path={path}",
        ]
        args += [f"--trainer.default_root_dir={tmp_path}"]
    assert recformer_main(args) == 2
    (line,) = one_line(capsys.readouterr().err)
    said = (
        "pickled code?" if kind == "pickled code" else "is not a readable checkpoint written by recformer fit"
    )
    assert str(path) in line and said in line, line
    assert not (tmp_path / "PWNED").exists()


# -- settings and inputs refused in one line --------------------------------------------------------


def _spec_copy(data: Path, dst: Path, text: str) -> Path:
    shutil.copytree(data, dst)
    (dst / "spec.yaml").write_text(text)
    return dst


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--model.ranker.d_model=0"], "model.ranker: d_model=0 must be >= 1"),
        (["--model.ranker.n_heads=0"], "model.ranker: n_heads=0 must be >= 1"),
        (["--model.optim.eps=0"], "model.optim: eps=0.0 must be > 0"),
        (["--trainer.max_steps=-5"], "`max_steps` must be a non-negative integer or -1"),
        (["--trainer.max_step=5"], "unrecognized arguments: --trainer.max_step=5"),
        (["--data.shuffle_window=0"], "data.shuffle_window=0; expected an integer >= 1"),
        (["--data.num_workers=-1"], "data.num_workers=-1; expected an integer >= 0"),
        (["--ckpt_path=nope.ckpt"], "--ckpt_path nope.ckpt does not exist"),
    ],
)
def test_a_bad_setting_is_one_line(reference, tmp_path, capsys, monkeypatch, extra, said):
    monkeypatch.chdir(tmp_path)
    with contextlib.suppress(SystemExit):  # the parser's own errors exit 2 through SystemExit
        assert recformer_main(fit_args(reference[0], *extra)) == 2
    lines = one_line(capsys.readouterr().err)
    assert lines and said in lines[0] and len(lines) <= 2, lines  # parser errors add "(every setting ...)"
    assert not runs(tmp_path) and not (tmp_path / "runs" / "wandb").exists()


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("label: label\nitem: [unclosed\n", "not a plain YAML mapping (line 3, column 1)"),
        ("!!python/object/apply:os.system ['touch PWNED']\n", "could not determine a constructor"),
    ],
)
def test_a_spec_that_is_not_plain_yaml_is_one_line(reference, tmp_path, capsys, monkeypatch, spec, said):
    monkeypatch.chdir(tmp_path)
    data = _spec_copy(reference[0], tmp_path / "data", spec)
    assert recformer_main(fit_args(data)) == 2
    (line,) = one_line(capsys.readouterr().err)
    assert f"feature spec {data / 'spec.yaml'}" in line and said in line, line
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("command", ["fit", "predict"])
def test_a_model_setting_a_checkpoint_contradicts_is_refused(reference, trained, tmp_path, capsys, command):
    args = [command, TINY, f"--data.data_dir={reference[0]}", "--trainer.accelerator=cpu"]
    args += ["--model.ranker.d_model=32", f"--ckpt_path={trained}", f"--trainer.default_root_dir={tmp_path}"]
    assert recformer_main(args) == 2
    (line,) = one_line(capsys.readouterr().err)
    assert "--model.ranker.d_model=32 (the checkpoint's: 16)" in line and "drop them" in line, line


def test_a_runtime_setting_given_with_a_checkpoint_applies(reference, trained, tmp_path, monkeypatch):
    from recformer.cli import cli_main

    monkeypatch.chdir(tmp_path)  # the loggers write runs/ under the working directory, not the repo

    args = ["validate", TINY, f"--data.data_dir={reference[0]}", "--trainer.accelerator=cpu"]
    args += [
        "--model.auc_exact_max_rows=7",
        "--model.ranker.attention_kernel=sdpa",
        f"--ckpt_path={trained}",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = cli_main(args)
    assert cli.model.hparams.auc_exact_max_rows == 7  # the checkpoint had the default (1M)
    assert cli.model.ranker.blocks[0].attn.kernel == "sdpa"  # and "auto"


def test_evaluate_refuses_to_replace_a_file(reference, trained, tmp_path, capsys):
    out = tmp_path / "keep.parquet"
    out.write_bytes(b"a user's file")
    args = ["evaluate", "--ckpt", str(trained), "--data", str(reference[0]), "--out", str(out)]
    assert recformer_main(args) == 2
    assert f"--out {out} exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"a user's file"
    assert recformer_main([*args, "--overwrite"]) == 0
    assert json.loads(out.read_text())["rows"] == 90


def test_predict_refuses_to_replace_a_file(reference, trained, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a refused predict must leave no run folder in the repo either
    out = tmp_path / "keep.parquet"
    pq.write_table(pa.table({"x": np.arange(10_000)}), out)
    args = ["predict", TINY, f"--data.data_dir={reference[0]}", "--trainer.accelerator=cpu"]
    args += [f"--ckpt_path={trained}", f"--output={out}"]
    assert recformer_main(args) == 2
    assert f"predictions file {out} exists" in capsys.readouterr().err
    assert pq.read_table(out).num_rows == 10_000
