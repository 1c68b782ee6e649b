"""The scaling lab: named grids of ordinary recformer runs (``configs/lab/``), run in parallel and
resumable, summarised from each run's health metrics, and reported as tables and plots.

- ``grids``: a grid file read into its points;
- ``runner``: the data made once, each point a ``recformer fit`` subprocess, resume;
- ``summary``: a finished point's figures, from its metrics and the doctor's checks;
- ``report``: results.csv, results.md and the plots;
- ``cli``: ``recformer lab list | run | report``.
"""

from recformer.lab.cli import main

__all__ = ["main"]
