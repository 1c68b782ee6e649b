"""``RankerModule``: the one place where the model, the loss, the metrics and the optimizer meet.

- One ``_shared_step`` for train / val / test: weighted BCE on logits.
- AdamW groups from explicit rules (``recformer.optim``), muP LR multipliers from the model.
- Gradient clipping at ``optim.grad_clip`` and the non-finite guard share one norm pass.
- Non-finite gradients: the step is skipped on every rank (gradients are set to None, so AdamW
  leaves weights *and* moments untouched), counted in ``health/nonfinite_steps``, and training stops
  with a clear message after ``optim.max_nonfinite_steps`` in a row. Under DDP the gradients are
  already all-reduced when this runs, so every rank takes the same decision without a collective,
  and no rank returns None from ``training_step`` (which would hang DDP, DESIGN section 7).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import asdict, replace
from typing import Any, Literal, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MetricCollection

from recformer.batch import Batch
from recformer.checkpoints import check_features
from recformer.config import FeatureDims, OptimConfig, RankerConfig
from recformer.losses import listwise_loss, pairwise_loss, table_l2
from recformer.metric_names import OOV, TRAIN_LOSS, VAL_SCORE
from recformer.metrics import (
    DEFAULT_AUC_EXACT_MAX_ROWS,
    BinnedAUC,
    Calibration,
    GroupAUC,
    LogLoss,
    NormalizedEntropy,
)
from recformer.model import Arch, RankerNet, build_model
from recformer.model.mup import hidden_lr_multiplier
from recformer.optim import (
    build_optimizer,
    build_param_groups,
    build_scheduler,
    describe_groups,
    regroup_state,
)

log = logging.getLogger(__name__)


@runtime_checkable
class RankerData(Protocol):
    """What the module reads from its DataModule (``RecDataModule``)."""

    oov_fields: list[str]
    """Id fields whose unknown ids ``Batch.oov`` counts, in its order."""

    def item_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Item content [item_rows, P] and item feature rows [item_rows, I]."""
        ...


LEGACY_KEYS = (re.compile(r"^net\."), "ranker.")
"""State-dict keys of checkpoints written before the model attribute was named ``ranker``."""


Stage = Literal["train", "val", "test"]


def _metrics(exact_max_rows: int) -> dict[str, Any]:
    """One stage's metrics; AUC exact up to ``exact_max_rows`` rows (0: binned, for training)."""
    return {
        "auc": BinnedAUC(exact_max_rows=exact_max_rows),
        "logloss": LogLoss(),
        "ne": NormalizedEntropy(),
        "calibration": Calibration(),
    }


def _feature_dims(dims: FeatureDims | dict[str, Any] | None) -> FeatureDims:
    if dims is None:
        raise ValueError("RankerModule needs dims (FeatureDims); the CLI links them from data.feature_dims")
    return _as(FeatureDims, dims)


def _loss_weight(name: str, weight: float) -> float:
    """A loss weight (``model.pairwise``, ``model.listwise``, ``model.branch_loss``), checked."""
    if not weight >= 0:
        raise ValueError(f"model.{name}={weight} must be >= 0 (0 = off)")
    return weight


def _check_branch(ranker: RankerNet, branch_loss: float) -> None:
    """``model.branch_loss`` needs a logit term beside the blocks to train on its own."""
    if branch_loss and not getattr(ranker, "has_branch", False):
        raise ValueError(
            f"model.branch_loss={branch_loss} needs a logit term beside the Transformer's blocks: "
            "model.arch=transformer with model.ranker.cross_layers >= 1 (without head_fields), "
            "model.ranker.fm=true or model.ranker.item_bias=true"
        )


