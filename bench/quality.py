"""Offline quality on the MovieLens temporal split: recformer against the classic CTR models, each
tuned alike on validation, then measured over seeds with paired tests on the same test rows.

    python bench/quality.py                                  # tune, final, throughput (hours on 2 cores)
    python bench/quality.py --stage tune --archs deepfm bst  # a part of the grid
    python bench/quality.py --stage joint                    # the joint lr x L2 pass from chosen.json
    python bench/quality.py --stage presets                  # chosen.json from the presets (no tune run)
    python bench/quality.py --stage final                    # the chosen settings, seeds 0 1 2
    python bench/quality.py --stage throughput               # training samples/s, side by side
    python bench/quality.py --stage report                   # docs/quality.md's table, from the JSON files

Every run goes through the CLI a user runs (``recformer fit``, ``recformer evaluate``), on
the grid's ``data_dir`` (``data/movielens`` as ``recformer data movielens`` writes it) with its
``data_config`` (``configs/data/movielens.yaml``).

- ``tune``: every model gets the same budget, the coordinate search of ``configs/quality/grid.yaml``
  (learning rate, embedding L2 penalty, dropout; ``search``), at seed 0, each run up to ``epochs``
  epochs with early stopping. A point's score is the sum of the grid's ``score`` metrics (validation
  AUC + GAUC) of its kept checkpoint (best by that sum since 2026-12-06, by val AUC in the search
  of 2026-12-03); the best point is the model's chosen setting, written with every point's
  validation scores, peak epoch and whether it reached the cap to ``<out>/tuning.json`` and
  ``chosen.json``. The test split is not read.
- ``final``: each chosen setting at every ``--seeds`` seed: the best validation checkpoint's test AUC
  with its DeLong 95% interval, GAUC, logloss (``recformer evaluate``), and the paired DeLong test of
  AUC(transformer) - AUC(baseline) on the same test rows, per seed (``evaluate --compare``).
- ``throughput``: training samples/s of every model at its chosen setting and of the Transformer's
  token options, on the same batches, steps interleaved model after model (machine noise hits all
  alike), medians of ``THROUGHPUT_STEPS`` timed steps, on both cores (``bench/bench_throughput.py``).

Fits run ``--jobs`` at a time, each on one torch thread (OMP_NUM_THREADS=1).

Measured (2 CPU cores; docs/quality.md holds the latest):

- 2026-11-30: the default ``small.yaml`` with 4 heads and an MLP of 4 x width: test AUC 0.8036 ±
  0.0006, GAUC 0.6441, 14 of 15 paired intervals above zero (BST seed 0 +0.0024 [-0.0016,
  +0.0065]), 2,056 samples/s, 1.66x BST.
- 2026-12-02: 2 heads and an MLP of 2 x width, chosen on validation (0.8085 against 0.8056 at seed
  0), the baselines' runs reused: test AUC 0.8065 ± 0.0027, GAUC 0.6385, all 15 intervals above
  zero, 2,402 samples/s, 2.14x BST (1,124) in one throughput run. The same shape with
  ``--model.pairwise 1 --data.group_rows 16`` (a grid entry of its own, lr 3e-4): test AUC 0.8042
  ± 0.0022, GAUC 0.6469 (0.6512, 0.6472, 0.6423), 13 of 15 intervals above zero.
- 2026-12-03, issue 29's protocol (this grid: 20 epochs with early stopping, lr x embedding L2 x
  dropout for every model, score val AUC + GAUC; 10 genres a movie; nothing reused): the baselines
  gain 0.003-0.008 val AUC from the L2 penalty and train to epoch 4-5. The search's path left the
  Transformer at lr 3e-3 without the penalty (peak epoch 1; test AUC 0.7988, below DIN's 0.8104 on
  every seed); lr 1e-3 with the penalty 1e-3, added by hand (the point DIN, DeepFM and DCN-V2
  chose), scored best on validation (0.8098 / 0.6572) and is the default: test AUC 0.8082 ±
  0.0042, level with DIN, ahead of DeepFM (0.7956) and DCN-V2 (0.7989) on every seed; GAUC 0.6583
  against popularity's 0.6434 and DeepFM's 0.6729; 3,227 samples/s, 2.07x BST (1,557).
- 2026-12-03, the joint lr x L2 pass (``--stage joint``) from every chosen point, the earlier points
  reused: 19 new points, none better than a model's chosen one (closest: DCN-V2 at lr 3e-3 without
  the penalty, 0.8007 / 0.6710 against 0.8057 / 0.6821); no choice moved.
- 2026-12-03 evening, the cross network with its branch loss in ``small.yaml``: the Transformer's
  search rerun from it (20 points; its best, lr 3e-3 with dropout 0.2, trains at 1.36x BST, so the
  grid's ``choose_where`` takes the best point without dropout, lr 1e-2) and its seeds rerun, the
  baselines' runs kept (configs unchanged, checked by ``cli_runs.stale``): test AUC 0.8108 ±
  0.0015, GAUC 0.6676 (0.6680, 0.6625, 0.6723), paired against DIN +0.0005, -0.0029, +0.0038 (all
  across zero), 3,600 samples/s, 2.04x BST (1,762).
- 2026-12-06, every run retrained twice. At a67b5ea (each distinct item's bag summed once a batch,
  16-bit element dropout: float sums in a new order) with the checkpoint kept by val AUC: the
  Transformer's test AUC 0.8089 ± 0.0035, GAUC 0.6685 (seed 2 0.6576, from 0.6723 before: one
  trajectory's spread); DIN 0.8104 / 0.6592, DeepFM 0.7960 / 0.6721. Then with the checkpoint kept
  by val AUC + GAUC (the same trajectories): the Transformer 0.8076 ± 0.0044, GAUC 0.6706 (0.6721,
  0.6723, 0.6673: popularity + 0.02 on every seed, DeepFM + 0.005 on none), paired against DIN
  -0.0013, -0.0007, -0.0045; 3,634 samples/s, 1.93x BST (1,880). Over the 7 runs whose kept
  validation moved, test GAUC +0.0012 and AUC -0.0014 on average: a trade, not a gain.
- 2026-12-06 late, every run retrained a third time after two speed-ups (q, k, v from three
  matmuls with QK-Norm on CPU; an 8-bit dropout mask): DIN, DeepFM, DCN-V2 and popularity came out
  identical; the Transformer val 0.8112 / 0.6678 (sum as before), test AUC 0.8088 ± 0.0026, GAUC
  0.6635 (0.6702, 0.6619, 0.6583: one trajectory's spread again), paired against DIN +0.0008,
  -0.0020, -0.0015; BST 0.8017 / 0.6257; 3,470 samples/s, 1.93x BST (1,796) with 100 timed steps,
  1.96x-2.11x in other side-by-side runs of the day.
- 2026-12-06 late, every run retrained a fourth time, with the branch loss at weight 0.5 (passed the
  rule, docs/levers.md) and on another machine (AMD EPYC, AVX512), where DIN and popularity came out
  identical and DeepFM, DCN-V2, BST and the Transformer did not: the Transformer val 0.8099 /
  0.6674, test AUC 0.8083 ± 0.0013, GAUC 0.6683 (0.6713, 0.6672, 0.6665: popularity + 0.02 on
  every seed, the best baseline + 0.005 on none), paired against DIN -0.0004, -0.0034, -0.0004;
  3,139 samples/s, 1.97x BST (1,597); 2.04x in a rerun right after.
- 2026-12-06 late, the Transformer retrained once more with the rating dropout (history_cat_dropout
  0.25, passed the rule on validation), the fourth rerun's baselines kept: val 0.8091 / 0.6712, test
  AUC 0.8062 ± 0.0042, GAUC 0.6685 (0.6692, 0.6717, 0.6647), paired against DIN -0.0008, -0.0040,
  -0.0058; 2,728 samples/s, 1.85x BST (1,471) in a slow run, 1.98x in a rerun right after.
- 2026-12-06 night, every run retrained with latest weight averaging (window 6) in the trainer's
  callbacks: the Transformer test AUC 0.8144 ± 0.0006, GAUC 0.6798 (DeepFM + 0.005 on seed 1
  only), paired against DIN +0.0023, +0.0032, +0.0012; 1.84x BST, 2.07x in a rerun.
- 2026-12-06 night, every model's rate refined with averaging (bench/quality_refine.py: the
  Transformer 5e-3, DIN 2e-3, DeepFM 5e-4, popularity 2e-2) and every run retrained: the
  Transformer test AUC 0.8154 ± 0.0010, GAUC 0.6841 (0.6875, 0.6820, 0.6827: the best baseline
  + 0.005 on every seed), paired against DIN +0.0003, +0.0009, +0.0004; 2,492 samples/s, 1.90x
  BST (1,312), 1.91x in a rerun.
- 2026-12-07, the attention kernel (``model.ranker.attention_kernel``): the default on ``auto``
  (per-head matmuls on CPU) scored -0.0105, -0.0076, -0.0076 of val AUC + GAUC under the seventh
  table, so it keeps ``sdpa`` and its runs came out the seventh's; BST on the matmuls: test AUC
  0.8045 ± 0.0014, GAUC 0.6274; the Transformer 2,735 samples/s, 1.86x BST (1,471).
- 2026-12-07, early stopping's patience 4 validations (two epochs) for every model: the
  Transformer test AUC 0.8153 ± 0.0011, GAUC 0.6847 (0.6875, 0.6820, 0.6846: the best baseline
  + 0.0117, + 0.0069, + 0.0102), paired against DIN +0.0003, +0.0013, +0.0001; DeepFM's and DCN-V2's
  kept validation scores rose most; 3,399 samples/s, 1.89x BST (1,800).
- 2026-12-07 evening, every model's embedding L2 refined (``bench/quality_refine.py --key l2``: the
  Transformer, DIN and DeepFM 3e-4, BST 1e-3) and every run retrained (DCN-V2 and popularity,
  unchanged, came out identical): the Transformer test AUC 0.8160 ± 0.0020, GAUC 0.6891 (the best
  baseline + 0.0119, + 0.0159, + 0.0175), paired against DIN +0.0019, -0.0008, +0.0005; DeepFM's
  validation gain did not carry to test (AUC 0.7965 -> 0.7931); 2,655 samples/s, 1.78x BST (1,493).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import math
import statistics
import sys
import threading
from pathlib import Path

import cli_runs
import yaml

ROOT = Path(__file__).resolve().parents[1]
THROUGHPUT_STEPS = 100
"""Timed steps per model in ``--stage throughput``: 40 (``bench_throughput``'s default) until
2026-12-06, when the table's run gave the Transformer 1.93x BST and two 100-step reruns right after
it 2.04x: the median of 40 interleaved steps moved by a few percent from run to run."""


def load_grid(path: Path) -> dict:
    grid = yaml.safe_load(path.read_text())
    for arch, m in grid["models"].items():
        if not (ROOT / m["config"]).is_file():
            raise FileNotFoundError(f"{path}: models.{arch}.config {m['config']} does not exist")
        unknown = sorted(set(m.get("axes", grid["axes"])) - set(grid["axes"]))
        if unknown:
            raise ValueError(
                f"{path}: models.{arch}.axes names {unknown}, not in axes {sorted(grid['axes'])}"
            )
    return grid


def preset_value(grid: dict, arch: str, key: str) -> object:
    """The value ``recformer fit`` gives setting ``key`` (``model.optim.lr``) for ``arch`` with no
    override: its preset's, else the data config's, else the grid's ``defaults``."""
    for path in (grid["models"][arch]["config"], grid["data_config"]):
        node = yaml.safe_load((ROOT / path).read_text()) or {}
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return grid["defaults"][key]


def name_of(arch: str, setting: dict[str, object], seed: int) -> str:
    tag = "-".join(f"{k.rsplit('.', 1)[-1]}{v}" for k, v in setting.items())
    return f"{arch}-{tag}-seed{seed}"


def score(grid: dict, r: dict) -> float:
    """The validation score settings are chosen by: the sum of the grid's ``score`` metrics."""
    return sum(r[m] for m in grid["score"])


def fit(arch: str, grid: dict, setting: dict[str, object], seed: int, out: Path) -> dict:
    """``recformer fit`` of one point, one torch thread; its run folder, best validation scores
    (AUC, the GAUC of the same checkpoint, the epoch it came at and whether the run reached the
    epoch cap) and fit time, kept in ``done.json``: a finished point is not run again, so a stage
    resumes."""
    name = name_of(arch, setting, seed)
    run_dir = out / "runs" / name / "version_0"
    args = [
        f"--data.data_dir={grid['data_dir']}",
        f"--seed_everything={seed}",
        f"--trainer.max_epochs={grid['epochs']}",
    ]
    args += [f"--{k}={v}" for k, v in setting.items()]
    configs = [grid["models"][arch]["config"], grid["data_config"]]
    done = cli_runs.cached(run_dir, configs, args, out / "paired")
    if done is not None:
        return done
    with SLOTS:
        run_dir, seconds = cli_runs.fit(configs, args, out / "runs", name, threads=1)
    return record_fit(arch, grid, setting, seed, run_dir, seconds)


def record_fit(arch: str, grid: dict, setting: dict, seed: int, run_dir: Path, seconds: float) -> dict:
    """A finished fit's ``done.json`` (``fit``'s result), written into ``run_dir``."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    val, best = cli_runs.validations(run_dir)
    epochs_run = max(int(float(r["epoch"])) for r in rows if r.get("epoch")) + 1
    result = {
        "arch": arch,
        "setting": setting,
        "seed": seed,
        "run": str(run_dir),
        "checkpoint": str(cli_runs.best_checkpoint(run_dir)),
        "val_auc": float(best["val/auc"]),
        "val_gauc": float(best["val/gauc"]),
        "val_logloss": float(best["val/logloss"]),
        "best_epoch": int(float(best["epoch"])) + 1,
        "best_step": int(float(best["step"])),
        "validations": len(val),
        "best_validation": val.index(best) + 1,
        # Early stopping ends a run `patience` validations after its best (configs/trainer.yaml);
        # one that ran to the cap with its best among its last 2 validations might have improved
        # with more epochs.
        "hit_cap": epochs_run >= grid["epochs"] and val.index(best) >= len(val) - 2,
        "fit_seconds": round(seconds, 1),
    }
    (run_dir / "done.json").write_text(json.dumps(result, indent=2))
    return result


SLOTS = threading.BoundedSemaphore(2)
"""Fits running at a time (``--jobs``): every model's search shares them."""


def extend(axis: dict, values: list, best: object) -> object | None:
    """A value beyond the edge of ``values`` that ``best`` sits on, or None when it sits inside
    (or on 0, the lower end of a penalty or dropout: "off" has nothing below it). Log axes step by
    the ratio of their last (or first) two nonzero values, linear axes by their spacing; ``max``
    bounds them."""
    ordered = sorted(values)
    if best not in (ordered[0], ordered[-1]) or best == 0:
        return None
    up = best == ordered[-1]
    a, b = (ordered[-2], ordered[-1]) if up else (ordered[1], ordered[0])
    if axis["scale"] == "log":
        a = a if a != 0 else b / 10  # one nonzero value only: a decade
        new = _on_1_3_ladder(b * (b / a))
    else:
        new = float(f"{b + (b - a):.3g}")
    if new < 0 or new > axis.get("max", float("inf")) or new in ordered:
        return None
    return new


def _on_1_3_ladder(x: float) -> float:
    """The value of 1, 3, 10, 30, ... times a power of ten nearest ``x`` on a log scale."""
    decade = math.floor(math.log10(x))
    steps = [m * 10.0**decade for m in (1, 3, 10)]
    return float(f"{min(steps, key=lambda v: abs(math.log10(v / x))):.3g}")


def search(grid: dict, arch: str, out: Path) -> tuple[dict, list[dict]]:
    """Coordinate search of ``arch``'s setting on validation, at seed 0: from the preset's values,
    each axis in the grid's order tried at all of its values with the others held, the best kept;
    an axis whose best sits on an edge of its values gets the next value beyond it until it does
    not; then the first axis (the learning rate) once more at the final setting of the others; last
    the learning rate and the penalty together (``joint``). Every model gets the same axes and
    values (``models.<arch>.axes`` drops the ones a model does not have), so the same budget."""
    axes = grid["models"][arch].get("axes", list(grid["axes"]))
    current = {k: preset_value(grid, arch, k) for k in axes}
    tried: dict[str, dict] = {}
    for key in [*axes, axes[0]]:
        values = sorted(set(grid["axes"][key]["values"]) | {current[key]})
        while True:
            settings = [{**current, key: v} for v in values]
            for r in parallel(len(settings), [(fit, arch, grid, s, 0, out) for s in settings]):
                tried[json.dumps(r["setting"], sort_keys=True)] = r
            best = max((tried[json.dumps(s, sort_keys=True)] for s in settings), key=lambda r: score(grid, r))
            new = extend(grid["axes"][key], values, best["setting"][key])
            if new is None:
                break
            values = sorted([*values, new])
        current = best["setting"]
    return joint(grid, arch, axes, current, tried, out), list(tried.values())


def joint(grid: dict, arch: str, axes: list[str], current: dict, tried: dict[str, dict], out: Path) -> dict:
    """The first two axes (learning rate, embedding L2 penalty) together around ``current``: every
    pair of their values next to it (each axis's grid and tried values, one either side), moving to
    the best pair until ``current`` is the best of its neighbourhood. One axis at a time never
    reaches a pair that pays only with both changed (a lower rate with a penalty, from a start
    that tried the penalty at a high rate). ``tried`` (key: the setting's JSON) gains the points."""
    if len(axes) < 2:
        return current
    a, b = axes[:2]
    while True:
        near = {k: _neighbours(grid, k, current[k], tried) for k in (a, b)}
        settings = [{**current, a: x, b: y} for x in near[a] for y in near[b]]
        todo = [s for s in settings if json.dumps(s, sort_keys=True) not in tried]
        for r in parallel(len(todo), [(fit, arch, grid, s, 0, out) for s in todo]):
            tried[json.dumps(r["setting"], sort_keys=True)] = r
        best = max((tried[json.dumps(s, sort_keys=True)] for s in settings), key=lambda r: score(grid, r))
        if best["setting"] == current:
            return current
        current = best["setting"]


def _neighbours(grid: dict, key: str, value: object, tried: dict[str, dict]) -> list:
    """``value`` and the values either side of it among the axis's grid values and those tried."""
    values = sorted(set(grid["axes"][key]["values"]) | {json.loads(k)[key] for k in tried} | {value})
    i = values.index(value)
    return values[max(0, i - 1) : i + 2]


def parallel(jobs: int, calls: list[tuple]) -> list[dict]:
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(fn, *args) for fn, *args in calls]
        return [f.result() for f in futures]


