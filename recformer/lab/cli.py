"""``recformer lab list | run GRID [--size smoke|full] [--out DIR] [--jobs N] | report DIR |
coord-check``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from recformer.lab.grids import list_grids, load_grid
from recformer.lab.report import report
from recformer.lab.runner import BUSY, run_grid, run_point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recformer lab", description="Scaling-lab grids of recformer runs.")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the grids in configs/lab/, with their sizes")
    run = sub.add_parser("run", help="run a grid (finished points are kept), then write its report")
    run.add_argument("grid", help="a grid name (configs/lab/NAME.yaml) or a grid file")
    run.add_argument("--size", default="smoke", help="the grid size (default: smoke)")
    run.add_argument("--out", type=Path, default=None, help="default: runs/lab/<grid>-<size>")
    run.add_argument("--jobs", type=int, default=1, help="points at a time (each gets cores / jobs threads)")
    run.add_argument(
        "--index",
        type=int,
        default=None,
        help="run only the point of this index (0-based; a SLURM job array: --index $SLURM_ARRAY_TASK_ID), "
        "no report: `recformer lab report DIR` once every task is done",
    )
    run.add_argument(
        "--count", action="store_true", help="print the number of points (for --array=0-(N-1)) and exit"
    )
    coord = sub.add_parser("coord-check", help="muP coordinate check: activation RMS per layer against width")
    coord.add_argument(
        "--data", type=Path, default=Path("data/movielens"), help="data folder (default: data/movielens)"
    )
    coord.add_argument(
        "--widths",
        type=int,
        nargs="+",
        default=[32, 64, 128, 256],
        help="d_model of each ranker (default: 32 64 128 256)",
    )
    coord.add_argument("--steps", type=int, default=3, help="Adam steps on one batch (default: 3)")
    coord.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default: 0.01)")
    coord.add_argument(
        "--out",
        type=Path,
        default=Path("runs/lab/coord-check"),
        help="folder for coord_check.csv and coord_check.png (default: runs/lab/coord-check)",
    )
    rep = sub.add_parser("report", help="write results.csv, results.md and the plots of a grid's folder")
    rep.add_argument("out", type=Path)
    return p


def grid_table(grids: list[tuple[str, str, list[str]]], width: int = 100) -> str:
    """``lab list``: each grid's name and sizes in aligned columns, and its whole description
    wrapped in the third (the first line alone cut sentences in half)."""
    names = max([len("grid"), *(len(n) for n, _, _ in grids)])
    sizes = max([len("sizes"), *(len(", ".join(z)) for _, _, z in grids)])
    indent = " " * (names + sizes + 4)
    lines = [f"{'grid':{names}s}  {'sizes':{sizes}s}  description"]
    for name, description, size in grids:
        text = textwrap.fill(
            " ".join(description.split()) or "(no description)",
            width=max(40, width),
            initial_indent=f"{name:{names}s}  {', '.join(size):{sizes}s}  ",
            subsequent_indent=indent,
        )
        lines.append(text)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    if a.action == "list":
        print(grid_table(list_grids()))
        return 0
    if a.action == "coord-check":
        from recformer.lab.coord import coord_table, run_coord_check

        paths = run_coord_check(a.data, a.widths, a.steps, a.lr, a.out)
        print(coord_table(paths[0], a.steps))
        for path in paths:
            print(f"wrote {path}")
        return 0
    if a.action == "report":
        meta = json.loads((a.out / "grid.json").read_text()) if (a.out / "grid.json").is_file() else {}
        title = meta.get("title", a.out.name)
        for path in report(a.out, meta.get("plots", []), title, meta.get("best"), meta.get("point_names")):
            print(path)
        return 0
    if a.jobs < 1:
        raise ValueError(f"--jobs={a.jobs}; expected an integer >= 1")
    grid = load_grid(a.grid, a.size)
    points = grid.points()
    if a.count:
        print(len(points))
        return 0
    out = (a.out or Path("runs") / "lab" / f"{grid.name}-{grid.size}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    title = f"lab {grid.name} ({grid.size})"
    names = [p.name for p in points]
    (out / "grid.json").write_text(
        json.dumps({"title": title, **grid.__dict__, "point_names": names}, indent=2)
    )
    if a.index is not None:
        if not 0 <= a.index < len(points):
            raise ValueError(f"--index {a.index}; the grid has points 0 to {len(points) - 1}")
        r = run_point(grid, points[a.index], out, max(1, os.cpu_count() or 1))
        print(f"{r['point']}: {r['status']} ({r['seconds']:.0f} s)")
        if r["status"] == BUSY:
            print(f"recformer lab: {r['error']}", file=sys.stderr)
        return 1 if r["status"] in ("failed", BUSY) else 0
    print(f"{title}: {len(points)} points, {a.jobs} at a time, in {out}")
    results = run_grid(grid, out, a.jobs)
    for path in report(out, grid.plots, title, grid.best, names):
        print(path)
    failed = [r["point"] for r in results if r["status"] == "failed"]
    if failed:
        print(
            f"recformer lab: {len(failed)} point(s) failed (errors in their point.json): {', '.join(failed)}"
        )
    for r in results:
        if r["status"] == BUSY:  # not run: another live process is running it
            print(f"recformer lab: {r['error']}", file=sys.stderr)
    return 1 if failed or any(r["status"] == BUSY for r in results) else 0
