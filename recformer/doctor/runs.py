"""A run directory read into step-sorted series: ``health.jsonl`` merged with Lightning's ``metrics.csv``."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recformer.callbacks.sink import HEALTH_FILE

METRICS_CSV = "metrics.csv"
"""The file Lightning's CSVLogger writes in the run directory (loss, validation metrics)."""


@dataclass
class Series:
    steps: np.ndarray
    values: np.ndarray

    def tail(self, fraction: float) -> Series:
        """The last ``fraction`` of the points (at least one)."""
        n = len(self.steps)
        k = max(1, math.ceil(n * fraction))
        return Series(self.steps[n - k :], self.values[n - k :])


class RunMetrics:
    """Every metric of a run as step-sorted series, plus the ``meta`` the sink recorded."""

    def __init__(self, series: dict[str, Series], meta: dict[str, Any], sources: list[str]) -> None:
        self.series = series
        self.meta = meta
        self.sources = sources

    def get(self, name: str) -> Series | None:
        s = self.series.get(name)
        return s if s is not None and len(s.steps) else None

    def per_block(self, fmt: str) -> dict[int, Series]:
        """``{block: series}`` for a ``..._{i}`` metric name from ``recformer.metric_names``."""
        pattern = re.compile("^" + re.escape(fmt).replace(re.escape("{i}"), r"(\d+)") + "$")
        out = {}
        for name, s in self.series.items():
            m = pattern.match(name)
            if m and len(s.steps):
                out[int(m.group(1))] = s
        return dict(sorted(out.items()))

    def matching(self, fmt: str) -> dict[str, Series]:
        """``{key: series}`` for a name with one other placeholder (``{group}``, ``{table}/p{q}``)."""
        regex = re.escape(fmt)
        for ph in re.findall(r"\{(\w+)\}", fmt):
            regex = regex.replace(re.escape("{" + ph + "}"), r"(.+?)")
        pattern = re.compile("^" + regex + "$")
        out = {}
        for name, s in sorted(self.series.items()):
            m = pattern.match(name)
            if m and len(s.steps):
                out["/".join(m.groups())] = s
        return out

    @property
    def n_steps(self) -> int:
        return int(max((s.steps[-1] for s in self.series.values() if len(s.steps)), default=0))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _read_health(health: Path, points: dict[str, dict[int, float]], meta: dict[str, Any]) -> None:
    """Add the numeric values of each ``{"step": ..., name: value}`` line to ``points`` and each
    ``{"meta": {...}}`` line to ``meta``."""
    with health.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                # A run killed mid-write leaves a torn last line; anything else is corruption.
                print(f"doctor: {health}:{lineno}: skipped unreadable line ({e})", file=sys.stderr)
                continue
            if "meta" in record:
                meta.update(record["meta"])
                continue
            step = int(record.pop("step"))
            for name, value in record.items():
                if isinstance(value, (int, float)):
                    points[name][step] = float(value)


def _read_csv(csv_path: Path, points: dict[str, dict[int, float]]) -> None:
    """Add each numeric cell of a CSVLogger file to ``points`` where ``points`` has no value yet."""
    with csv_path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            step = _number(row.get("step", ""))
            if step is None:
                continue
            for name, text in row.items():
                value = _number(text)
                if name in ("step", "epoch") or value is None:
                    continue
                points[name].setdefault(int(step), value)


def load_run(run_dir: Path) -> RunMetrics:
    """Merge ``health.jsonl`` and ``metrics.csv`` of a run directory (the JSONL wins on overlap)."""
    points: dict[str, dict[int, float]] = defaultdict(dict)
    meta: dict[str, Any] = {}
    sources = []
    health = run_dir / HEALTH_FILE
    if health.is_file():
        sources.append(str(health))
        _read_health(health, points, meta)
    csv_path = run_dir / METRICS_CSV
    if csv_path.is_file():
        sources.append(str(csv_path))
        _read_csv(csv_path, points)
    series = {}
    for name, by_step in points.items():
        steps = np.array(sorted(by_step), dtype=np.int64)
        series[name] = Series(steps, np.array([by_step[s] for s in steps], dtype=np.float64))
    return RunMetrics(series, meta, sources)
