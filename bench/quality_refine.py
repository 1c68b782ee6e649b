"""The learning rate (or the embedding L2 penalty) of every model's chosen point, refined on a finer
ladder at seed 0:

    python bench/quality_refine.py                       # every model of configs/quality/grid.yaml
    python bench/quality_refine.py --archs din deepfm    # some of them
    python bench/quality_refine.py --key l2              # the embedding L2 penalty instead

bench/quality.py's search steps the learning rate on a 1, 3, 10 ladder. After a change that moves
every model's training at once (the latest weight averaging of configs/trainer.yaml, 2026-12-06),
each model's chosen rate gets the same extra budget here: its neighbours on the 1, 2, 5 ladder
(1e-3 -> 5e-4 and 2e-3), everything else as chosen, each a ``recformer fit`` at seed 0 scored by the
grid's ``score`` (validation AUC + GAUC of the kept checkpoint); while the best sits on an edge the
next rung beyond it is tried. The best point becomes the model's choice in ``chosen.json`` (with the
grid's ``choose_where``, as the search chooses) and every point joins ``tuning.json``; the test
split is not read. The chosen point's own seed-0 fit is ``--stage final``'s, reused when its config
still matches (``cli_runs.stale``). Write a new choice into the model's preset by hand, as for the
search, so ``--stage presets`` gives it again.

``--key l2`` does the same for ``model.optim.embedding_l2`` on the 1, 3 ladder (1e-3 -> 3e-4 and
3e-3), a penalty of 0 having one neighbour, 3e-4 (``L2_ABOVE_ZERO``), and none below: the grid
(configs/quality/grid.yaml) steps it 0, 1e-3, 1e-2, 1e-1, chosen before the weight averaging; the
Transformer's 3e-4 passed docs/levers.md's rule against its 1e-3 on 2026-12-07, so every model gets
this refinement before the table that shows it.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
from pathlib import Path

import quality

KEY = "model.optim.lr"
RUNGS = (1.0, 2.0, 5.0)
"""The rate ladder's values per decade: each rung about a factor 2-2.5 from the next."""
LADDERS = {"lr": (KEY, RUNGS), "l2": ("model.optim.embedding_l2", (1.0, 3.0))}
"""``--key``: the setting refined and its ladder's values per decade."""
L2_ABOVE_ZERO = 3e-4
"""A penalty of 0's one neighbour: the 1, 3 ladder's rung below the grid's smallest positive L2."""


def rung(value: float, steps: int, rungs: tuple[float, ...] = RUNGS) -> float:
    """The value ``steps`` rungs of the ladder (``rungs`` per decade) above (below, when negative)
    the rung nearest ``value`` on a log scale."""
    decade = math.floor(math.log10(value))
    ladder = [m * 10.0**d for d in range(decade - 3, decade + 4) for m in rungs]
    i = min(range(len(ladder)), key=lambda j: abs(math.log10(ladder[j] / value)))
    return float(f"{ladder[i + steps]:.3g}")


def step(value: float, steps: int, rungs: tuple[float, ...]) -> float | None:
    """``rung``, with 0 (a penalty) below every rung: its one step up is ``L2_ABOVE_ZERO``, and
    nothing lies below it (None)."""
    if value == 0:
        return L2_ABOVE_ZERO if steps > 0 else None
    return rung(value, steps, rungs)


def refine(grid: dict, arch: str, start: dict, out: Path, key: str = KEY) -> tuple[dict, list[dict]]:
    """``arch``'s points around ``start`` (its chosen setting): ``start`` and the two neighbours of
    its ``key`` value (``LADDERS``), then one rung further while the best is the lowest or highest
    value tried (none below 0). Returns the best setting and every point."""
    rungs = next(r for k, r in LADDERS.values() if k == key)
    around = (step(start[key], -1, rungs), start[key], step(start[key], 1, rungs))
    values = [v for v in around if v is not None]
    tried: dict[float, dict] = {}
    while True:
        todo = [v for v in values if v not in tried]
        calls = [(quality.fit, arch, grid, {**start, key: v}, 0, out) for v in todo]
        tried |= dict(zip(todo, quality.parallel(len(calls), calls)))
        best = max(tried.values(), key=lambda r: quality.score(grid, r))
        low, high = min(tried), max(tried)
        edge = best["setting"][key]
        if edge not in (low, high):  # inside (start's own neighbours are always tried)
            return best["setting"], list(tried.values())
        beyond = step(edge, -1 if edge == low else 1, rungs)
        if beyond is None:  # 0 at the low edge: nothing below it
            return best["setting"], list(tried.values())
        values = [beyond]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=Path, default=quality.ROOT / "configs" / "quality" / "grid.yaml")
    p.add_argument("--archs", nargs="+", default=None, help="models of the grid (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="fits at a time, one torch thread each")
    p.add_argument("--out", type=Path, default=quality.ROOT / "bench" / "out" / "quality")
    p.add_argument("--key", choices=sorted(LADDERS), default="lr", help="the setting refined")
    a = p.parse_args()
    quality.SLOTS = threading.BoundedSemaphore(a.jobs)
    grid = quality.load_grid(a.grid)
    archs = a.archs or list(grid["models"])
    path = a.out / "chosen.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no chosen settings; run bench/quality.py --stage presets first")
    chosen = json.loads(path.read_text())
    missing = [arch for arch in archs if arch not in chosen]
    if missing:
        raise SystemExit(f"{path}: no chosen setting for {missing}; run --stage presets for them")
    key = LADDERS[a.key][0]
    calls = [(refine, grid, arch, chosen[arch], a.out, key) for arch in archs]
    found = dict(zip(archs, quality.parallel(len(archs), calls)))
    quality.record_points(grid, archs, found, a.out, replace=False)


if __name__ == "__main__":
    main()
