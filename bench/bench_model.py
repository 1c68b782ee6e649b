"""Forward+backward throughput of the Ranker beside a plain PyTorch Transformer of the same shape.

    python bench/bench_model.py                       # CPU, small shape, ~1-2 minutes on 2 cores
    python bench/bench_model.py --qk-norm none        # the ranker without QK-Norm
    python bench/bench_model.py --device cuda --dtype bf16 --compile --peak-tflops 989 \\
        --layers 4 --d-model 256 --tokens 128 --batch 2048          # reference shape 1
    python bench/bench_model.py --device cuda --dtype bf16 --compile --peak-tflops 989 \\
        --layers 8 --d-model 512 --tokens 512 --batch 512           # reference shape 2

The reference is ``nn.TransformerEncoder`` (pre-norm, GELU, no dropout) over tokens looked up from one
embedding table, with the same padding mask, reading token 0 through a linear head: a minimal ranker
of the same width, depth, heads and token count. The Ranker does more per token (a feature tokenizer
with five ids per history event, content projection, QK-Norm, an MLP head) and less in its last
block (only the tokens the head reads are updated there; the reference computes all T and reads
one). ``--norm layer`` (default) matches the reference's LayerNorm; ``--norm rms`` is the Ranker's
own default, whose ``F.rms_norm`` has no fused CPU kernel (about 3x LayerNorm's cost on CPU).

A third row, ``ranker-all``, runs the same Ranker with its last block over all tokens, to separate
per-token efficiency from the skipped work. The models run interleaved, one timed step each in turn,
so machine noise hits them alike; the table reports the median samples/s over the timed steps, and
the median process CPU time per step (less sensitive than wall time to other jobs on the machine).
MFU counts model FLOPs only (block matmuls and attention, forward + backward = 3x forward, as in PaLM
appendix B) over ``--peak-tflops``; the Ranker's count is its own (its last block updates only the
tokens the head reads), so its MFU is not inflated by work it skips.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from recformer.batch import Batch, batch_of
from recformer.config import FeatureDims, RankerConfig
from recformer.model import Ranker, flops
from recformer.model.blocks import mlp_hidden

N_CAT, N_DENSE = 4, 8
CONTEXT_TOKENS = 1 + N_CAT + 1  # CLS, categorical fields, one dense token
ITEM_ROWS = 20_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="tokens per sample T (history = T - 7)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--qk-norm", choices=["none", "head", "full"], default="head")
    p.add_argument("--mlp", choices=["gelu", "swiglu"], default="gelu")
    p.add_argument(
        "--norm",
        choices=["layer", "rms"],
        default="layer",
        help="ranker norm (blocks and QK-Norm); layer = like for like with the reference's LayerNorm",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast")
    p.add_argument("--compile", action="store_true", help="ranker.compile() and reference.compile()")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="device peak for MFU (e.g. 989 for H100/H200 dense bf16)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.tokens < CONTEXT_TOKENS + 2:
        p.error(f"--tokens={args.tokens} must be >= {CONTEXT_TOKENS + 2} (context tokens + 1 event + target)")
    return args


def make_dims(tokens: int) -> FeatureDims:
    return FeatureDims(
        cat_rows=[1000] * N_CAT,
        n_dense=N_DENSE,
        item_rows=ITEM_ROWS,
        content_dim=64,
        item_feat_rows=[50, 20],
        max_len=tokens - CONTEXT_TOKENS - 1,
        hist_cat_rows=[6],
        time_gap_buckets=25,
    )


def make_batch(dims: FeatureDims, B: int, device: str, seed: int = 0) -> Batch:
    """Random ids; history lengths uniform over [0, L] so the padding mask matters."""
    g = torch.Generator().manual_seed(seed)
    L = dims.max_len
    lengths = torch.randint(0, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None] >= (L - lengths)[:, None]
    tensors = dict(
        label=torch.randint(0, 2, (B,), generator=g).float(),
        weight=torch.ones(B),
        group=torch.arange(B),
        target_item=torch.randint(1, dims.item_rows, (B,), generator=g),
        cat=torch.stack([torch.randint(1, r, (B,), generator=g) for r in dims.cat_rows], 1),
        dense=torch.randn(B, dims.n_dense, generator=g),
        emb=torch.zeros(B, 0),
        hist_item=torch.randint(1, dims.item_rows, (B, L), generator=g) * mask,
        hist_cat=torch.randint(1, dims.hist_cat_rows[0], (B, L, 1), generator=g) * mask[..., None],
        hist_gap=torch.randint(1, dims.time_gap_buckets, (B, L), generator=g) * mask,
        hist_mask=mask,
    )
    return batch_of(**tensors).to(device)


class ReferenceRanker(nn.Module):
    """Embedding lookup -> nn.TransformerEncoder(norm_first=True) -> linear head on token 0."""

    def __init__(self, d_model: int, layers: int, heads: int, ffn: int, rows: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, ffn, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 1)

    def forward(self, ids_BT: torch.Tensor, pad_BT: torch.Tensor) -> torch.Tensor:
        h_BTD = self.encoder(self.emb(ids_BT), src_key_padding_mask=pad_BT)
        return self.head(h_BTD[:, 0]).squeeze(-1).float()


class RankerAllTokens(nn.Module):
    """The same Ranker with its last block computed for every token (no read-token shortcut):
    isolates per-token efficiency from the work the shortcut skips. Shares the ranker's weights."""

    def __init__(self, ranker: Ranker) -> None:
        super().__init__()
        self.ranker = ranker

    def forward(self, batch: Batch) -> torch.Tensor:
        r = self.ranker
        x_BTD, valid_BT = r.tokens(batch)
        attend_B11T = valid_BT[:, None, None, :]
        for block in r.blocks:
            x_BTD = block(x_BTD, attend_B11T)
        return r.head(r.final_norm(r.head.select(x_BTD))).float()


