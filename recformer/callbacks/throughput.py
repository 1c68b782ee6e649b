"""Training throughput in the logs: ``perf/samples_per_s``, ``perf/tokens_per_s`` and, on CUDA,
``perf/mfu`` (model FLOP utilisation).

Rates are wall-clock time between two log steps, with validation time taken out. No sync is
added: on CUDA the previous log step already synchronised (its one host copy), so the interval
between two log steps measures finished work; on CPU every op is synchronous anyway. Counted per
rank and multiplied by the world size (every rank gets the same number of equal batches,
``recformer.data``). The first interval starts at the end of the first step, so start-up and
compilation are not counted.

MFU = samples/s x training FLOPs per sample / peak FLOP/s (``model_flops_per_sample``: the model's
own ``flops_per_sample()`` when it has one, as recformer's rankers do, else)

    6 * P_tok * T  +  12 * L * T^2 * D  +  6 * P_once

with ``T`` tokens per sample, ``P_tok`` the parameters of the matrices applied to every token (the
blocks), ``P_once`` those applied once per sample (the head, the baselines' MLPs), ``L`` blocks,
``D`` width. 2 FLOPs per multiply-add, backward = 2x forward, so 6 per parameter per token; the
attention term is q k^T and p v (2 * T^2 * D each, forward) times 3 (Kaplan et al. 2020; PaLM,
Chowdhery et al. 2022, appendix B). Embedding lookups are not FLOPs and are excluded.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from recformer.callbacks.sink import MetricSource, StepMetrics
from recformer.metric_names import MFU, SAMPLES_PER_S, TOKENS_PER_S

PEAK_TFLOPS_BF16 = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0}
"""Dense bf16 tensor-core peak (vendor data sheets, without sparsity), by a substring of the CUDA
device name; used when ``peak_tflops`` is not given. Unknown devices log no MFU."""


def model_flops_per_sample(net: nn.Module) -> float:
    """Training FLOPs per sample: the model's own count (``flops_per_sample()``, which knows which
    matrices run on how many tokens: the Ranker's last block on the 1-2 tokens the head reads, DIN's
    attention MLP on every history slot), else the module docstring's formula: matrices inside
    ``net.blocks`` per token, every other non-embedding matrix (``nn.Linear`` outside the
    tokenizer) once per sample."""
    own = getattr(net, "flops_per_sample", None)
    if callable(own):
        return float(own())
    blocks = getattr(net, "blocks", None) or []
    tokens = int(getattr(net, "n_tokens", 1)) if len(blocks) else 1
    block_params = {id(p) for b in blocks for p in b.parameters()}
    tokenizer = getattr(net, "tokens", None)
    tok_params = {id(p) for p in tokenizer.parameters()} if tokenizer is not None else set()
    p_tok = sum(p.numel() for b in blocks for p in b.parameters() if p.ndim >= 2)
    p_once = sum(
        p.numel()
        for p in net.parameters()
        if p.ndim >= 2 and id(p) not in block_params and id(p) not in tok_params and not _is_embedding(net, p)
    )
    d_model = int(getattr(getattr(net, "cfg", None), "d_model", 0))
    return 6.0 * p_tok * tokens + 12.0 * len(blocks) * tokens**2 * d_model + 6.0 * p_once


def _is_embedding(net: nn.Module, p: torch.Tensor) -> bool:
    return any(m.weight is p for m in net.modules() if isinstance(m, nn.Embedding))


def peak_flops(device: torch.device, peak_tflops: float | None) -> float | None:
    """Peak FLOP/s of ``device``: ``peak_tflops`` if given, else the table for known CUDA devices."""
    if peak_tflops is not None:
        return peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v * 1e12 for k, v in PEAK_TFLOPS_BF16.items() if k in name), None)


class Throughput(MetricSource):
    def __init__(self, every_n_steps: int | None = None, peak_tflops: float | None = None) -> None:
        """
        Args:
            every_n_steps: Cadence in optimizer steps; None = ``trainer.log_every_n_steps``, 0 = off.
            peak_tflops: Peak TFLOP/s of one device for MFU; None = looked up for known CUDA devices
                (``PEAK_TFLOPS_BF16``). MFU is not logged on CPU unless this is set.
        """
        super().__init__(every_n_steps)
        if peak_tflops is not None and peak_tflops <= 0:
            raise ValueError(f"Throughput.peak_tflops={peak_tflops} must be > 0 (or None)")
        self.peak_tflops = peak_tflops
        self._t0: float | None = None
        self._samples = 0
        self._paused_at: float | None = None
        self._flops: float | None = None
        self._peak: float | None = None
        self._tokens = 1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        net = getattr(pl_module, "net", pl_module)
        self._tokens = int(getattr(net, "n_tokens", 1))
        self._flops = model_flops_per_sample(net)
        self._peak = peak_flops(pl_module.device, self.peak_tflops)
        self._t0 = None

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        net = getattr(pl_module, "net", pl_module)
        return {**super().meta(trainer, pl_module), "flops_per_sample": model_flops_per_sample(net)}

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._t0 is None:  # the end of the first step starts the clock
            self._t0 = time.perf_counter()
            self._samples = 0
        elif self._paused_at is None:
            self._samples += len(batch)  # a shape, read on the host: no sync

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit":  # validation inside fit does not count as training time
            self._paused_at = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._paused_at is not None and self._t0 is not None:
            self._t0 += time.perf_counter() - self._paused_at
        self._paused_at = None

    def gather(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, step: int, out: StepMetrics
    ) -> None:
        if self._t0 is None:
            return
        # Whichever runs first, the sink or this callback's own batch-end hook, every interval
        # counts the batches of the steps between two log steps once.
        now = time.perf_counter()
        samples = self._samples
        if samples == 0:
            return
        elapsed = max(now - self._t0, 1e-9)
        sps = samples * trainer.world_size / elapsed
        values = {SAMPLES_PER_S: sps, TOKENS_PER_S: sps * self._tokens}
        if self._peak and self._flops:
            values[MFU] = sps / trainer.world_size * self._flops / self._peak
        out.add_host(values)
        self._t0, self._samples = now, 0