def _log_loss(logits_B: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The weighted mean log loss of ``logits_B`` on the batch's labels."""
    w_B = batch.weight
    loss = (F.binary_cross_entropy_with_logits(logits_B, batch.label, reduction="none") * w_B).sum()
    return loss / w_B.sum().clamp_min(1e-12)


def _as(cls: type, value: Any) -> Any:
    if value is None:
        return cls()
    return cls(**value) if isinstance(value, dict) else replace(value)  # a copy: never a shared default


class RankerModule(pl.LightningModule):
    def __init__(
        self,
        ranker: RankerConfig = RankerConfig(),  # noqa: B008 - copied by _as; shown whole in config.yaml
        optim: OptimConfig = OptimConfig(),  # noqa: B008
        dims: FeatureDims | None = None,
        arch: Arch = "transformer",
        compile: bool = False,
        auc_exact_max_rows: int = DEFAULT_AUC_EXACT_MAX_ROWS,
        pairwise: float = 0.0,
        listwise: float = 0.0,
        branch_loss: float = 0.0,
    ):
        """
        Args:
            ranker: The ranker's architecture and scale controls.
            optim: AdamW, parameter groups, warmup and schedule.
            dims: Feature sizes; linked from the DataModule (``data.feature_dims``) by the CLI.
            arch: "transformer" (the ranker), or a baseline: "din" (target attention over the
                history plus an MLP), "popularity" (a learned per-item positive rate).
            compile: ``torch.compile`` the model in place (``nn.Module.compile``: state-dict keys
                are unchanged, DESIGN section 7).
            auc_exact_max_rows: Rows (over all ranks) up to which val/auc and test/auc are exact:
                12 bytes each in memory, gathered on every rank once per validation, about 80 at
                the peak of that; past it they are binned (4096 logit bins) and say so. train/auc
                is always binned: it only watches the trend.
            pairwise: Weight of a within-group pairwise loss added to the log loss: RankNet's
                ``log(1 + exp(-(s_pos - s_neg)))`` (Burges et al. 2005) over the batch's pairs of
                one group (user) with a positive and a negative label, averaged over those pairs.
                It trains the order inside a user, which is what GAUC measures; 0 turns it off.
            listwise: Weight of a within-group softmax cross-entropy added to the log loss: each
                group's (user's) rows in the batch scored against each other, with its labels
                normalised to sum to 1 as the target (ListNet, Cao et al. 2007;
                ``recformer.losses.listwise_loss``); 0 turns it off. Both within-group losses need
                several rows of a user per batch: ``data.group_rows``.
            branch_loss: With a logit term beside the blocks (``ranker.cross_layers``, ``fm``,
                ``item_bias``), the head's logit and that term's each also get the log loss times
                this weight in training, so each part learns to predict alone, as an ensemble's
                members do (deep supervision, Lee et al. 2015); 0 turns it off. Training steps
                then run ``ranker.forward_parts`` (compiled too under ``compile``).
        """
        super().__init__()
        # Checkpoints store the configs as plain dicts, so they load with torch's weights_only=True;
        # load_from_checkpoint hands the dicts back here.
        ranker_cfg, self.optim_cfg = _as(RankerConfig, ranker), _as(OptimConfig, optim)
        self.dims = _feature_dims(dims)
        self.arch = arch
        weights = {"pairwise": pairwise, "listwise": listwise, "branch_loss": branch_loss}
        self.pairwise, self.listwise, self.branch_loss = (_loss_weight(k, w) for k, w in weights.items())
        configs = {"ranker": asdict(ranker_cfg), "optim": asdict(self.optim_cfg), "dims": asdict(self.dims)}
        run = {"arch": arch, "compile": compile, "auc_exact_max_rows": auc_exact_max_rows}
        self.save_hyperparameters(configs | run | weights)
        self.ranker: RankerNet = build_model(arch, ranker_cfg, self.dims)
        _check_branch(self.ranker, self.branch_loss)
        self.compile_model = compile
        self._make_metrics(auc_exact_max_rows)
        # Device-side counters: read on log steps only (no sync in the step path).
        self.register_buffer("nonfinite_total", torch.zeros((), dtype=torch.long), persistent=True)
        self._nonfinite_in_a_row = 0
        self._oov: torch.Tensor | None = None
        self._compiled, self._forward_parts = False, None  # forward_parts compiled, under compile

    def _make_metrics(self, auc_exact_max_rows: int) -> None:
        """Each stage's metrics (``_metrics``), GAUC and the eval losses."""
        self.train_metrics, self.val_metrics, self.test_metrics = (
            MetricCollection(_metrics(rows), prefix=f"{stage}/")
            for stage, rows in (("train", 0), ("val", auc_exact_max_rows), ("test", auc_exact_max_rows))
        )
        self.val_gauc, self.test_gauc = GroupAUC(), GroupAUC()
        # val/auc + val/gauc (VAL_SCORE), computed from the two metrics' own states and syncs.
        self.val_score = self.val_metrics["auc"] + self.val_gauc
        # The eval loss over the whole split, summed across ranks by its metric: Lightning's own
        # epoch mean averages the row count across ranks as an integer, which truncates under DDP.
        self.val_loss, self.test_loss = LogLoss(), LogLoss()

    @property
    def data(self) -> RankerData | None:
        """The trainer's DataModule, when it provides what the module reads (in hooks: attached)."""
        dm = self.trainer.datamodule
        return dm if isinstance(dm, RankerData) else None

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self._trainer is not None and self.trainer.gradient_clip_val is not None:
            raise ValueError(
                f"trainer.gradient_clip_val={self.trainer.gradient_clip_val} is set; recformer clips with "
                "model.optim.grad_clip (one norm pass shared with the non-finite guard). "
                "Remove the trainer setting."
            )
        if stage == "fit" and self._trainer is not None and str(self.trainer.precision) == "16-true":
            raise ValueError(
                "trainer.precision='16-true' trains float16 weights with float16 AdamW states: squared "
                "gradients under 6e-8 and eps=1e-8 are 0 in float16, so the first update is 0/0 = NaN "
                "in every weight with a tiny gradient. Use '16-mixed' (float32 weights, loss scaling), "
                "'bf16-mixed' or 'bf16-true'."
            )
        if stage == "fit" and self._trainer is not None and self.data is not None:
            # Item content vectors live in the model as buffers, so checkpoints are self-contained.
            self.ranker.set_item_tables(*self.data.item_tables())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before the weights load (Lightning calls this first, for load_from_checkpoint and for a
        # resume alike): old key names are renamed, and a checkpoint trained on other features says
        # so, instead of a state-dict size mismatch or, worse, loading fine.
        pattern, new = LEGACY_KEYS
        state = checkpoint.get("state_dict", {})
        checkpoint["state_dict"] = {pattern.sub(new, k): v for k, v in state.items()}
        saved = checkpoint.get("hyper_parameters", {}).get("dims")
        if saved is not None:
            first = self._trainer is None or self._trainer.is_global_zero
            check_features(self.dims, FeatureDims(**saved), "the data", "the checkpoint", warn=first)
        self._regroup_optimizer(checkpoint)

    def _regroup_optimizer(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint whose optimizer groups the parameters otherwise than this code (written
        before a group was added) gets its optimizer and scheduler states rearranged by parameter
        name, so a resume keeps its Adam moments and its schedule (``optim.regroup_state``)."""
        states = checkpoint.get("optimizer_states") or []
        if len(states) != 1:
            return
        groups = build_param_groups(
            self.ranker,
            self.ranker.param_kinds(),
            self.optim_cfg,
            hidden_lr_multiplier(self.ranker.cfg),
            self.ranker.optimizer_rules,
        )
        moved = regroup_state(states[0], groups)
        if moved is None:
            return
        checkpoint["optimizer_states"][0], sources = moved
        for sched in checkpoint.get("lr_schedulers") or []:
            for key in ("base_lrs", "_last_lr"):
                if isinstance(sched.get(key), list):
                    sched[key] = [sched[key][i] for i in sources]
            if isinstance(sched.get("lr_lambdas"), list):
                sched["lr_lambdas"] = [sched["lr_lambdas"][i] for i in sources]

    def on_fit_start(self) -> None:
        # Here, not in setup: Lightning knows the checkpoint a fit resumes from only after setup.
        # A new run refuses half of muP or DeepNet; a resumed one has its weights made already.
        half = self.ranker.cfg.half_methods()
        if half and self.trainer.ckpt_path is None:
            raise ValueError("; ".join(half))

    def configure_model(self) -> None:
        if self.compile_model and not self._compiled:
            self.ranker.compile()  # in place: keeps state-dict keys (no `_orig_mod.`)
            if self.branch_loss:  # the training steps run forward_parts (train_loss)
                self._forward_parts = torch.compile(self.ranker.forward_parts)
            self._compiled = True

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, Batch):
            return batch.to(device, non_blocking=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # -- steps ---------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> torch.Tensor:
        return self.ranker(batch)

    def train_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The training loss of ``batch`` (the log loss and every term beside it) and the logits."""
        if self.branch_loss:  # each part on its own too
            head_B, wide_B = (self._forward_parts or self.ranker.forward_parts)(batch)
            logits_B = head_B + wide_B
            loss = self.branch_loss * (_log_loss(head_B, batch) + _log_loss(wide_B, batch))
        else:
            logits_B, loss = self.ranker(batch).float(), 0.0
        return loss + _log_loss(logits_B, batch) + self._auxiliary_loss(logits_B, batch), logits_B

    def _shared_step(self, batch: Batch, stage: Stage) -> torch.Tensor:
        if stage == "train":
            loss, logits_B = self.train_loss(batch)
        else:
            logits_B = self.ranker(batch).float()
            loss = _log_loss(logits_B, batch)
        w_B = batch.weight
        metrics = {"train": self.train_metrics, "val": self.val_metrics, "test": self.test_metrics}[stage]
        metrics.update(logits_B.detach(), batch.label, w_B)
        if stage == "train":
            self.log(TRAIN_LOSS, loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(batch))
            loss = self._poison_if_nonfinite(loss)
        else:
            eval_loss = self.val_loss if stage == "val" else self.test_loss
            eval_loss.update(logits_B.detach(), batch.label, w_B)
            self.log(f"{stage}/loss", eval_loss, on_epoch=True, prog_bar=True, batch_size=len(batch))
        bar = stage == "val"  # the validation metrics show on the progress bar as they come
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(batch), prog_bar=bar)
        if stage != "train":
            gauc = self.val_gauc if stage == "val" else self.test_gauc
            gauc.update(logits_B.detach(), batch.label, batch.group, w_B)
            self.log(f"{stage}/gauc", gauc, on_step=False, on_epoch=True, batch_size=len(batch), prog_bar=bar)
            if stage == "val":
                self.log(VAL_SCORE, self.val_score, on_step=False, on_epoch=True, batch_size=len(batch))
        return loss

    def _auxiliary_loss(self, logits_B: torch.Tensor, batch: Batch) -> torch.Tensor | float:
        """The training terms beside the log loss that are switched on: the within-group ranking
        losses (``pairwise``, ``listwise``) and the embedding tables' L2 penalty
        (``optim.embedding_l2``); 0.0 when none is. ``train/loss`` includes them."""
        terms = []
        if self.pairwise:
            terms.append(self.pairwise * pairwise_loss(logits_B, batch.label, batch.group))
        if self.listwise:
            terms.append(self.listwise * listwise_loss(logits_B, batch.label, batch.group))
        if self.optim_cfg.embedding_l2:
            terms.append(0.5 * self.optim_cfg.embedding_l2 * table_l2(self._tables))
        return torch.stack(terms).sum() if terms else 0.0

    def _poison_if_nonfinite(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss``, unchanged when finite; when not, with NaN put into one parameter's gradient.

        A non-finite loss can have finite, even zero, gradients (two huge but finite sample
        weights: their sum overflows, the loss is inf / inf and every gradient w / inf = 0), so
        the gradient-norm guard would let the step through, and under DDP the other ranks would
        not know. ``t - t.detach()`` with ``t = sum(p * s)`` is 0 in value and has gradient ``s``
        with respect to ``p``: ``s`` = 0 while the loss is finite (value and gradients exactly
        unchanged), NaN when it is not. DDP's gradient all-reduce then carries the NaN to every
        rank, and every rank's guard skips the step and counts it. No host sync: all on device."""
        p = self._sentinel
        s = torch.where(torch.isfinite(loss.detach()), 0.0, float("nan")).to(p.dtype)
        t = (p * s).sum()
        return loss + (t - t.detach()).to(loss.dtype)

    @functools.cached_property
    def _sentinel(self) -> torch.nn.Parameter:
        """The smallest trainable parameter (cheapest to touch every step)."""
        return min((p for p in self.ranker.parameters() if p.requires_grad), key=lambda p: p.numel())

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        # Unknown ids in the rows trained on this epoch, per id field: summed on the device, logged
        # at epoch end. Rows a rank repeats to match the others' batch count (DDP) count again; the
        # exact count per split is the DataModule's set-up check (validate='full').
        self._oov = batch.oov if self._oov is None else self._oov + batch.oov
        return self._shared_step(batch, "train")

    def on_train_epoch_end(self) -> None:
        dm = self.data
        if dm is None:
            return
        counts = self._take_oov(len(dm.oov_fields))
        # Summed over ranks by Lightning's own epoch-end metric sync (sync_dist with on_step=False
        # reduces when the epoch's metrics are computed), never by a collective of this hook: the
        # progress bar computes those metrics on rank 0 alone, inside the callbacks' epoch-end
        # hooks, so a reduce here met rank 0's metric all_gather and both ranks waited for good.
        for name, value in zip(dm.oov_fields, counts):
            self.log(
                OOV.format(field=name), value, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True
            )

    def _take_oov(self, n_fields: int) -> torch.Tensor:
        """The unknown-id counts summed on this rank since the last call (zeros without rows), as
        float32; then cleared."""
        counts = self._oov if self._oov is not None else torch.zeros(n_fields, device=self.device)
        self._oov = None
        return counts.float()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, torch.Tensor]:
        self._oov = batch.oov if self._oov is None else self._oov + batch.oov
        logits_B = self.ranker(batch).float()
        return {"keys": batch.keys, "logit": logits_B, "score": torch.sigmoid(logits_B), "label": batch.label}

    def on_predict_end(self) -> None:
        dm = self.data
        if dm is None:
            return
        # Predict logs no metrics, so no other collective can interleave with this one; a rank that
        # got no rows (fewer rows than ranks) still joins the sum.
        counts = self._take_oov(len(dm.oov_fields))
        if self.trainer.world_size > 1:
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
        unknown = {name: int(n) for name, n in zip(dm.oov_fields, counts.tolist()) if n}
        if unknown and self.trainer.is_global_zero:
            log.warning("predict: unknown ids mapped to the OOV row (scored, not dropped): %s", unknown)

    # -- non-finite guard ----------------------------------------------------------------------
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clipping (``optim.grad_clip``) and the non-finite guard share one gradient-norm pass."""
        params = [p for p in self.parameters() if p.grad is not None]
        if not params:
            return
        total = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        # GPU sync, once per step, by necessity: deciding to skip the step needs a host-side answer
        # (the same trade GradScaler makes). Gradients are all-reduced already, so ranks agree.
        if not bool(torch.isfinite(total)):
            self._skip_nonfinite_step()
            return
        self._nonfinite_in_a_row = 0
        if self.optim_cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.optim_cfg.grad_clip, total, foreach=True)
        if self.optim_cfg.embedding_decay > 0:
            self._decay_touched_rows(optimizer)

    @torch.no_grad()
    def _decay_touched_rows(self, optimizer: torch.optim.Optimizer) -> None:
        """``optim.embedding_decay`` on the rows of each embedding table that this step's gradient
        touches (a row no sample read has an all-zero gradient), at its group's current LR; before
        the AdamW step, where AdamW itself decays. On the device: no sync."""
        lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
        for table in self._tables:
            if table.grad is None:
                continue
            touched_V1 = table.grad.ne(0).any(dim=1, keepdim=True)
            decay = 1.0 - lr_of[id(table)] * self.optim_cfg.embedding_decay
            table.mul_(torch.where(touched_V1, decay, 1.0))

    @functools.cached_property
    def _tables(self) -> list[torch.nn.Parameter]:
        return [m.weight for m in self.ranker.modules() if isinstance(m, torch.nn.Embedding)]

    def _skip_nonfinite_step(self) -> None:
        for p in self.parameters():
            p.grad = None  # AdamW skips parameters without gradients: weights and moments untouched
        self.nonfinite_total += 1
        self._nonfinite_in_a_row += 1
        # Reported on log steps by the LossSpikes callback (health/nonfinite_steps), from this buffer.
        log.warning(
            "step %d: non-finite gradients, step skipped (%d in a row)",
            self.global_step,
            self._nonfinite_in_a_row,
        )
        limit = self.optim_cfg.max_nonfinite_steps
        if self._nonfinite_in_a_row >= limit:
            raise RuntimeError(
                f"{self._nonfinite_in_a_row} optimizer steps in a row had non-finite gradients "
                f"(limit optim.max_nonfinite_steps={limit}); the run diverged. Lower optim.lr, add "
                "warmup (optim.warmup_steps), turn on model.qk_norm, or check the data for extreme values."
            )

    # -- optimizer -----------------------------------------------------------------------------
    def make_optimizer(self, fused: bool | None = None) -> torch.optim.Optimizer:
        """AdamW over the ranker's parameter groups (kinds, rules, muP's hidden LR multiplier)."""
        return build_optimizer(
            self.ranker,
            self.ranker.param_kinds(),
            self.optim_cfg,
            hidden_lr_mult=hidden_lr_multiplier(self.ranker.cfg),
            rules=self.ranker.optimizer_rules,
            fused=fused,
        )

    def configure_optimizers(self) -> dict[str, Any]:
        # fp16 with a GradScaler: Lightning leaves a fused AdamW to unscale inside its step, after
        # on_before_optimizer_step, where this module clips and checks gradients and the health
        # callbacks read them: they would see gradients times the loss scale. Unfused, Lightning
        # unscales first. (bf16 and fp32 have no scaler.)
        precision = str(self.trainer.precision) if self._trainer is not None else ""
        optimizer = self.make_optimizer(fused=False if precision.startswith("16") else None)
        # Printed once, by global rank 0, at fit start (Lightning's console logger): what a run trains
        # with belongs on screen, not only at INFO level of this module's logger.
        for line in describe_groups(optimizer.param_groups):
            rank_zero_info(line)
        # May be inf (no max_steps / max_epochs): build_scheduler says what to set unless constant.
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else 1
        optim_cfg = self.optim_cfg
        if self._trainer is not None and self.trainer.fast_dev_run and total <= optim_cfg.warmup_steps:
            # A smoke run of a step or a few: the schedule cannot matter, and a config made for
            # real runs should pass it unchanged. Real runs shorter than their warmup still fail.
            log.warning(
                "fast_dev_run: %s step(s), not more than optim.warmup_steps=%s; this smoke run "
                "steps its LR schedule without warmup",
                total,
                optim_cfg.warmup_steps,
            )
            optim_cfg = replace(optim_cfg, warmup_steps=0)
        scheduler = build_scheduler(optimizer, optim_cfg, total_steps=max(1, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
