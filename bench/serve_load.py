"""Load test of ``recformer serve``: requests/s and p50 / p99 latency at 1, 8 and 64 concurrent
clients, each request ranking 100 candidates, with onnxruntime and with eager torch (the
torch.export program run op by op by PyTorch) behind the same server, in one run.

    python bench/serve_load.py --artifact exported/ --data data/movielens [--threads 1] [--seconds 15]

Requests are real rows: a MovieLens test row's user context and history (raw ids, raw dense
values, event timestamps: ``recformer.serve.replay``) with ``--candidates`` items drawn from the
test items, each with its item-side features (``--candidate-features``) from a row that item was
scored in. Bodies are serialised once, before the clock starts. Each client is an asyncio task in
a closed loop (send, wait for the answer, send the next), all on one aiohttp session. Both
servers run at once (idle, each waits on its queue: ~0 CPU); each level is measured ``--seconds``
per backend, in ``--rounds`` slices alternating between the backends (each after ``--warmup``
unmeasured seconds), so a neighbour's load falls on both alike. A request that is not a 200 stops
the run. The server runs one worker of ``--threads`` threads (stated in the table), and the client
shares the machine with it: the table also gives the machine's load (``/proc/loadavg``), the CPU
seconds the server and the client used, and each level's mean requests per batch (from
``/metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pyarrow.parquet as pq

from recformer.data.encode import read_item_ids
from recformer.serve.artifact import Artifact
from recformer.serve.launch import get, running_server
from recformer.serve.replay import log_requests

BACKENDS = {"onnx": "onnxruntime", "torch-export": "eager torch"}
ITEM_FEATURES = ("item_n_prior", "item_pos_rate_prior", "days_since_release")
"""MovieLens' per-item features: each candidate carries its own (the rest are the user's)."""


def request_bodies(artifact: Path, data: Path, n: int, candidates: int, features: list[str], seed: int = 0):
    """``n`` request bodies (bytes): a test row's context and history, ``candidates`` test items."""
    art = Artifact.open(artifact, "onnx" if (artifact / "model.onnx").is_file() else "torch-export")
    items = read_item_ids(art.item_ids_file, art.spec) if art.item_ids_file else None
    table = pq.read_table(sorted((data / "test").glob("*.parquet")))
    features = [f for f in features if f in {d.name for d in [*art.spec.dense, *art.spec.categorical]}]
    rng = random.Random(seed)
    rows = [r for r, _ in log_requests(table, art.spec, items, max_candidates=1)]
    # Each candidate item with the features it was scored with in some row (its own, not the user's).
    pool = [{"item": r["candidates"][0]["item"]} | {f: r["context"][f] for f in features} for r in rows]
    bodies = []
    for r in rng.sample(rows, min(n, len(rows))):
        context = {k: v for k, v in r["context"].items() if k not in features}
        cands = rng.sample(pool, candidates)
        bodies.append(json.dumps(r | {"context": context, "candidates": cands}).encode())
    return bodies


async def closed_loop(url: str, bodies: list[bytes], clients: int, seconds: float) -> tuple[list[float], int]:
    """``clients`` tasks sending in a closed loop for ``seconds``: each answered request's latency."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        i = k
        while time.perf_counter() < stop:
            start = time.perf_counter()
            async with session.post(f"{url}/predict", data=bodies[i % len(bodies)], headers=headers) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {body[:300]!r}")
            latencies.append(time.perf_counter() - start)
            i += clients

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(k, session) for k in range(clients)))
    return latencies, len(latencies)


def _cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (/proc)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat, the process group
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu(pgid: int, settle: float = 2.0, seconds: float = 5.0) -> float:
    """CPU seconds a second the server's processes use with no request in flight."""
    time.sleep(settle)
    start = _cpu_seconds(pgid)
    time.sleep(seconds)
    return round((_cpu_seconds(pgid) - start) / seconds, 3)


def measure(url: str, pgid: int, bodies: list[bytes], clients: int, seconds: float, warmup: float) -> dict:
    """One slice: ``warmup`` unmeasured seconds, then ``seconds`` measured, at ``clients``."""
    asyncio.run(closed_loop(url, bodies, clients, warmup))
    before = json.loads(get(f"{url}/metrics")[1])["batches"]
    server_cpu, client_cpu, load = _cpu_seconds(pgid), _client_cpu(), os.getloadavg()[0]
    start = time.perf_counter()
    latencies, done = asyncio.run(closed_loop(url, bodies, clients, seconds))
    wall = time.perf_counter() - start
    after = json.loads(get(f"{url}/metrics")[1])["batches"]
    return {
        "latencies": latencies,
        "seconds": wall,
        "batches": after["count"] - before["count"],
        "batched_requests": after["requests"] - before["requests"],
        "server_cpu_s": _cpu_seconds(pgid) - server_cpu,
        "client_cpu_s": _client_cpu() - client_cpu,
        "loadavg_1m": [load],
    }


