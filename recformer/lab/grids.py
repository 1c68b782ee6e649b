"""A lab grid (``configs/lab/<name>.yaml``) read into the points it runs.

A grid file names the configs every point starts from, the data, the settings every point shares,
the axes whose product makes the points, the seeds, and sizes (``smoke``, ``full``) whose keys
replace the top-level ones::

    description: Depth x norm placement
    configs: [configs/model/small.yaml, configs/data/synthetic.yaml]
    data: {synth: {rows: 20000, order: 2}}     # or {data_dir: data/movielens}
    settings: {trainer.max_epochs: 1}
    axes: {model.ranker.n_layers: [2, 8], model.ranker.norm_placement: [post, pre]}
    seeds: [0]
    sizes: {smoke: {axes: {model.ranker.n_layers: [2, 4]}}, full: {seeds: [0, 1, 2]}}
    plots: [{x: model.ranker.n_layers, y: val_auc, series: model.ranker.norm_placement}]
    best: {over: model.optim.lr, y: val_logloss, mode: min, per: [param, width], drift: width}

An axis value may also be a mapping of several settings that move together (a *variant*:
``{name: pre+lns, model.ranker.norm_placement: pre, model.ranker.layernorm_scaling: true}``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
GRIDS_DIR = REPO_ROOT / "configs" / "lab"
TRACE_NAMES = ("attn_logit_max", "attn_entropy")
"""The metrics a ``trace:`` plot draws over training (``recformer.lab.report.TRACES``)."""

SIZE_KEYS = ("configs", "data", "settings", "axes", "seeds", "plots", "best", "description")


@dataclass(frozen=True)
class Point:
    """One run of a grid: its settings (``--key=value`` of ``recformer fit``), seed and labels."""

    settings: dict[str, Any]
    seed: int
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Readable and unique: the axis labels, the seed, and a digest of every setting."""
        digest = hashlib.sha1(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:8]
        tag = "-".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.labels.items())
        return f"{tag}-seed{self.seed}-{digest}".replace("/", "_")


@dataclass
class Grid:
    name: str
    size: str
    description: str
    configs: list[str]
    data: dict[str, Any]
    settings: dict[str, Any]
    axes: dict[str, list[Any]]
    seeds: list[int]
    plots: list[dict[str, Any]]
    best: dict[str, Any] = field(default_factory=dict)
    """Optional: the best value of an axis per group, and how far it drifts (``report.best_rows``)."""

    def points(self) -> list[Point]:
        keys = list(self.axes)
        out = []
        for combo in itertools.product(*(self.axes[k] for k in keys)):
            settings, labels = dict(self.settings), {}
            for key, value in zip(keys, combo):
                if isinstance(value, dict):  # a variant: several settings under one label
                    labels[key] = str(value["name"])
                    settings.update({k: v for k, v in value.items() if k != "name"})
                else:
                    labels[key] = str(value)
                    settings[key] = value
            out.extend(Point(settings, seed, labels) for seed in self.seeds)
        return out


def config_path(config: str) -> Path:
    """A grid's config file: a relative path is the repository's (``configs/model/tiny.yaml``)."""
    path = Path(config)
    return path if path.is_absolute() else REPO_ROOT / path


def grid_path(name_or_path: str) -> Path:
    """``configs/lab/<name>.yaml`` for a bare name; a path as given."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    return GRIDS_DIR / f"{name_or_path}.yaml"


def list_grids() -> list[tuple[str, str, list[str]]]:
    """(name, description, sizes) of every grid in ``configs/lab/``."""
    out = []
    for path in sorted(GRIDS_DIR.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        out.append((path.stem, str(raw.get("description", "")).strip(), sorted(raw.get("sizes", {}))))
    return out


def load_grid(name_or_path: str, size: str) -> Grid:
    path = grid_path(name_or_path)
    if not path.is_file():
        names = ", ".join(name for name, _, _ in list_grids())
        raise FileNotFoundError(f"lab grid {path} does not exist; the grids in {GRIDS_DIR}: {names}")
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"lab grid {path}: expected a YAML mapping")
    sizes = raw.get("sizes", {})
    if size not in sizes:
        raise ValueError(f"lab grid {path}: no size {size!r}; it has {', '.join(sorted(sizes)) or 'none'}")
    merged = {k: v for k, v in raw.items() if k != "sizes"} | (sizes[size] or {})
    unknown = sorted(set(merged) - set(SIZE_KEYS))
    if unknown:
        raise ValueError(f"lab grid {path} (size {size}): unknown keys {unknown}; expected {list(SIZE_KEYS)}")
    grid = Grid(
        name=path.stem,
        size=size,
        description=str(merged.get("description", "")).strip(),
        configs=list(merged.get("configs", [])),
        data=dict(merged.get("data", {})),
        settings=dict(merged.get("settings", {})),
        axes=dict(merged.get("axes", {})),
        seeds=list(merged.get("seeds", [0])),
        plots=list(merged.get("plots", [])),
        best=dict(merged.get("best", {})),
    )
    _check(grid, path)
    return grid


def _check(grid: Grid, path: Path) -> None:
    where = f"lab grid {path} (size {grid.size})"
    if set(grid.data) not in ({"synth"}, {"data_dir"}):
        raise ValueError(f"{where}: data must be {{synth: {{...}}}} or {{data_dir: DIR}}, got {grid.data}")
    for config in grid.configs:
        if not config_path(config).is_file():
            raise FileNotFoundError(f"{where}: config {config_path(config)} does not exist")
    for key, values in grid.axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: axes.{key} must be a non-empty list")
        for v in values:
            if isinstance(v, dict) and "name" not in v:
                raise ValueError(f"{where}: axes.{key}: a variant {v} needs a name")
    if not grid.seeds or not all(isinstance(s, int) for s in grid.seeds):
        raise ValueError(f"{where}: seeds must be a non-empty list of integers, got {grid.seeds}")
    for i, spec in enumerate(grid.plots):
        if "trace" in spec:
            if spec["trace"] not in TRACE_NAMES or spec.get("series") not in grid.axes:
                raise ValueError(
                    f"{where}: plots[{i}]: a trace plot needs trace: one of {list(TRACE_NAMES)} "
                    f"and series: an axis of the grid, got {spec}"
                )
        elif "x" not in spec or "y" not in spec:
            raise ValueError(f"{where}: plots[{i}] needs x and y (or trace), got {spec}")
