"""The requeue (``make faults``): a fit killed (SIGKILL, as a pre-empted node or a spot instance
ends) and started again with the very same command, ``--ckpt_path last`` included, as SLURM's
``--requeue`` does. It resumes the latest run of its own config exactly, in the same run folder
(metrics.csv and health.jsonl go on there) and the same W&B run; a run still being written is
refused by name; a checkpoint write the kill cut short is removed at the next start, in one line.

Every command runs through ``python -m recformer`` with configs/trainer.yaml's defaults. The kill
lands at a known step: ``HoldAt`` (part of the command, so the command is the same both times)
waits at that step the first time only, and the test kills the process group there.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from recformer.__main__ import main as recformer_main
from tests._subprocess import run_recformer, start_recformer, wait_for_file
from tests.test_faults import assert_same_state, final_state, fit_args, reference, runs, with_callback

pytestmark = pytest.mark.faults
__all__ = ["reference"]  # the module fixture: the uninterrupted run's final state


def _killed_at(args: list[str], cwd: Path, marker: Path) -> None:
    """Run ``args`` until it holds at its HoldAt step, then SIGKILL it and everything it started."""
    proc = start_recformer(args, cwd)
    wait_for_file(marker, proc, "the fit's HoldAt step")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def _note(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("recformer fit: --ckpt_path last:")]
    return line


def _metric_rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_killed_fit_requeued_with_the_same_command_resumes_its_run_exactly(reference, tmp_path):
    data, uninterrupted = reference
    marker = tmp_path / "held"
    args = fit_args(data, "--ckpt_path=last", *with_callback("HoldAt", step=12, path=str(marker)))
    _killed_at(args, tmp_path, marker)  # at step 12: last.ckpt holds the end of epoch 0 (step 9)
    (run,) = runs(tmp_path)
    first_id = json.loads((run / "wandb.json").read_text())["id"]
    partial = run / "checkpoints" / ".last.ckpt.partial-999999"  # as a kill during a write leaves it
    partial.write_bytes(b"half a checkpoint")

    again = run_recformer(args, cwd=tmp_path)  # the very same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert runs(tmp_path) == [run]  # the same folder, no version_1
    last = run / "checkpoints" / "last.ckpt"
    assert _note(again.stderr).startswith(
        f"recformer fit: --ckpt_path last: resuming {run.relative_to(tmp_path)} (the latest run of this "
        f"config) from {last.relative_to(tmp_path)}, step 9"
    )
    assert_same_state(final_state(last), uninterrupted)  # as if never killed
    assert (
        not partial.exists()
        and f"removed 1 checkpoint write(s) a kill cut short: {partial.relative_to(tmp_path)}" in again.stderr
    )
    # The logs go on in the folder: epoch 0 from the first attempt, epoch 1 from the second, each once.
    rows = _metric_rows(run)
    assert sorted(int(r["epoch"]) for r in rows if r.get("val/auc")) == [0, 1]
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert steps == sorted(set(steps)) and max(steps) > 9 and min(steps) < 9
    health = [json.loads(x) for x in (run / "health.jsonl").read_text().splitlines()]
    logged = [r["step"] for r in health if "meta" not in r]
    assert logged == sorted(set(logged))  # nothing the killed attempt logged past step 9 twice
    # The same W&B run: the record keeps its id, and the resumed part is a folder with that id.
    assert json.loads((run / "wandb.json").read_text())["id"] == first_id
    assert len(list((tmp_path / "runs" / "wandb").glob(f"offline-run-*-{first_id}"))) == 2


def test_a_requeue_resumes_the_latest_run_of_its_own_config_not_anothers(reference, tmp_path):
    """Config A is killed before its first checkpoint (version_0); config B, the same but for its
    seed, runs whole (version_1); A's command again goes on in version_0, not in B's newer folder."""
    data = reference[0]
    marker = tmp_path / "held"
    hold = with_callback("HoldAt", step=3, path=str(marker))
    a = fit_args(data, "--ckpt_path=last", "--seed_everything=1", *hold)
    _killed_at(a, tmp_path, marker)
    b = run_recformer(fit_args(data, "--ckpt_path=last", "--seed_everything=2", *hold), cwd=tmp_path)
    assert b.returncode == 0, b.stderr[-3000:]
    said = "(the latest, version_0, differs: seed_everything: 1 vs 2 now): starting a new run"
    assert _note(b.stderr).endswith(said), _note(b.stderr)
    again = run_recformer(a, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    first, second = runs(tmp_path)
    said = (
        "has no last.ckpt (stopped before its first checkpoint): it starts again from step 0 in that folder"
    )
    assert said in _note(again.stderr)
    assert yaml.safe_load((first / "config.yaml").read_text())["seed_everything"] == 1
    assert final_state(first / "checkpoints" / "last.ckpt")["step"] == 2 * 9
    steps = [int(r["step"]) for r in _metric_rows(first) if r.get("train/loss")]
    assert steps == sorted(set(steps))  # the killed attempt's rows are not there twice
    assert yaml.safe_load((second / "config.yaml").read_text())["seed_everything"] == 2  # B's own


def test_a_requeue_while_the_run_is_alive_is_refused_by_name(reference, tmp_path):
    marker = tmp_path / "held"
    args = fit_args(reference[0], "--ckpt_path=last", *with_callback("HoldAt", step=12, path=str(marker)))
    first = start_recformer(args, tmp_path)
    try:
        wait_for_file(marker, first, "the fit's HoldAt step")
        marker.unlink()  # the second would hold at step 12 too, if it ever got there
        second = run_recformer(args, cwd=tmp_path)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    (line,) = [x for x in second.stderr.splitlines() if x.startswith("recformer fit: error:")]
    (run,) = runs(tmp_path)  # no second folder
    assert (
        f"run folder {run.relative_to(tmp_path)} is being written by a live process (pid {first.pid} on"
        in line
    ), line


def test_a_partial_checkpoint_beside_an_explicit_checkpoint_is_removed_at_the_next_start(
    reference, tmp_path, capsys, monkeypatch
):
    data = reference[0]
    monkeypatch.chdir(tmp_path)
    assert recformer_main(fit_args(data, "--trainer.max_epochs=1")) == 0
    (run,) = runs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    partial = last.with_name(".last.ckpt.partial-4242")
    partial.write_bytes(b"cut short")
    capsys.readouterr()
    assert recformer_main(fit_args(data, "--trainer.max_epochs=1", f"--ckpt_path={last}")) == 0
    assert not partial.exists()
    err = capsys.readouterr().err
    assert f"recformer fit: removed 1 checkpoint write(s) a kill cut short: {partial} (the checkpoints" in err


def test_a_requeue_that_cannot_resume_exactly_says_why_in_one_line(reference, tmp_path):
    """Between the kill and the requeue a training file went: the stream the checkpoint was in the
    middle of no longer exists, so the same command stops in one line instead of training on."""
    shutil.copytree(reference[0], tmp_path / "data")
    marker = tmp_path / "held"
    args = fit_args(
        tmp_path / "data", "--ckpt_path=last", *with_callback("HoldAt", step=12, path=str(marker))
    )
    _killed_at(args, tmp_path, marker)
    (run,) = runs(tmp_path)
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    sorted((tmp_path / "data" / "train").glob("*.parquet"))[-1].unlink()
    again = run_recformer(args, cwd=tmp_path)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    (line,) = [x for x in again.stderr.splitlines() if x.startswith("recformer fit: error:")]
    assert "cannot resume the training stream exactly" in line and "'rows': (515, 470)" in line, line
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before and runs(tmp_path) == [run]


def test_a_config_from_before_the_attention_kernel_is_the_same_run():
    """``fit --ckpt_path last`` finds a run by its config: the attention kernel (how attention is
    computed; absent from configs written before it existed) does not make a run another."""
    from recformer.resume import comparable

    then = {"ckpt_path": "last", "model": {"ranker": {"d_model": 64}}, "trainer": {"logger": []}}
    now = {"model": {"ranker": {"d_model": 64, "attention_kernel": "sdpa"}}, "trainer": {}}
    assert comparable(then) == comparable(now)
    assert comparable({"model": {"ranker": {"d_model": 32}}, "trainer": {}}) != comparable(then)
    assert then["model"]["ranker"] == {"d_model": 64} and "ckpt_path" in then  # the caller's left whole