def tune(grid: dict, archs: list[str], out: Path, jobs: int) -> dict[str, dict]:
    """Every model's coordinate search (``search``) at once, sharing ``jobs`` fit slots."""
    found = dict(zip(archs, parallel(len(archs), [(search, grid, a, out) for a in archs])))
    return record_points(grid, archs, found, out)


def tune_joint(grid: dict, archs: list[str], out: Path) -> dict[str, dict]:
    """The search's last step (``joint``) alone, from each model's setting in ``chosen.json`` with
    the points of ``tuning.json``: what ``tune`` now ends with, for a tuning run before it did."""
    chosen = json.loads((out / "chosen.json").read_text())
    rows = json.loads((out / "tuning.json").read_text())

    def one(arch: str) -> tuple[dict, list[dict]]:
        axes = grid["models"][arch].get("axes", list(grid["axes"]))
        mine = [r for r in rows if r["arch"] == arch and r["seed"] == 0]
        tried = {json.dumps(r["setting"], sort_keys=True): r for r in mine}
        return joint(grid, arch, axes, chosen[arch], tried, out), list(tried.values())

    return record_points(grid, archs, dict(zip(archs, parallel(len(archs), [(one, a) for a in archs]))), out)


def from_presets(grid: dict, archs: list[str], out: Path) -> dict[str, dict]:
    """chosen.json from the presets themselves: each model's axes at the values its preset gives
    (``preset_value``), which is where ``tune``'s choice is written by hand. For a checkout without
    ``tune``'s outputs, so ``final``, ``throughput`` and ``report`` can rerun today's table."""
    chosen = {}
    for arch in archs:
        axes = grid["models"][arch].get("axes", list(grid["axes"]))
        chosen[arch] = {k: preset_value(grid, arch, k) for k in axes}
        print(f"{arch}: {json.dumps(chosen[arch])} (from {grid['models'][arch]['config']})")
    _merge_dict(out / "chosen.json", chosen)
    return chosen


