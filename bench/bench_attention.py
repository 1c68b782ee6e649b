"""The two attention kernels of ``RankerConfig.attention_kernel``, forward and backward, side by side.

    python bench/bench_attention.py                         # the sweep behind ``auto``'s bounds
    python bench/bench_attention.py --tokens 56 --heads 2   # one shape

Each shape is one attention sublayer as the Ranker trains it on CPU: a [B, T, D] input (B * T =
``--batch-tokens``, the default's 256 samples x 56 tokens) projected to q, k and v by three
matmuls, viewed as heads of 32 (``--head-dim``), then attention with a key-padding mask by
``F.scaled_dot_product_attention`` (``sdpa``) or by ``matmul_attention`` (``matmul``), and the
backward of a squared-sum loss into the input and the weights. The queries are every token, or the
2 the Ranker's last block keeps. The kernels run interleaved, one timed step each in turn, so machine
noise hits them alike; the table gives median milliseconds and ``sdpa / matmul`` (above 1: the
matmuls are faster), and which kernel ``auto`` takes there.

Measured 2026-12-07 (2 CPU threads, AMD EPYC, torch CPU capability AVX512; ``sdpa / matmul``, all
queries / the last block's 2; ``python bench/bench_attention.py``): 2 heads: 16 tokens 1.47 / 1.64,
56 tokens 1.19 / 1.12, 128 tokens 0.88 / 1.02, 256 tokens 0.68 / 0.96; 4 heads: 16 tokens 1.29 /
1.33, 56 tokens 1.06 / 1.05, 128 tokens 0.94 / 1.01, 256 tokens 0.74 / 0.97; 8 heads: 16 tokens
1.13 / 1.22, 56 tokens 1.10 / 1.07, 128 tokens 1.00 / 1.03, 256 tokens 0.85 / 0.95. Hence
``auto``: the matmuls up to 64 tokens, at up to 8 heads (more were not measured). (Before the
heads were unbound, each indexed, whose backward zero-fills a full-size gradient per head: 8 heads
lost 0.83-0.94 at 56 tokens, and the default's step copied 4.3 ms against 1.4.) In the whole
training step (``python bench/bench_throughput.py --chosen bench/out/quality/chosen.json --archs
transformer bst --options "SDPA attention" --steps 100``, while the default Transformer was on
``auto``; since it sets ``sdpa``, ``--options "matmul attention"``) the default ran 1.09x and 1.08x
as fast with the matmuls as with SDPA in two runs (2,931 against 2,695 and 3,475 against 3,206
samples/s), and BST's step (4 heads of 16, 51 tokens, attention dropout 0.3, which sends SDPA to
its math path) 1.07x (1,512 against 1,407, its own SDPA row beside it). The default Transformer
keeps SDPA all the same: its fits with the matmuls scored lower on validation (docs/levers.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from recformer.model.attention import MATMUL_MAX_HEADS, MATMUL_MAX_TOKENS, matmul_attention


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 56, 128, 256])
    p.add_argument("--heads", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--batch-tokens", type=int, default=256 * 56, help="B * T of every shape")
    p.add_argument("--steps", type=int, default=15, help="timed steps per kernel and shape")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    return p.parse_args(argv)


def sdpa(q_BNQH, k_BNTH, v_BNTH, attend_B11T, scale: float) -> torch.Tensor:
    o_BNQH = F.scaled_dot_product_attention(q_BNQH, k_BNTH, v_BNTH, attn_mask=attend_B11T, scale=scale)
    return o_BNQH.transpose(1, 2).flatten(2)  # [B, Q, D], as Attention._output takes it


KERNELS = {"sdpa": sdpa, "matmul": matmul_attention}


def shape_steps(T: int, N: int, Q: int, a: argparse.Namespace) -> dict[str, float]:
    """Median ms of one forward and backward per kernel at T tokens, N heads, Q queries."""
    B, H = max(a.batch_tokens // T, 1), a.head_dim
    D = N * H
    torch.manual_seed(0)
    x_BTD = torch.randn(B, T, D, requires_grad=True)
    w_q, w_k, w_v = ((torch.randn(D, D) / D**0.5).requires_grad_() for _ in range(3))
    attend_B11T = torch.rand(B, 1, 1, T) > 0.2
    attend_B11T[..., -2:] = True  # the Ranker's CLS and target are always valid

    def step(kernel) -> None:
        q_BNQH = F.linear(x_BTD[:, T - Q :], w_q).view(B, Q, N, H).transpose(1, 2)
        k_BNTH, v_BNTH = (F.linear(x_BTD, w).view(B, T, N, H).transpose(1, 2) for w in (w_k, w_v))
        kernel(q_BNQH, k_BNTH, v_BNTH, attend_B11T, H**-0.5).square().sum().backward()

    seconds: dict[str, list[float]] = {name: [] for name in KERNELS}
    for i in range(a.steps + 2):  # two untimed rounds first
        for name, kernel in KERNELS.items():
            start = time.perf_counter()
            step(kernel)
            if i >= 2:
                seconds[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(s) for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = []
    head = f"{'heads':>5s} {'tokens':>6s} {'queries':>7s} {'sdpa ms':>8s} {'matmul ms':>9s}"
    print(f"{head} {'sdpa/matmul':>11s}  auto")
    for N in a.heads:
        for T in a.tokens:
            for Q in (T, 2) if T > 2 else (T,):
                ms = shape_steps(T, N, Q, a)
                auto = "matmul" if T <= MATMUL_MAX_TOKENS and N <= MATMUL_MAX_HEADS else "sdpa"
                row = {"heads": N, "tokens": T, "queries": Q, **{f"{k}_ms": v for k, v in ms.items()}}
                row.update(ratio=ms["sdpa"] / ms["matmul"], auto=auto)
                rows.append(row)
                line = f"{N:5d} {T:6d} {Q:7d} {ms['sdpa']:8.2f} {ms['matmul']:9.2f}"
                print(f"{line} {row['ratio']:10.2f}x  {auto}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"threads": a.threads, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
