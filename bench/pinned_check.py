"""The loader's pinned path on a GPU: batches padded straight into pinned memory, then copied to the
device asynchronously, against the same batches unpinned (issue 2's "pinned memory" item; CI and the
dev machine have no GPU, where the tests check only the structure the asynchronous copy relies on).

    python bench/pinned_check.py --data /tmp/bench_synth --batches 400 --json bench/out/pinned.json

Checks, for ``--workers`` forked workers and ``--batches`` training batches:
- every field of every pinned batch is pinned, and is a view of one pinned buffer per batch;
- the batches copied with ``Batch.to(device, non_blocking=True)`` equal the unpinned loader's
  batches (same seed, same order) field by field once on the device;
- the copy of held pinned batches: ``Batch.to`` (compact copy, widened on the device) against
  widening the id fields on the host first (what ``to(device, dtype=long)`` does);
- rows/s of the loader plus the host-to-device copy, pinned against unpinned, side by side in
  alternating rounds (medians), and the copy's share of the time.
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recformer.data.datamodule import RecDataModule  # noqa: E402


def loader(data: Path, workers: int, pin: bool, batch_size: int):
    dm = RecDataModule(
        str(data), batch_size=batch_size, num_workers=workers, validate="footer", pin_memory=pin
    )
    dm.setup("fit")
    return dm.train_dataloader()


def check_equal(data: Path, workers: int, n: int, batch_size: int, device: torch.device) -> dict:
    """Pinned batches copied asynchronously equal the unpinned ones, and are pinned views."""
    want = []
    for i, b in enumerate(loader(data, workers, False, batch_size)):
        if i == n:
            break
        want.append(b)
    mismatched, unpinned, shared = [], 0, 0
    got = []
    for i, b in enumerate(loader(data, workers, True, batch_size)):
        if i == n:
            break
        tensors = b.tensors()
        unpinned += sum(not t.is_pinned() for t in tensors.values())
        storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
        shared += len(storages) == 1
        got.append(b.to(device, non_blocking=True))
    torch.cuda.synchronize(device)
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.to(device)
        for name, t in g.tensors().items():
            if not torch.equal(t, w.tensors()[name]):
                mismatched.append((i, name))
    return {
        "batches": len(got),
        "unpinned_fields": unpinned,
        "batches_in_one_pinned_buffer": shared,
        "mismatched_fields": mismatched[:20],
    }


def timed(data: Path, workers: int, pin: bool, n: int, batch_size: int, device: torch.device) -> dict:
    """rows/s over ``n`` batches (after the first) of loading and copying to the device, and the
    seconds spent in the copy calls."""
    rows, copy_s, t0 = 0, 0.0, None
    for i, b in enumerate(loader(data, workers, pin, batch_size)):
        if i == 0:
            t0 = time.perf_counter()
            continue
        c = time.perf_counter()
        on_device = b.to(device, non_blocking=pin)
        copy_s += time.perf_counter() - c
        rows += len(on_device.label)
        if i == n:
            break
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return {"rows_s": rows / wall, "copy_share": copy_s / wall}


def widen_then_copy(batch, device: torch.device):
    """The copy as ``Batch.to`` made it before 2026-11-30: int64 asked of the copy itself, which
    PyTorch does on the host (unpinned temporaries, 4.6x the bytes)."""
    from recformer.batch import ID_FIELDS

    return {
        name: t.to(device, dtype=torch.long if name in ID_FIELDS else None, non_blocking=True)
        for name, t in batch.tensors().items()
    }


def copy_styles(data: Path, workers: int, n: int, batch_size: int, device: torch.device) -> dict:
    """Seconds per batch of the copy alone, for the same pinned batches held in memory: ``Batch.to``
    (copy compact, widen on the device) against widening on the host."""
    held = []
    for i, b in enumerate(loader(data, workers, True, batch_size)):
        if i == n:
            break
        held.append(b)
    out = {}
    for name, copy in (("copy_then_widen", lambda b: b.to(device, non_blocking=True)),
                       ("widen_then_copy", lambda b: widen_then_copy(b, device))):  # fmt: skip
        times = []
        for _ in range(3):
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            for b in held:
                copy(b)
            torch.cuda.synchronize(device)
            times.append((time.perf_counter() - t) / len(held))
        out[name] = statistics.median(times)
    out["ratio"] = out["widen_then_copy"] / out["copy_then_widen"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("/tmp/bench_synth"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the pinned path is not exercised here (the tests check its structure)")
        return
    device = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(device), "workers": a.workers, "batch_size": a.batch_size}
    out["equal"] = check_equal(a.data, a.workers, min(a.batches, 50), a.batch_size, device)
    print("correctness:", json.dumps(out["equal"]))
    out["copy"] = copy_styles(a.data, a.workers, min(a.batches, 100), a.batch_size, device)
    print(
        f"copy of a held pinned batch: {out['copy']['copy_then_widen'] * 1e6:.0f} us (Batch.to) against "
        f"{out['copy']['widen_then_copy'] * 1e6:.0f} us widening on the host ({out['copy']['ratio']:.2f}x)"
    )
    runs = {True: [], False: []}
    for _ in range(a.repeats):
        for pin in (True, False):
            runs[pin].append(timed(a.data, a.workers, pin, a.batches, a.batch_size, device))
    for pin, rs in runs.items():
        name = "pinned" if pin else "unpinned"
        out[name] = {
            "rows_s": statistics.median(r["rows_s"] for r in rs),
            "copy_share": statistics.median(r["copy_share"] for r in rs),
            "runs": rs,
        }
        print(
            f"{name:9s} {out[name]['rows_s']:12,.0f} rows/s (load + copy to {out['device']}), "
            f"{out[name]['copy_share']:.2f} of the time in the copy calls"
        )
    out["pinned_vs_unpinned"] = out["pinned"]["rows_s"] / out["unpinned"]["rows_s"]
    print(f"pinned / unpinned: {out['pinned_vs_unpinned']:.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