def _choose(grid: dict, arch: str, ranked: list[dict], found: dict) -> dict:
    """The search's point ``found``, or with ``models.<arch>.choose_where`` (settings a choice must
    have, e.g. no dropout where attention dropout costs the training rate a target needs) the best
    of the ``ranked`` points that have them."""
    where = grid["models"][arch].get("choose_where")
    if not where:
        return next(r for r in ranked if r["setting"] == found)
    return next(r for r in ranked if all(r["setting"].get(k) == v for k, v in where.items()))


def record_points(
    grid: dict, archs: list[str], found: dict[str, tuple], out: Path, replace: bool = True
) -> dict[str, dict]:
    """Print every model's points (best first) and merge them into tuning.json (in place of the
    archs' old rows, unless not ``replace``), the choices into chosen.json; the chosen points."""
    results = [r for a in archs for r in found[a][1]]
    chosen = {}
    for arch in archs:
        mine = sorted(found[arch][1], key=lambda r: -score(grid, r))
        chosen[arch] = _choose(grid, arch, mine, found[arch][0])
        print(f"\n{arch}: validation {' + '.join(grid['score'])} per point (best first)")
        for r in mine:
            print(
                f"  {json.dumps(r['setting'])}: AUC {r['val_auc']:.4f}  GAUC {r['val_gauc']:.4f}  "
                f"best at epoch {r['best_epoch']} (validation {r['best_validation']}/{r['validations']})"
                f"{'  HIT THE CAP' if r['hit_cap'] else ''}  ({r['fit_seconds']:.0f} s)"
            )
    _merge(out / "tuning.json", results, replace=archs if replace else [])
    _merge_dict(out / "chosen.json", {a: r["setting"] for a, r in chosen.items()})
    return chosen


