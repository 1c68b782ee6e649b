"""The health callbacks under a real tiny Trainer: what is logged, at which steps, with which values,
and that nothing syncs the device on the other steps."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger

from recformer import metric_names as mn
from recformer.callbacks.gate import cadence, should_log
from recformer.callbacks.health import OptimizerHealth
from recformer.callbacks.predictions import ParquetPredictionWriter
from recformer.callbacks.probe import ProbeStats, row_norm_percentiles
from recformer.callbacks.sink import HEALTH_FILE, MetricSink
from recformer.callbacks.stability import LossSpikes
from recformer.callbacks.throughput import Throughput
from recformer.config import OptimConfig, RankerConfig
from recformer.data.datamodule import RecDataModule
from recformer.model import build_model
from recformer.model.flops import flops_per_sample, total
from recformer.module import RankerModule

ROOT = Path(__file__).resolve().parents[1]
CALLBACKS_DIR = str(ROOT / "recformer" / "callbacks")

TINY = dict(d_model=16, n_layers=2, n_heads=2)


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def health_callbacks(**spikes) -> list[Callback]:
    return [OptimizerHealth(), ProbeStats(), LossSpikes(**{"warmup_steps": 10, **spikes}), Throughput()]


def fit_tiny(
    data: Path,
    out: Path,
    ranker: RankerConfig | None = None,
    optim: OptimConfig | None = None,
    steps: int = 40,
    every: int = 5,
    prep=None,
    extra: tuple[Callback, ...] = (),
    callbacks: list[Callback] | None = None,
    loggers: list[Logger] | None = None,
    arch: str = "transformer",
    ckpt_path: str | None = None,
    **trainer_kw,
) -> tuple[pl.Trainer, RankerModule]:
    """A real fit of a tiny ranker, CSVLogger writing to ``out`` (the run dir is ``out`` itself)."""
    torch.manual_seed(0)
    dm = RecDataModule(str(data), batch_size=32, num_workers=0, validate="footer")
    module = RankerModule(
        ranker=ranker or RankerConfig(**TINY),
        optim=optim or OptimConfig(warmup_steps=10),
        dims=dm.feature_dims,
        arch=arch,
    )
    if prep is not None:
        prep(module)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        log_every_n_steps=every,
        logger=[CSVLogger(out, name="", version=""), *(loggers or [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=trainer_kw.pop("enable_checkpointing", False),
        limit_val_batches=trainer_kw.pop("limit_val_batches", 0),
        callbacks=[*(health_callbacks() if callbacks is None else callbacks), *extra],
        **trainer_kw,
    )
    trainer.fit(module, dm, ckpt_path=ckpt_path)
    return trainer, module


def read_health(run_dir: Path) -> tuple[dict, list[dict]]:
    meta, records = {}, []
    for line in (run_dir / HEALTH_FILE).read_text().splitlines():
        r = json.loads(line)
        if "meta" in r:
            meta = r["meta"]
        else:
            records.append(r)
    return meta, records


# -- the gate -----------------------------------------------------------------------------------
def test_should_log_opens_on_multiples_of_the_cadence_only():
    assert [s for s in range(0, 13) if should_log(s, 4)] == [4, 8, 12]
    assert not any(should_log(s, 0) for s in range(10))  # 0 = off
    assert cadence(SimpleNamespace(log_every_n_steps=7), None) == 7
    assert cadence(SimpleNamespace(log_every_n_steps=7), 3) == 3
    with pytest.raises(ValueError, match="every_n_steps=-1"):
        OptimizerHealth(every_n_steps=-1)


# -- what is logged, where and when ----------------------------------------------------------
@pytest.fixture(scope="module")
def recorded_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("recorded")
    rec = RecordingLogger()
    checker = ManualStats()
    trainer, module = fit_tiny(tiny_data, out, steps=12, every=3, loggers=[rec], extra=(checker,))
    return SimpleNamespace(out=out, rec=rec, checker=checker, trainer=trainer, module=module)


def test_metrics_reach_every_logger_and_the_local_file_at_log_steps_only(recorded_run):
    r = recorded_run
    health_calls = [(s, m) for s, m in r.rec.calls if any(k.startswith("health/") for k in m)]
    assert [s for s, _ in health_calls] == [3, 6, 9, 12]
    meta, records = read_health(r.out)
    assert [x["step"] for x in records] == [3, 6, 9, 12]
    assert meta["OptimizerHealth"]["n_blocks"] == 2
    assert {g["name"] for g in meta["OptimizerHealth"]["groups"]} >= {"hidden", "embedding", "vector"}
    assert meta["ranker"]["d_model"] == 16
    for (step, logged), record in zip(health_calls, records):
        assert record["step"] == step
        assert {k: v for k, v in record.items() if k != "step"} == logged  # same values, both places
    names = set(records[-1])
    L, N = 2, 2
    for fmt in (mn.GRAD_NORM, mn.UPDATE_RATIO, mn.WEIGHT_NORM, mn.COS_ADJACENT, mn.RESID_RMS):
        assert {fmt.format(i=i) for i in range(L)} <= names, fmt
    assert {mn.ATTN_ENTROPY_HEAD.format(i=i, h=h) for i in range(L) for h in range(N)} <= names
    assert {mn.ADAM_V.format(group=g) for g in ("hidden", "embedding", "vector", "readout")} <= names
    assert {mn.EMB_ROW_NORM.format(table="item", q=q) for q in (50, 90, 99)} <= names
    assert {mn.LOSS_SPIKE, mn.LOSS_Z_MAX, mn.NONFINITE_STEPS, mn.GRAD_RATIO_BOTTOM_TOP} <= names
    # Throughput starts its clock at the end of step 1, so the first log step already has a rate.
    assert records[-1][mn.SAMPLES_PER_S] > 0
    assert records[-1][mn.TOKENS_PER_S] == pytest.approx(
        records[-1][mn.SAMPLES_PER_S] * r.module.ranker.n_tokens
    )
    # CSVLogger got them too: the doctor can read metrics.csv alone.
    header = (r.out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert mn.GRAD_NORM.format(i=0) in header and mn.ATTN_ENTROPY.format(i=1) in header


class ManualStats(Callback):
    """Independent per-block grad norms and update ratios at every step, for comparison."""

    def __init__(self) -> None:
        self.grad: dict[int, list[float]] = {}
        self.update: dict[int, list[float]] = {}
        self._before = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        step = trainer.global_step + 1
        self.grad[step] = [
            torch.cat([p.grad.flatten() for p in b.parameters() if p.grad is not None]).norm().item()
            for b in pl_module.ranker.blocks
        ]
        self._before = [
            [p.detach().clone() for p in b.parameters() if p.ndim >= 2] for b in pl_module.ranker.blocks
        ]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        ratios = []
        for b, before in zip(pl_module.ranker.blocks, self._before):
            after = [p.detach() for p in b.parameters() if p.ndim >= 2]
            d = torch.cat([(a - w).flatten() for a, w in zip(after, before)]).norm()
            ratios.append((d / torch.cat([w.flatten() for w in before]).norm()).item())
        self.update[step] = ratios


def test_grad_norms_and_update_ratios_equal_a_direct_computation(recorded_run):
    _, records = read_health(recorded_run.out)
    checker = recorded_run.checker
    for r in records:
        s = r["step"]
        for i in range(2):
            assert r[mn.GRAD_NORM.format(i=i)] == pytest.approx(checker.grad[s][i], rel=1e-4)
            assert r[mn.UPDATE_RATIO.format(i=i)] == pytest.approx(checker.update[s][i], rel=1e-4)
        assert r[mn.GRAD_RATIO_BOTTOM_TOP] == pytest.approx(checker.grad[s][0] / checker.grad[s][1], rel=1e-4)


def test_weight_norm_and_adam_v_equal_a_direct_computation(recorded_run):
    _, records = read_health(recorded_run.out)
    last = records[-1]  # the final step: the weights and optimizer state are still as logged
    net, opt = recorded_run.module.ranker, recorded_run.trainer.optimizers[0]
    for i, b in enumerate(net.blocks):
        w = torch.cat([p.detach().flatten() for p in b.parameters() if p.ndim >= 2]).norm().item()
        assert last[mn.WEIGHT_NORM.format(i=i)] == pytest.approx(w, rel=1e-5)
    for g in opt.param_groups:
        v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in g["params"]])
        expected = (v.mean() / (1 - g["betas"][1] ** last["step"])).sqrt().item()
        assert last[mn.ADAM_V.format(group=g["name"])] == pytest.approx(expected, rel=1e-5)


def test_probe_metrics_equal_the_models_stats_on_the_probe_batch(recorded_run):
    _, records = read_health(recorded_run.out)
    last = records[-1]
    probe = next(cb for cb in recorded_run.trainer.callbacks if isinstance(cb, ProbeStats))
    assert len(probe._probe) == min(probe.batch_size, 120)  # from the validation split
    net = recorded_run.module.ranker.eval()
    with torch.no_grad():
        _, stats = net.forward_stats(probe._probe)
    for i in range(2):
        assert last[mn.COS_ADJACENT.format(i=i)] == pytest.approx(stats.cos_adjacent_Y[i].item(), rel=1e-5)
        assert last[mn.RESID_RMS.format(i=i)] == pytest.approx(stats.resid_rms_Y[i].item(), rel=1e-5)
        assert last[mn.ATTN_LOGIT_MAX.format(i=i)] == pytest.approx(
            stats.attn_logit_max_YN[i].max().item(), rel=1e-5
        )
        assert last[mn.ATTN_ENTROPY.format(i=i)] == pytest.approx(
            stats.attn_entropy_YN[i].mean().item(), rel=1e-5
        )
    d = net.tokens.dims
    start = net.tokens.item_offset
    assert start == sum(d.cat_rows)  # the documented layout: context rows first, then items
    norms = net.tokens.table.weight[start : start + d.item_rows].norm(dim=1).sort().values
    assert last[mn.EMB_ROW_NORM.format(table="item", q=50)] == pytest.approx(
        norms[round(0.5 * (len(norms) - 1))].item(), rel=1e-6
    )
    assert recorded_run.module.ranker.training is False  # we set eval above; the probe restores train mode
    recorded_run.module.ranker.train()


def test_row_norm_percentiles_are_nearest_rank():
    w = torch.zeros(101, 3)
    w[:, 0] = torch.arange(101, dtype=torch.float32).flip(0)  # row norms 100..0
    assert row_norm_percentiles(w, (0.0, 50.0, 90.0, 100.0)).tolist() == [0.0, 50.0, 90.0, 100.0]


# -- no device sync on non-log steps --------------------------------------------------------
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_callbacks_sync_once_per_log_step_and_never_on_other_steps(tiny_data, tmp_path, monkeypatch):
    current = {"step": 0}
    syncs: list[tuple[int, str]] = []

    class StepTracker(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            current["step"] = trainer.global_step + 1  # the step this batch completes

    def from_callbacks() -> bool:
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename.startswith(CALLBACKS_DIR):
                return True
            f = f.f_back
        return False

    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def patched(self, *a, _orig=original, _name=name, **k):
            if from_callbacks():
                syncs.append((current["step"], _name))
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, patched)

    fit_tiny(tiny_data, tmp_path, steps=14, every=4, extra=(StepTracker(),))
    monkeypatch.undo()
    # Step 0 is set-up before the first batch (the probe reads its validation rows): not a step.
    in_steps = sorted((s, name) for s, name in syncs if s > 0)
    # One device-to-host copy per log step, the sink's .tolist(), and nothing on the other steps.
    assert in_steps == [(4, "tolist"), (8, "tolist"), (12, "tolist")], in_steps


# -- loss spikes ------------------------------------------------------------------------------
def _feed(spikes: LossSpikes, losses: list[float], start: int = 0) -> None:
    for k, v in enumerate(losses, start=start + 1):
        spikes._observe(
            SimpleNamespace(global_step=k, is_global_zero=True, accumulate_grad_batches=1),
            {"loss": torch.tensor(v)},
        )


def test_spike_detector_counts_one_outlier_and_ignores_nan():
    g = torch.Generator().manual_seed(0)
    noisy = (0.7 + 0.01 * torch.randn(80, generator=g)).tolist()
    det = LossSpikes(threshold=6.0, window=20, warmup_steps=20)
    _feed(det, noisy[:60] + [float("nan")] + [0.95] + noisy[60:])
    s = det._state
    assert s["total"].item() == 1  # 0.95 is ~25 std above 0.7; the NaN is neither a spike nor averaged
    assert s["z_max"].item() > 6.0
    assert s["mean"].item() == pytest.approx(0.7, abs=0.01)  # the spike did not enter the mean
    quiet = LossSpikes(threshold=6.0, window=20, warmup_steps=20)
    _feed(quiet, noisy)
    assert quiet._state["total"].item() == 0


def test_spike_detector_follows_a_lasting_level_shift():
    g = torch.Generator().manual_seed(1)
    before = (0.50 + 0.002 * torch.randn(300, generator=g)).tolist()
    after = (0.52 + 0.002 * torch.randn(300, generator=g)).tolist()  # ~10 std up, and it stays
    det = LossSpikes(threshold=6.0, window=50, warmup_steps=20, shift_steps=10)
    _feed(det, before + after)
    assert det._state["total"].item() == 10  # the first 10 steps at the new level, then no more
    assert det._state["mean"].item() == pytest.approx(0.52, abs=0.002)
    _feed(det, [0.60], start=600)
    assert det._state["total"].item() == 11  # a real spike above the new level is still caught


def test_spike_detector_undoes_lightnings_accumulation_scaling():
    det = LossSpikes(warmup_steps=2)
    for k in range(1, 4):  # Lightning hands over loss / accumulate_grad_batches
        det._observe(
            SimpleNamespace(global_step=k, is_global_zero=True, accumulate_grad_batches=4),
            {"loss": torch.tensor(0.25)},
        )
    assert det._state["mean"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="warmup_steps=1 must be >= 2"):
        LossSpikes(warmup_steps=1)


def test_spike_state_round_trips_through_state_dict():
    det = LossSpikes(warmup_steps=5, window=10)
    _feed(det, [0.7, 0.71, 0.69, 0.7, 0.72, 0.7, 0.68])
    state = det.state_dict()
    resumed = LossSpikes(warmup_steps=5, window=10)
    resumed.load_state_dict(state)
    assert resumed._seen == 7  # past warmup: a spike right after resume is caught
    _feed(resumed, [5.0], start=7)
    assert resumed._state["total"].item() == 1
    fresh = LossSpikes(warmup_steps=5, window=10)
    _feed(fresh, [5.0], start=7)
    assert fresh._state["total"].item() == 0  # without the state it would still be warming up


def test_spike_state_survives_a_lightning_resume(tiny_data, tmp_path):
    trainer, _ = fit_tiny(tiny_data, tmp_path / "a", steps=12, every=4)
    first = next(cb for cb in trainer.callbacks if isinstance(cb, LossSpikes))
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    seen_at_start = {}

    class Peek(Callback):
        def on_train_start(self, trainer, pl_module):
            cb = next(c for c in trainer.callbacks if isinstance(c, LossSpikes))
            seen_at_start["seen"] = cb._seen
            seen_at_start["mean"] = cb._state["mean"].item()

    fit_tiny(tiny_data, tmp_path / "b", steps=16, every=4, extra=(Peek(),), ckpt_path=str(ckpt))
    assert seen_at_start["seen"] == first._seen == 12
    assert seen_at_start["mean"] == pytest.approx(first._state["mean"].item())


# -- models without blocks, throughput, config -----------------------------------------------
@pytest.mark.parametrize("arch", ["popularity", "din", "deepfm", "dcnv2", "dcnv2_parallel", "bst"])
def test_baselines_get_what_applies_to_them_and_no_crash(tiny_data, tmp_path, arch):
    fit_tiny(tiny_data, tmp_path, arch=arch, optim=OptimConfig(warmup_steps=2), steps=6, every=3)
    _, records = read_health(tmp_path)
    names = set(records[-1])
    has_block = arch == "bst"  # BST's one Transformer layer reports like the ranker's blocks
    assert any(n.startswith("health/grad_norm") for n in names) == has_block
    assert (mn.COS_ADJACENT.format(i=0) in names) == has_block
    assert any(n.startswith("health/adam_v/") for n in names)
    assert (mn.EMB_ROW_NORM.format(table="item", q=50) in names) == (arch != "popularity")
    assert mn.SAMPLES_PER_S in names


@pytest.mark.parametrize(
    "arch, layers",
    [
        ("transformer", 2),
        ("transformer", 4),
        ("din", 2),
        ("deepfm", 2),
        ("dcnv2", 3),
        ("dcnv2_parallel", 2),
        ("bst", 1),
    ],
)
def test_flops_per_sample_matches_a_flop_counter(tiny_data, arch, layers):
    """MFU's FLOP count against PyTorch's FLOP counter over a real forward and backward: the
    Ranker's last block runs 1-2 query tokens, DIN's attention MLP every history slot, the content
    projection every item token. The counter does not see attention inside CPU SDPA (~3% here)."""
    from torch.utils.flop_counter import FlopCounterMode

    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer", shuffle=False)
    batch = next(iter(dm.train_dataloader())).to("cpu")
    net = build_model(arch, RankerConfig(d_model=64, n_layers=layers, n_heads=4), dm.feature_dims)
    net.set_item_tables(*dm.item_tables())
    with FlopCounterMode(display=False) as counter:
        net(batch).sum().backward()
    assert flops_per_sample(net) == total(net.flop_terms())
    assert counter.get_total_flops() / len(batch) == pytest.approx(flops_per_sample(net), rel=0.05)


def test_trainer_config_turns_the_health_callbacks_on():
    cfg = yaml.safe_load((ROOT / "configs" / "trainer.yaml").read_text())
    built = []
    for entry in cfg["trainer"]["callbacks"]:
        module, _, cls = entry["class_path"].rpartition(".")
        if module.startswith("recformer.callbacks"):
            built.append(getattr(importlib.import_module(module), cls)(**entry.get("init_args", {})))
    kinds = {type(cb) for cb in built}
    assert {OptimizerHealth, ProbeStats, LossSpikes, Throughput, MetricSink} <= kinds


def test_prediction_writer_writes_uint64_keys_back_as_uint64(tmp_path):
    dm = SimpleNamespace(
        spec=SimpleNamespace(keys=["hashed", "row_id"]),
        unsigned_keys={"test": frozenset({"hashed"})},
        string_keys=lambda split: {},
        predict_split="test",
    )
    trainer = SimpleNamespace(
        datamodule=dm, world_size=1, global_rank=0, log_dir=str(tmp_path), ckpt_path=None
    )
    hashed = np.array([2**64 - 1, 2**63, 5], dtype=np.uint64)
    keys = torch.from_numpy(np.stack([hashed.view(np.int64), np.array([-1, 0, 7])], axis=1))
    pred = {"keys": keys, "score": torch.rand(3), "logit": torch.zeros(3), "label": torch.ones(3)}
    w = ParquetPredictionWriter(str(tmp_path / "p.parquet"))
    w.setup(trainer, None, "predict")
    w.write_on_batch_end(trainer, None, pred, None, None, 0, 0)
    w.on_predict_end(trainer, None)
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.schema.field("hashed").type == pa.uint64() and t.schema.field("row_id").type == pa.int64()
    assert t["hashed"].to_pylist() == [2**64 - 1, 2**63, 5] and t["row_id"].to_pylist() == [-1, 0, 7]
