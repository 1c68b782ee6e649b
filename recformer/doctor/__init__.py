"""``recformer doctor RUN_DIR``: read a run's internal metrics and say which silent failure it has.

Reads ``RUN_DIR/health.jsonl`` (written by ``recformer.callbacks.sink.MetricSink``) and, when
present, Lightning's ``RUN_DIR/metrics.csv`` (loss, validation metrics, ``health/nonfinite_steps``);
neither needs W&B. Each check below looks at one metric family and, when it fires, reports the
evidence: the metric, the blocks, the steps and the values. A run with no finding gets a clean bill
of health, stated as such.

=========================  ===================================================================
check                      fires when (thresholds: the constants of checks.py; DESIGN sec. 6)
=========================  ===================================================================
bottom_starvation          median grad_ratio_bottom_top over the 2nd half < STARVATION_RATIO
idle_deep_layers           a block in the upper half has median cos_adjacent > IDLE_COS
residual_growth            resid_rms rises block after block and last / first >= RESID_GROWTH
attention_collapse         a block's median attention entropy < ENTROPY_COLLAPSE
attention_uniform          a block's median attention entropy > ENTROPY_UNIFORM
update_ratio_low           a block's median update ratio < UPDATE_RATIO_LOW (not learning)
update_ratio_high          a block's update ratio > UPDATE_RATIO_HIGH at some log step (unstable)
loss_spikes                health/loss_spike > 0; Adam second moments checked for recovery
weight_norm_runaway        a block's weight norm grows >= WEIGHT_GROWTH over the 2nd half, rising
                           at >= RISING_FRACTION of the log steps
nonfinite_steps            health/nonfinite_steps > 0
nonfinite_loss             train/loss or val/loss NaN or Inf at a logged step (with the check above)
=========================  ===================================================================

"Median" statistics are over the last third of the run's log points (the 2nd half where stated),
so the start-up transient (warmup, init) does not decide. Outputs, in ``--out`` (default
``RUN_DIR/doctor``): one PNG per metric family (value per block over steps) and ``index.html``
showing the findings and the plots together. ``--json`` prints the findings as JSON instead of text.

Exit status: 0 = clean bill of health, 1 = at least one finding, 2 = no metrics could be read, or
none of the checks found the metrics it needs (a run logged without the health callbacks).

The package, one job per module: ``runs`` reads a run directory into series, ``checks`` holds the
thresholds and the checks, ``report`` writes the text and the HTML page, ``plots`` the PNGs, and
``cli`` is the command.
"""

from recformer.doctor.checks import CHECKS, Diagnosis, Finding, adam_recovery, diagnose
from recformer.doctor.cli import main
from recformer.doctor.plots import write_plots
from recformer.doctor.report import report_text, write_html
from recformer.doctor.runs import RunMetrics, Series, load_run

__all__ = [
    "CHECKS",
    "Diagnosis",
    "Finding",
    "RunMetrics",
    "Series",
    "adam_recovery",
    "diagnose",
    "load_run",
    "main",
    "report_text",
    "write_html",
    "write_plots",
]
