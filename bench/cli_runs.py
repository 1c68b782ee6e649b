"""What the quality benches share: ``recformer fit`` and ``recformer evaluate`` run as a user runs
them (subprocesses of the CLI), the best validation checkpoint of a run, its test metrics, and the
paired DeLong test of two checkpoints on the same rows, and whether a cached run still is the point
it stands for (``stale``)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from recformer.metric_names import VAL_SCORE

ROOT = Path(__file__).resolve().parents[1]
TRAINER_CONFIG = ROOT / "configs" / "trainer.yaml"
"""The CLI's default config (``recformer.cli.DEFAULT_TRAINER_CONFIG``): its callbacks are every
fit's unless a config replaces the list."""
METRICS = ("auc", "auc_lo", "auc_hi", "gauc", "gauc_groups", "logloss", "ne", "calibration", "rows")
"""The fields of ``recformer evaluate``'s JSON a bench row keeps."""


def run(cmd: list[str], threads: int | None = None) -> str:
    """``cmd`` from the repository root; its stdout, or its stderr's tail in the error."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def fit(
    configs: list[str], args: list[str], logs: Path, name: str, threads: int | None = None
) -> tuple[Path, float]:
    """``recformer fit --config C ... ARGS`` logging to ``<logs>/<name>/version_0`` (CSV only);
    that folder and the fit's wall seconds."""
    loggers = logs / f"{name}-loggers.yaml"
    loggers.parent.mkdir(parents=True, exist_ok=True)
    loggers.write_text(
        "trainer:\n  logger:\n    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {logs}, name: {name}, version: 0}}\n"
    )
    cmd = [sys.executable, "-m", "recformer", "fit"]
    for c in [*configs, str(loggers)]:
        cmd += ["--config", c]
    start = time.perf_counter()
    run(cmd + ["--trainer.enable_progress_bar=false", *args], threads)
    return logs / name / "version_0", time.perf_counter() - start


