"""Every MovieLens test row through a running ``recformer serve`` as raw requests (movieIds through
the artifact's item map, raw dense values, event timestamps) scores what ``recformer predict``
scores for it, within the export's tolerance, on both backends (``bench/serve_parity.py``).
About 3 minutes on 2 CPU cores: slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from recformer.datasets import movielens as ml
from recformer.export import TOLERANCE
from tests.conftest import load_bench
from tests.test_module import logger_config

pytest.importorskip("litserve")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_movielens_test_row_through_the_server_scores_what_predict_scores(tmp_path):
    data = tmp_path / "movielens"
    ml.prepare(ROOT / ml.DEFAULT_SOURCE, data, ROOT / ml.DEFAULT_ITEMS, max_len=50)
    run = tmp_path / "fit"
    cli = cli_main(
        ["fit", logger_config(run), "--config", str(ROOT / "configs/model/small.yaml")]
        + ["--config", str(ROOT / "configs/data/movielens.yaml"), f"--data.data_dir={data}"]
        + ["--data.num_workers=0", "--trainer.max_steps=60", "--trainer.val_check_interval=30"]
        + ["--model.optim.warmup_steps=10"]
        + ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={run}"]
    )
    written = [c.last_model_path or c.best_model_path for c in cli.trainer.checkpoint_callbacks]
    ckpt = next((path for path in written if path), None)
    assert ckpt, f"the fit wrote no checkpoint under {run}"
    art = tmp_path / "artifact"
    assert (
        recformer_main(
            ["export", "--ckpt", ckpt, "--data", str(data), "--out", str(art), "--item-ids", "movie_id"]
        )
        == 0
    )
    parity = load_bench("serve_parity")
    predictions = tmp_path / "predictions.parquet"
    parity.predict(Path(ckpt), data, "test", predictions)
    for backend in ("onnx", "torch-export"):
        out = tmp_path / f"parity-{backend}.json"
        args = ["--ckpt", ckpt, "--artifact", str(art), "--data", str(data), "--backend", backend]
        assert parity.main([*args, "--predictions", str(predictions), "--out", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["rows"] == 9818 and result["rows_missing"] == 0
        assert result["requests"] < result["rows"]  # some requests carried several candidates
        assert result["max_abs_score_diff"] <= TOLERANCE == result["tolerance"]