def flops_per_sample(cfg: RankerConfig, tokens: int, last_block_queries: int | None = None) -> float:
    """Training FLOPs per sample of the blocks alone (``recformer.model.flops``, PaLM appendix B).

    ``last_block_queries``: the Ranker's last block updates only the tokens its head reads (keys and
    values for all T); None counts every block in full, as the reference computes it.
    """
    M = mlp_hidden(cfg)
    up = 2 * M if cfg.mlp == "swiglu" else M
    q_last = tokens if last_block_queries is None else last_block_queries
    terms = []
    for i in range(cfg.n_layers):
        q = q_last if i == cfg.n_layers - 1 else tokens
        terms += flops.reference_block_terms(cfg, M, up, tokens, q)
    return flops.total(terms)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    torch.manual_seed(0)
    cfg = RankerConfig(
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        qk_norm=args.qk_norm,
        mlp=args.mlp,
        norm=args.norm,
    )
    dims = make_dims(args.tokens)
    ranker = Ranker(cfg, dims).to(device)
    ranker.set_item_tables(
        torch.randn(dims.item_rows, dims.content_dim) / 8, torch.zeros(dims.item_rows, 2).long()
    )
    ffn = mlp_hidden(cfg) if args.mlp == "gelu" else round(cfg.mlp_ratio * cfg.d_model)
    ref = ReferenceRanker(cfg.d_model, cfg.n_layers, cfg.n_heads, ffn, ITEM_ROWS).to(device)
    if args.compile:
        ranker.compile()
        ref.compile()
    batch = make_batch(dims, args.batch, device)
    ids_BT = torch.randint(1, ITEM_ROWS, (args.batch, ranker.n_tokens), device=device)
    pad_BT = torch.zeros(args.batch, ranker.n_tokens, dtype=torch.bool, device=device)
    pad_BT[:, CONTEXT_TOKENS : CONTEXT_TOKENS + dims.max_len] = ~batch.hist_mask

    autocast = (
        torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
        if args.dtype == "bf16"
        else nullcontext()
    )
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step(model: nn.Module, *inputs: object) -> tuple[float, float]:
        """One forward + backward; (wall seconds, process CPU seconds)."""
        model.zero_grad(set_to_none=True)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with autocast:
            logits_B = model(*inputs)
        loss = F.binary_cross_entropy_with_logits(logits_B, batch.label)
        loss.backward()
        sync()
        return time.perf_counter() - t0, time.process_time() - c0

    all_tokens = RankerAllTokens(ranker)
    if args.compile:
        all_tokens.compile()
    runs = {
        "ranker": (ranker, (batch,)),
        "reference": (ref, (ids_BT, pad_BT)),
        "ranker-all": (all_tokens, (batch,)),
    }
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(args.warmup + args.iters):
        for name, (model, inputs) in runs.items():
            dt, dc = step(model, *inputs)
            if i >= args.warmup:
                wall[name].append(dt)
                cpu[name].append(dc)

    n_read = 2 if cfg.head == "both" else 1
    flops = {
        "ranker": flops_per_sample(cfg, ranker.n_tokens, last_block_queries=n_read),
        "reference": flops_per_sample(cfg, ranker.n_tokens),
        "ranker-all": flops_per_sample(cfg, ranker.n_tokens),
    }
    result: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    result["tokens"] = ranker.n_tokens
    result["flops_per_sample"] = flops
    print(
        f"device={device} dtype={args.dtype} compile={args.compile} L={cfg.n_layers} D={cfg.d_model} "
        f"N={cfg.n_heads} T={ranker.n_tokens} B={args.batch} qk_norm={cfg.qk_norm} norm={cfg.norm} "
        f"threads={torch.get_num_threads()}"
    )
    # Process CPU seconds (all threads) beside wall time: other jobs on a shared machine stretch
    # wall time far more than CPU time (OpenMP spin-waits still inflate it when cores are busy).
    print(f"{'model':<11} {'samples/s':>10} {'ms/step':>9} {'cpu-ms/step':>12} {'TFLOP/s':>9} {'MFU':>7}")
    for name, ts in wall.items():
        med = statistics.median(ts)
        cpu_ms = statistics.median(cpu[name]) * 1e3
        sps = args.batch / med
        tflops = sps * flops[name] / 1e12
        mfu = tflops / args.peak_tflops if args.peak_tflops else float("nan")
        result[name] = {
            "samples_per_s": sps,
            "ms_per_step": med * 1e3,
            "cpu_ms_per_step": cpu_ms,
            "tflops": tflops,
            "mfu": mfu,
        }
        print(f"{name:<11} {sps:>10.0f} {med * 1e3:>9.1f} {cpu_ms:>12.1f} {tflops:>9.3f} {mfu:>7.1%}")
    result["ratio"] = result["ranker"]["samples_per_s"] / result["reference"]["samples_per_s"]
    result["ratio_cpu_time"] = result["reference"]["cpu_ms_per_step"] / result["ranker"]["cpu_ms_per_step"]
    result["ratio_all_tokens"] = result["ranker-all"]["samples_per_s"] / result["reference"]["samples_per_s"]
    print(
        f"ratio ranker / reference: {result['ratio']:.2f}x samples/s (wall), "
        f"{result['ratio_cpu_time']:.2f}x by CPU time; every block over all tokens: "
        f"{result['ratio_all_tokens']:.2f}x"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
