"""A dataset folder with one input left out, for measuring what that input does.

    python bench/data_variant.py --data data/movielens --drop time_gaps     # -> data/movielens-nogap
    python bench/data_variant.py --data data/ml100k --drop time_gaps        # -> data/ml100k-nogap
    python bench/data_variant.py --data data/movielens --drop user_id       # -> data/movielens-nouser

The variant's files are links to the source folder's (train/, val/, test/, items.parquet, vocab/,
README.txt); only its ``spec.yaml`` differs: the dropped input's column moves to ``unused`` with a
note, so the loader reads the same rows and the models see one input fewer. ``time_gaps``: the
sequence's ``time_gap_column`` (the history's time-gap buckets); ``user_id``: the context
categorical of that name (it stays the GAUC group and a key). A levers spec then points a variant
at the folder (``--data.data_dir=...``; configs/quality/levers_deepfm.yaml).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

LINKED = ("train", "val", "test", "items.parquet", "vocab", "README.txt")
SUFFIX = {"time_gaps": "nogap", "user_id": "nouser"}


def variant_spec(spec: dict, drop: str, source: Path) -> dict:
    """``spec`` with ``drop`` left out (its column noted under ``unused``)."""
    spec = dict(spec, unused=dict(spec.get("unused") or {}))
    if drop == "time_gaps":
        column = (spec.get("sequence") or {}).get("time_gap_column")
        if not column:
            raise ValueError(
                f"{source / 'spec.yaml'}: sequence.time_gap_column is not set: no time gaps to drop"
            )
        spec["sequence"] = dict(spec["sequence"], time_gap_column=None)
    else:
        names = [f["name"] for f in spec.get("categorical") or []]
        if drop not in names:
            raise ValueError(f"{source / 'spec.yaml'}: no categorical named {drop!r} (it has {names})")
        spec["categorical"] = [f for f in spec["categorical"] if f["name"] != drop]
        column = drop
    spec["unused"][column] = f"left out by bench/data_variant.py --drop {drop}"
    return spec


def make_variant(data: Path, drop: str, out: Path) -> Path:
    spec = variant_spec(yaml.safe_load((data / "spec.yaml").read_text()), drop, data)
    out.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (data / name).exists() and not (out / name).exists():
            (out / name).symlink_to((data / name).resolve())
    (out / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="dataset folder with spec.yaml")
    p.add_argument("--drop", choices=list(SUFFIX), required=True)
    p.add_argument("--out", type=Path, default=None, help="default: DATA-nogap / DATA-nouser")
    a = p.parse_args(argv)
    if not (a.data / "spec.yaml").is_file():
        raise SystemExit(f"{a.data / 'spec.yaml'}: not found (build the data first)")
    out = a.out or a.data.with_name(f"{a.data.name}-{SUFFIX[a.drop]}")
    print(f"{make_variant(a.data, a.drop, out)}: {a.data} without {a.drop}")


if __name__ == "__main__":
    main()