def evaluate(r: dict, data: str) -> dict:
    return {**r, **cli_runs.evaluate(Path(r["checkpoint"]), data, Path(r["run"]) / "eval-test.json")}


def paired(ref: dict, other: dict, out: Path, data: str) -> dict:
    path = out / "paired" / f"{Path(ref['run']).parent.name}-vs-{Path(other['run']).parent.name}.json"
    return cli_runs.paired(Path(ref["checkpoint"]), Path(other["checkpoint"]), data, path)


def final(grid: dict, archs: list[str], seeds: list[int], out: Path, jobs: int, reference: str) -> list[dict]:
    chosen = json.loads((out / "chosen.json").read_text())
    missing = [a for a in archs if a not in chosen]
    if missing:
        raise SystemExit(f"no chosen setting for {missing} in {out / 'chosen.json'}: run --stage tune first")
    calls = [(fit, a, grid, chosen[a], s, out) for s in seeds for a in archs]
    results = parallel(jobs, [(evaluate, r, grid["data_dir"]) for r in parallel(jobs, calls)])
    _merge(out / "final.json", results)
    tests = []
    for r in results:
        if r["arch"] == reference or reference not in archs:
            continue
        ref = next(x for x in results if x["arch"] == reference and x["seed"] == r["seed"])
        tests.append({"seed": r["seed"], "baseline": r["arch"], **paired(ref, r, out, grid["data_dir"])})
    (out / "paired.json").write_text(json.dumps(tests, indent=2))
    report(results, tests, archs, reference)
    return results


