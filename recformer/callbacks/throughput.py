"""Training throughput in the logs: ``perf/samples_per_s``, ``perf/tokens_per_s`` and, on CUDA,
``perf/mfu`` (model FLOP utilisation).

Rates are wall-clock time between two log steps, with validation time taken out. No sync is
added: on CUDA the previous log step already synchronised (its one host copy), so the interval
between two log steps measures finished work; on CPU every op is synchronous anyway. Counted per
rank and multiplied by the world size (every rank gets the same number of equal batches,
``recformer.data``). The first interval starts at the end of the first step, so start-up and
compilation are not counted.

MFU = samples/s x training FLOPs per sample (``recformer.model.flops``: what the model says it
computes per sample, counted there) / peak FLOP/s.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from recformer.callbacks.sink import MetricSource, StepMetrics
from recformer.metric_names import MFU, SAMPLES_PER_S, TOKENS_PER_S
from recformer.model.flops import flops_per_sample

PEAK_TFLOPS_BF16 = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0}
"""Dense bf16 tensor-core peak (vendor data sheets, without sparsity), by a substring of the CUDA
device name; used when ``peak_tflops`` is not given. Unknown devices log no MFU."""


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
        self._tokens = pl_module.ranker.n_tokens
        self._flops = flops_per_sample(pl_module.ranker)
        self._peak = peak_flops(pl_module.device, self.peak_tflops)
        self._t0 = None

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return {**super().meta(trainer, pl_module), "flops_per_sample": flops_per_sample(pl_module.ranker)}

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

    def collect(
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
