"""``recformer doctor RUN_DIR``: the arguments, what is printed, and the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from recformer.callbacks.sink import HEALTH_FILE
from recformer.doctor.checks import diagnose
from recformer.doctor.plots import write_plots
from recformer.doctor.report import report_text, write_html
from recformer.doctor.runs import METRICS_CSV, load_run
from recformer.tracking import log_doctor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recformer doctor",
        description="Read a run's internal metrics (health.jsonl, metrics.csv) and name its silent failure. "
        "Exit status: 0 clean bill of health, 1 findings, 2 no metrics (or none a check needs).",
    )
    parser.add_argument(
        "run_dir", type=Path, help="the run directory (trainer.log_dir), e.g. runs/recformer/version_3"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where the plots and index.html go (default RUN_DIR/doctor)"
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON instead of text")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs and the HTML page")
    parser.add_argument(
        "--no-wandb",
        action="store_true",
        help="do not log the findings and plots to the run's W&B run (its wandb.json)",
    )
    return parser


def _no_metrics(run_dir: Path) -> str:
    """Why a run directory gave no series: empty files, or none there (a logger directory?)."""
    hint = sorted(p.name for p in run_dir.glob("version_*"))
    present = [f.name for f in (run_dir / HEALTH_FILE, run_dir / METRICS_CSV) if f.is_file()]
    if present:
        said = f"{' and '.join(present)}: no metric rows (the run stopped before its first log step?)"
    else:
        said = (
            f"expected {HEALTH_FILE} (the health callbacks of configs/trainer.yaml) or {METRICS_CSV} "
            "(CSVLogger)"
        )
    return f"recformer doctor: no metrics in {run_dir}: {said}" + (
        f"; this looks like a logger directory, try one of {hint}" if hint else ""
    )


def main(argv: list[str]) -> int:
    """Exit status: 0 clean bill of health, 1 findings, 2 no metrics or none that a check needs."""
    args = _parser().parse_args(argv)
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(
            f"recformer doctor: {run_dir} is not a directory; pass a run directory (trainer.log_dir)",
            file=sys.stderr,
        )
        return 2
    run = load_run(run_dir)
    if not run.series:
        print(_no_metrics(run_dir), file=sys.stderr)
        return 2
    d = diagnose(run, run_dir)
    plots: list[Path] = []
    if not args.no_plots:
        out = args.out or run_dir / "doctor"
        out.mkdir(parents=True, exist_ok=True)
        written = write_plots(run, out)
        write_html(d, written, out)
        plots = [out / name for name, _ in written]
    if args.json:
        print(json.dumps({**asdict(d), "healthy": d.healthy}, indent=2))
    else:
        print(report_text(d))
        if not args.no_plots:
            print(f"\nplots and report: {out / 'index.html'}")
    if not args.no_wandb and (d.findings or d.passed):
        run_id = log_doctor(run_dir, d, plots)
        if run_id and not args.json:
            print(f"logged to W&B run {run_id}")
    if not d.findings and not d.passed:
        print(
            f"recformer doctor: none of the {len(d.skipped)} checks found its metrics in {run_dir}; "
            "log with the health callbacks of configs/trainer.yaml",
            file=sys.stderr,
        )
        return 2
    return 0 if d.healthy else 1