def report(results: list[dict], tests: list[dict], archs: list[str], reference: str) -> None:
    heads = ("AUC mean", "sd", "CI half", "GAUC", "GAUC min", "logloss")
    print(f"\n{'model':15s} " + " ".join(f"{h:>9s}" for h in heads))
    for arch in archs:
        rs = [r for r in results if r["arch"] == arch]
        aucs, gaucs = [r["auc"] for r in rs], [r["gauc"] for r in rs]
        sd = statistics.stdev(aucs) if len(aucs) > 1 else float("nan")
        half = statistics.mean((r["auc_hi"] - r["auc_lo"]) / 2 for r in rs)
        ll = statistics.mean(r["logloss"] for r in rs)
        cells = (statistics.mean(aucs), sd, half, statistics.mean(gaucs), min(gaucs), ll)
        print(f"{arch:15s} " + " ".join(f"{c:9.4f}" for c in cells))
    for t in tests:
        print(
            f"{reference} - {t['baseline']:15s} seed {t['seed']}: AUC {t['diff']:+.4f} "
            f"[{t['lo']:+.4f}, {t['hi']:+.4f}]  p = {t['p_value']:.2g}"
        )


def _load_stages(out: Path) -> tuple[list[dict], list[dict], dict, dict]:
    """final.json, paired.json, chosen.json and throughput.json's models (empty when not run)."""
    final_rows = json.loads((out / "final.json").read_text())
    tests = json.loads((out / "paired.json").read_text())
    chosen = json.loads((out / "chosen.json").read_text())
    speed_path = out / "throughput.json"
    speed = json.loads(speed_path.read_text())["models"] if speed_path.is_file() else {}
    return final_rows, tests, chosen, speed