def best_checkpoint(run_dir: Path) -> Path:
    """The run's monitored best checkpoint (the one file beside ``last.ckpt``)."""
    best = [p for p in (run_dir / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    if len(best) != 1:
        raise RuntimeError(f"expected one best checkpoint in {run_dir / 'checkpoints'}, found {best}")
    return best[0]


def validations(run_dir: Path) -> tuple[list[dict], dict]:
    """The run's validation rows of ``metrics.csv``, in order, and the one its kept checkpoint
    comes from: the best ``val/auc_gauc`` (``configs/trainer.yaml``'s monitor), or ``val/auc`` in a
    run from before that metric was logged (its monitor then)."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    val = [r for r in rows if r.get("val/auc")]
    key = VAL_SCORE if all(r.get(VAL_SCORE) for r in val) else "val/auc"
    return val, max(val, key=lambda r: float(r[key]))


def _evaluate_once(ckpt: Path, data_dir: str, out: Path, *extra: str) -> dict:
    """``recformer evaluate --ckpt CKPT [EXTRA] --data DATA --out OUT`` unless ``out`` exists (run
    once); its JSON."""
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "recformer", "evaluate", "--ckpt", str(ckpt), *extra]
        run(cmd + ["--data", data_dir, "--out", str(out)])
    return json.loads(out.read_text())


def evaluate(ckpt: Path, data_dir: str, out: Path) -> dict:
    """``recformer evaluate`` of ``ckpt`` on the test split (kept in ``out``: run once)."""
    r = _evaluate_once(ckpt, data_dir, out)
    return {k: r[k] for k in METRICS}


def paired(ckpt: Path, other: Path, data_dir: str, out: Path) -> dict:
    """Paired DeLong test of AUC(ckpt) - AUC(other) on the same test rows (``evaluate --compare``)."""
    return _evaluate_once(ckpt, data_dir, out, "--compare", str(other))["compare"]


def cached(run_dir: Path, configs: list[str], args: list[str], paired: Path | None = None) -> dict | None:
    """A finished run's ``done.json`` when ``run_dir`` holds one made under what ``configs`` and
    ``args`` give now; else None, after a stale run has been set aside (``set_aside``) and said so."""
    if not (run_dir / "done.json").is_file():
        return None
    differ = stale(run_dir, configs, args)
    if not differ:
        return json.loads((run_dir / "done.json").read_text())
    aside = set_aside(run_dir.parent, paired)
    said = "; ".join(differ)
    print(f"{run_dir.parent.name}: the cached run differs from today's config ({said}); in {aside.name}")
    return None


def stale(run_dir: Path, configs: list[str], args: list[str]) -> list[str]:
    """What the config files' settings (every YAML leaf) and ``args`` (``--key=value``, later ones
    win; ``--key+=value`` appends to a list) give that ``run_dir``'s saved ``config.yaml`` does not
    hold: a cached run made before a preset changed is another point. A key the run lacks matches
    only the default of today's code (the run predates the option, which then behaved so)."""
    want: dict[str, object] = {}
    for path in configs:
        want |= _leaves(yaml.safe_load((ROOT / path).read_text()) or {})
    for arg in args:
        key, _, value = arg.removeprefix("--").partition("=")
        want[key] = _scalar(value)
    have = _leaves(yaml.safe_load((run_dir / "config.yaml").read_text()) or {})
    differ = _callbacks_missing(want, have)
    for key, value in want.items():
        if key == "trainer.callbacks":  # a config's own list: _callbacks_missing compared it
            continue
        if key.endswith("+"):  # an appended callback: one of the run's, same class and arguments
            item = {"class_path": value} if isinstance(value, str) else value
            ok = _among(have.get(key[:-1]) or [], item["class_path"], item.get("init_args") or {})
        elif key.startswith("trainer.callbacks.") and "trainer.callbacks" in have:
            ok = _last_callback_has(have["trainer.callbacks"], key.rsplit(".", 1)[1], value)
        else:
            ok = have[key] == value if key in have else _default(key) == value
        if not ok:
            differ.append(f"{key}: {value!r}, the run {have.get(key, 'unset')!r}")
    return differ


def _callbacks_missing(want: dict[str, object], have: dict[str, object]) -> list[str]:
    """The callbacks a fit under ``want`` starts with (``TRAINER_CONFIG``'s list, or the list a
    config replaces it with), each with its arguments less those ``--trainer.callbacks.NAME`` sets
    on the last one, that the run's saved list lacks: a run made before ``configs/trainer.yaml``
    changed (the early-stopping patience, the averaging window) is another point."""
    listed = want.get("trainer.callbacks")
    if listed is None:
        trainer = (yaml.safe_load(TRAINER_CONFIG.read_text()) or {}).get("trainer") or {}
        listed = trainer.get("callbacks") or []
    set_on_last = {key.rsplit(".", 1)[1] for key in want if key.startswith("trainer.callbacks.")}
    saved = have.get("trainer.callbacks") or []
    missing = []
    for i, callback in enumerate(listed):
        item = {"class_path": callback} if isinstance(callback, str) else callback
        args = dict(item.get("init_args") or {})
        if i == len(listed) - 1:
            args = {k: v for k, v in args.items() if k not in set_on_last}
        if not _among(saved, item["class_path"], args):
            missing.append(f"trainer.callbacks: {item['class_path']} {args}, not among the run's")
    return missing


def _among(saved: list[dict], class_path: str, args: dict) -> bool:
    """Whether one of a run's saved callbacks is a ``class_path`` with every one of ``args``."""
    same_class = (c.get("init_args") or {} for c in saved if c.get("class_path") == class_path)
    return any(args.items() <= init.items() for init in same_class)


def _last_callback_has(callbacks: list[dict], name: str, value: object) -> bool:
    """Whether the last of a run's callbacks has argument ``name`` at ``value``: what
    ``--trainer.callbacks.NAME=V`` sets (jsonargparse gives it to the last callback in the list)."""
    return bool(callbacks) and (callbacks[-1].get("init_args") or {}).get(name) == value


def _default(key: str) -> object:
    """The value today's code gives ``model.*`` settings nobody sets (a config field's or a
    ``RankerModule`` argument's default); a sentinel for any other key."""
    import dataclasses  # noqa: PLC0415 (here: only stale() needs recformer)
    import inspect  # noqa: PLC0415

    from recformer.config import OptimConfig, RankerConfig  # noqa: PLC0415
    from recformer.module import RankerModule  # noqa: PLC0415

    parts = key.split(".")
    if parts[:2] in (["model", "ranker"], ["model", "optim"]) and len(parts) == 3:
        config = RankerConfig if parts[1] == "ranker" else OptimConfig
        for f in dataclasses.fields(config):
            if f.name == parts[2]:  # a list field (cross_hidden) has a factory, not a default
                return f.default_factory() if f.default is dataclasses.MISSING else f.default
        return _UNKNOWN
    if parts[0] == "model" and len(parts) == 2:
        arg = inspect.signature(RankerModule.__init__).parameters.get(parts[1])
        return _UNKNOWN if arg is None else arg.default
    return _UNKNOWN


_UNKNOWN = object()


def _leaves(node: object, prefix: str = "") -> dict[str, object]:
    """A nested mapping as ``{"a.b.c": value}``; lists are values."""
    if not isinstance(node, dict):
        return {prefix: _scalar(node) if isinstance(node, str) else node}
    out: dict[str, object] = {}
    for k, v in node.items():
        out |= _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def _scalar(text: str) -> object:
    """A command-line or YAML string as the value it stands for (``3e-05`` is a float)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def set_aside(folder: Path, paired: Path | None = None) -> Path:
    """Rename a run's ``folder`` to the first free ``<folder>.stale-N`` and move the paired tests
    that name it (``paired``'s ``A-vs-B.json``, when given) into it: nothing is deleted, and
    nothing cached of the stale run is read as the new one's."""
    n = 1
    while (aside := folder.with_name(f"{folder.name}.stale-{n}")).exists():
        n += 1
    folder.rename(aside)
    for test in paired.glob("*.json") if paired is not None and paired.is_dir() else []:
        if folder.name in test.stem.split("-vs-"):
            test.rename(aside / test.name)
    return aside