def summary(slices: list[dict], clients: int) -> dict:
    """A level's figures over its slices."""
    ms = np.concatenate([np.array(s["latencies"]) for s in slices]) * 1e3
    total = lambda k: sum(s[k] for s in slices)
    return {
        "clients": clients,
        "requests": len(ms),
        "seconds": round(total("seconds"), 2),
        "rps": len(ms) / total("seconds"),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "requests_per_batch": round(total("batched_requests") / max(total("batches"), 1), 2),
        "server_cpu_s": round(total("server_cpu_s"), 1),
        "client_cpu_s": round(total("client_cpu_s"), 1),
        "loadavg_1m": [round(x, 2) for s in slices for x in s["loadavg_1m"]],
    }


def run(a: argparse.Namespace) -> dict:
    """Both servers up (an idle one takes no CPU: ``idle_cpu_per_s``); each level runs in
    ``--rounds`` slices per backend, alternating which goes first, so both see the same load from
    whatever else runs on the machine."""
    bodies = request_bodies(a.artifact, a.data, a.requests, a.candidates, a.candidate_features)
    server_args = ["--threads", str(a.threads), "--workers", "1", "--max-batch", str(a.max_batch)]
    server_args += ["--batch-timeout-ms", str(a.batch_timeout_ms), "--log-level", "error"]
    result = {"threads": a.threads, "cores": os.cpu_count(), "candidates": a.candidates, "levels": {}}
    result |= {"max_batch": a.max_batch, "batch_timeout_ms": a.batch_timeout_ms, "seconds": a.seconds}
    result |= {"rounds": a.rounds, "loadavg_before_run": os.getloadavg()}
    with contextlib.ExitStack() as stack:
        servers = {
            b: stack.enter_context(running_server(a.artifact, "--backend", b, *server_args)) for b in BACKENDS
        }
        result["idle_cpu_per_s"] = {b: idle_cpu(s.pid) for b, s in servers.items()}
        for clients in a.clients:
            slices: dict[str, list] = {b: [] for b in BACKENDS}
            for r in range(a.rounds):
                for b in list(BACKENDS)[:: 1 if r % 2 == 0 else -1]:
                    s = servers[b]
                    slices[b].append(measure(s.url, s.pid, bodies, clients, a.seconds / a.rounds, a.warmup))
            level = result["levels"][str(clients)] = {b: summary(v, clients) for b, v in slices.items()}
            for b, m in level.items():
                print(
                    f"{b:12s} {clients:3d} clients: {m['rps']:.1f} req/s p50 {m['p50_ms']:.0f} ms",
                    file=sys.stderr,
                )
    result["loadavg_after_run"] = os.getloadavg()
    return result


def table(result: dict) -> str:
    head = "| clients | onnxruntime req/s | p50 ms | p99 ms | eager torch req/s | p50 ms | p99 ms "
    head += "| req/s onnx / torch |"
    lines = [head, "|" + "---|" * 8]
    for clients, level in result["levels"].items():
        o, t = level["onnx"], level["torch-export"]
        cells = [f"{o['rps']:.1f}", f"{o['p50_ms']:.0f}", f"{o['p99_ms']:.0f}"]
        cells += [f"{t['rps']:.1f}", f"{t['p50_ms']:.0f}", f"{t['p99_ms']:.0f}", f"{o['rps'] / t['rps']:.2f}"]
        lines.append(f"| {clients} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", type=Path, required=True, help="a recformer export folder with both formats")
    p.add_argument("--data", type=Path, required=True, help="its data folder (test rows for the requests)")
    p.add_argument("--threads", type=int, default=1, help="the server's model threads (one worker)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--candidate-features", nargs="*", default=list(ITEM_FEATURES))
    p.add_argument("--requests", type=int, default=500, help="distinct request bodies, sent round robin")
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each slice")
    p.add_argument("--rounds", type=int, default=3, help="slices a level is measured in, per backend")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--batch-timeout-ms", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=Path("bench/out/serve_load.json"))
    a = p.parse_args(argv)
    result = run(a)
    print(table(result))
    o = result["levels"]
    cpu = {b: sum(level[b]["server_cpu_s"] for level in o.values()) for b in BACKENDS}
    wall = {b: sum(level[b]["seconds"] for level in o.values()) for b in BACKENDS}
    before, after = result["loadavg_before_run"][0], result["loadavg_after_run"][0]
    per_wall = ", ".join(f"{BACKENDS[b]} {cpu[b] / wall[b]:.2f}" for b in BACKENDS)
    print(
        f"server: 1 worker x {a.threads} thread(s), batches of <= {a.max_batch} requests within "
        f"{a.batch_timeout_ms:g} ms; {a.candidates} candidates a request; {result['cores']} cores shared "
        f"with the client; load average {before:.2f} before, {after:.2f} after; server CPU seconds per "
        f"wall second: {per_wall}; idle: "
        + ", ".join(f"{BACKENDS[b]} {v:.3f}" for b, v in result["idle_cpu_per_s"].items())
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