def _setting_text(setting: dict) -> str:
    """A setting as the report writes it: ``lr 0.001, embedding_l2 0.001, dropout 0``."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v:g}" for k, v in setting.items())


def _model_row(arch: str, rs: list[dict], setting: dict, speed: dict) -> str:
    """One model's line of the table: its runs over the seeds (``rs``, seed order)."""
    aucs, gaucs = [r["auc"] for r in rs], [r["gauc"] for r in rs]
    sd = statistics.stdev(aucs) if len(aucs) > 1 else float("nan")
    half = statistics.mean((r["auc_hi"] - r["auc_lo"]) / 2 for r in rs)
    chosen = _setting_text(setting)
    sps = f"{speed[arch]['samples_per_s']:,.0f}" if arch in speed else "-"
    peaks = "/".join(str(r["best_epoch"]) for r in rs)
    capped = sum(bool(r.get("hit_cap")) for r in rs)
    val_auc, val_gauc = (statistics.mean(r[k] for r in rs) for k in ("val_auc", "val_gauc"))
    return (
        f"| {arch} | {chosen} | {peaks} | {capped}/{len(rs)} | {val_auc:.4f} "
        f"| {val_gauc:.4f} | {statistics.mean(aucs):.4f} ± {sd:.4f} "
        f"| {half:.4f} | {statistics.mean(gaucs):.4f} ({min(gaucs):.4f}) "
        f"| {statistics.mean(r['logloss'] for r in rs):.4f} | {sps} |"
    )


def markdown(out: Path, archs: list[str], reference: str) -> str:
    """docs/quality.md's table from the stages' JSON files (``--stage report``): per model its
    chosen setting, the epoch each seed's best validation came at and how many runs reached the
    epoch cap, mean validation AUC and GAUC (the checkpoints kept), test AUC, GAUC and logloss;
    then each seed's test GAUC and the paired DeLong tests."""
    final_rows, tests, chosen, speed = _load_stages(out)
    # final.json keeps the runs of earlier chosen settings too: the table is the current choice's.
    mine = lambda r, a: r["arch"] == a and r["setting"] == chosen[a]  # noqa: E731
    by_arch = {a: sorted((r for r in final_rows if mine(r, a)), key=lambda r: r["seed"]) for a in archs}
    lines = [
        "| model | chosen on validation | peak epoch per seed | hit the cap | val AUC | val GAUC "
        "| test AUC (mean ± sd) | CI half-width | test GAUC mean (min) | logloss | train samples/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_model_row(a, by_arch[a], chosen[a], speed) for a in archs]
    seeds = sorted({r["seed"] for r in final_rows})
    lines += ["", "Test GAUC per seed (" + " / ".join(str(s) for s in seeds) + "):", ""]
    head = [" | ".join(f"seed {s}" for s in seeds) + " |", "| --- |" + " --- |" * len(seeds)]
    lines += ["| model | " + head[0], head[1]]
    for a in archs:
        lines.append(f"| {a} | " + " | ".join(f"{r['gauc']:.4f}" for r in by_arch[a]) + " |")
    lines += ["", f"Paired DeLong tests, AUC({reference}) - AUC(baseline), on the same test rows:", ""]
    lines += ["| baseline | " + head[0], head[1]]
    for b in [a for a in archs if a != reference]:
        cells = [
            f"{t['diff']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}]"
            for s in seeds
            for t in tests
            if t["baseline"] == b and t["seed"] == s
        ]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines += ["", *targets(by_arch, tests, reference), *_tuning_lines(out, archs)]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def _tuning_lines(out: Path, archs: list[str]) -> list[str]:
    """Every point of each model's search (``tuning.json``, seed 0, validation only), best score
    first: the setting, val AUC and the GAUC of that checkpoint, the epoch of the best validation
    and whether the run reached the epoch cap."""
    path = out / "tuning.json"
    if not path.is_file():
        return []
    tuning = json.loads(path.read_text())
    lines = ["", "Tuning on validation (seed 0), every point tried, best val AUC + GAUC first:"]
    for arch in archs:
        rs = sorted((r for r in tuning if r["arch"] == arch), key=lambda r: -(r["val_auc"] + r["val_gauc"]))
        lines += [
            "",
            f"{arch}:",
            "",
            "| setting | val AUC | val GAUC | peak epoch | hit the cap |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rs:
            setting = _setting_text(r["setting"])
            cap = "yes" if r.get("hit_cap") else "no"
            lines.append(
                f"| {setting} | {r['val_auc']:.4f} | {r['val_gauc']:.4f} | {r['best_epoch']} | {cap} |"
            )
    return lines


def targets(by_arch: dict[str, list[dict]], tests: list[dict], reference: str) -> list[str]:
    """Issue 29's targets per seed: the reference's test GAUC against popularity's + 0.02 and the
    best baseline's + 0.005; its test AUC against the best baseline's + 0.005 with the paired
    interval above zero; its mean validation AUC against every baseline's."""
    ref = by_arch.get(reference, [])
    others = {a: rs for a, rs in by_arch.items() if a != reference and rs}
    if not ref or not others:
        return []
    out = ["Targets (test, per seed; the best baseline by that seed's value):", ""]
    for r in ref:
        seed = r["seed"]
        mine = {a: next(x for x in rs if x["seed"] == seed) for a, rs in others.items()}
        g_best = max(mine, key=lambda a: mine[a]["gauc"])
        a_best = max(mine, key=lambda a: mine[a]["auc"])
        pop = mine.get("popularity")
        t = next((t for t in tests if t["baseline"] == a_best and t["seed"] == seed), None)
        out.append(
            f"- seed {seed}: GAUC {r['gauc']:.4f}"
            + (f", popularity + {r['gauc'] - pop['gauc']:+.4f} (target +0.02)" if pop else "")
            + f", {g_best} + {r['gauc'] - mine[g_best]['gauc']:+.4f} (target +0.005); AUC {a_best} + "
            f"{r['auc'] - mine[a_best]['auc']:+.4f} (target +0.005)"
            + (f", paired interval [{t['lo']:+.4f}, {t['hi']:+.4f}]" if t else "")
        )
    val = {a: statistics.mean(x["val_auc"] for x in rs) for a, rs in [(reference, ref), *others.items()]}
    best = max(others, key=lambda a: val[a])
    said = f"{reference} {val[reference]:.4f}, best baseline {best} {val[best]:.4f}"
    out.append(f"- mean validation AUC: {said}")
    return out


def _merge(path: Path, rows: list[dict], replace: list[str] = ()) -> None:
    """Rows into the JSON list at ``path``, a row per (arch, setting, seed), newest kept; the old
    rows of the ``replace`` archs dropped (a search's points are all in its rows)."""
    old = [r for r in json.loads(path.read_text()) if r["arch"] not in replace] if path.is_file() else []
    key = lambda r: (r["arch"], json.dumps(r["setting"], sort_keys=True), r["seed"])
    merged = {key(r): r for r in [*old, *rows]}
    path.write_text(json.dumps(list(merged.values()), indent=2))


def _merge_dict(path: Path, d: dict) -> None:
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **d}, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--stage",
        choices=["tune", "joint", "presets", "final", "throughput", "report", "all"],
        default="all",
    )
    p.add_argument("--grid", type=Path, default=ROOT / "configs" / "quality" / "grid.yaml")
    p.add_argument("--archs", nargs="+", default=None, help="models of the grid (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="fits at a time, one torch thread each")
    p.add_argument("--reference", default="transformer")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "quality")
    a = p.parse_args()
    global SLOTS
    SLOTS = threading.BoundedSemaphore(a.jobs)
    grid = load_grid(a.grid)
    archs = a.archs or list(grid["models"])
    a.out.mkdir(parents=True, exist_ok=True)
    if grid["data_dir"] == "data/movielens" and not (ROOT / "data/movielens/spec.yaml").is_file():
        cli_runs.run([sys.executable, "-m", "recformer", "data", "movielens", "--out", "data/movielens"])
    if a.stage in ("tune", "all"):
        tune(grid, archs, a.out, a.jobs)
    if a.stage == "joint":
        tune_joint(grid, archs, a.out)
    if a.stage == "presets":
        from_presets(grid, archs, a.out)
    if a.stage in ("final", "all"):
        final(grid, archs, a.seeds, a.out, a.jobs, a.reference)
    if a.stage in ("throughput", "all"):
        from bench_throughput import main as throughput  # noqa: PLC0415 (the stage's own script)

        throughput(
            ["--grid", str(a.grid), "--chosen", str(a.out / "chosen.json"), "--archs", *archs]
            + ["--data", str(ROOT / grid["data_dir"]), "--out", str(a.out / "throughput.json")]
            + ["--steps", str(THROUGHPUT_STEPS)]
        )
    if a.stage in ("report", "all"):
        print("\n" + markdown(a.out, archs, a.reference))


if __name__ == "__main__":
    main()
