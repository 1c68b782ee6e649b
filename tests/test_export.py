"""recformer export: torch.export and ONNX artifacts whose scores match the checkpoint's, with a
dynamic batch axis, named inputs, the encodings and a manifest; bad requests refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from recformer.data.datamodule import RecDataModule
from recformer.export import FORMATS, INPUTS, TOLERANCE, Scorer, inputs_of, load, sha256
from tests.test_module import fit_args

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _checkpoint(data: Path, root: Path, *extra: str) -> Path:
    cli = cli_main(fit_args(data, root, "--trainer.max_steps=3", "--trainer.logger=false", *extra))
    return Path(
        cli.trainer.checkpoint_callbacks[-1].last_model_path
        or cli.trainer.checkpoint_callbacks[-1].best_model_path
    )


@pytest.fixture(scope="module")
def transformer_ckpt(tiny_data, tmp_path_factory) -> Path:
    return _checkpoint(tiny_data, tmp_path_factory.mktemp("fit"))


def test_both_formats_match_the_checkpoint_at_any_batch_size(transformer_ckpt, tiny_data, tmp_path, capsys):
    out = tmp_path / "artifact"
    assert (
        recformer_main(
            ["export", "--ckpt", str(transformer_ckpt), "--data", str(tiny_data), "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "torch-export" in printed and "onnx" in printed and "max |score diff|" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == list(INPUTS) and manifest["inputs"][0]["shape"] == [
        "batch"
    ]
    assert manifest["checkpoint"]["sha256"] == sha256(transformer_ckpt) and manifest["arch"] == "transformer"
    assert (
        manifest["model"]["ranker"]["d_model"] == 16
        and "columns" in json.dumps(manifest["spec"])
        or manifest["spec"]
    )
    assert (out / "encodings" / "spec.yaml").is_file()
    for fmt, file in FORMATS.items():
        par = manifest["formats"][fmt]["parity"]
        assert par["rows"] == 90 and par["max_abs_score_diff"] <= TOLERANCE
        assert manifest["formats"][fmt]["sha256"] == sha256(out / file)
    # The batch axis is dynamic: 1 row, 7 rows, every test row, each against the eager model.
    from recformer.evaluate import load_module

    eager = Scorer(load_module(transformer_ckpt).ranker).eval()
    dm = RecDataModule(str(tiny_data), eval_batch_size=128, num_workers=0, predict_split="test")
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader())).to("cpu")
    for fmt in FORMATS:
        run = load(out, fmt)
        for rows in (1, 7, len(batch)):
            inputs = tuple(t[:rows] for t in inputs_of(batch))
            with torch.no_grad():
                want = eager(*inputs).numpy()
            got = run(*(t.numpy() for t in inputs))
            assert got.shape == (rows,) and np.abs(got - want).max() <= TOLERANCE, (fmt, rows)


def test_the_export_path_of_the_lookup_equals_embedding_bag(transformer_ckpt, tiny_data, monkeypatch):
    """The tokenizer's gather-and-sum path (taken under torch.export) computes embedding_bag's sums,
    padding rows left out, on data with history categoricals, item features and padded events."""
    from recformer.evaluate import load_module

    tokens = load_module(transformer_ckpt).ranker.tokens
    with torch.no_grad():
        tokens.table.weight[tokens.pad_row].fill_(3.0) if tokens.pad_row is not None else None
    dm = RecDataModule(str(tiny_data), eval_batch_size=64, num_workers=0, predict_split="test")
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader())).to("cpu")
    with torch.no_grad():
        want, *_ = tokens._lookup(batch)
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        got, *_ = tokens._lookup(batch)
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("arch", ["din", "deepfm", "dcnv2", "bst", "popularity"])
def test_every_baseline_exports_or_is_refused_by_name(arch, tiny_data, tmp_path, capsys):
    ckpt = _checkpoint(tiny_data, tmp_path / "fit", f"--model.arch={arch}")
    out = tmp_path / "artifact"
    code = recformer_main(["export", "--ckpt", str(ckpt), "--data", str(tiny_data), "--out", str(out)])
    err = capsys.readouterr().err
    if code == 0:  # every baseline exports today (the test keeps the refusal honest if one stops)
        manifest = json.loads((out / "manifest.json").read_text())
        assert all(m["parity"]["max_abs_score_diff"] <= TOLERANCE for m in manifest["formats"].values())
    else:
        (line,) = [x for x in err.splitlines() if x.startswith("recformer export:")]
        assert f"model.arch={arch} cannot be exported" in line and "Traceback" not in err


@pytest.mark.parametrize(
    "options",
    [
        ("--model.ranker.fm=true", "--model.ranker.item_bias=true"),
        (
            "--model.ranker.cross_layers=1",
            "--model.ranker.head_product=true",
            "--model.ranker.cross_hidden=[8]",
        ),
        ("--model.ranker.cross_layers=1", "--model.ranker.head_fields=true"),
        ("--model.ranker.token_params=specific",),
        ("--model.ranker.history_tokens=2", "--model.ranker.history_older=mean"),
    ],
)
def test_the_transformer_with_its_wide_terms_exports_with_parity(tiny_data, tmp_path, options):
    """The FM crosses, the per-item bias, the cross network, the head's extra inputs, the
    non-sequence tokens' own weights and the blocks' shorter history (with its mean token) are part
    of the exported graph, not dropped."""
    ckpt = _checkpoint(tiny_data, tmp_path / "fit", *options)
    out = tmp_path / "artifact"
    assert recformer_main(["export", "--ckpt", str(ckpt), "--data", str(tiny_data), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["formats"]) == set(FORMATS)
    assert all(m["parity"]["max_abs_score_diff"] <= TOLERANCE for m in manifest["formats"].values())


def test_a_model_the_tracer_cannot_take_is_one_line_naming_it(
    transformer_ckpt, tiny_data, tmp_path, capsys, monkeypatch
):
    def untraceable(*args, **kwargs):
        raise RuntimeError("data-dependent branch on a tensor value\n  a long tracer story")

    monkeypatch.setattr(torch.export, "export", untraceable)
    args = ["export", "--ckpt", str(transformer_ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "a")]
    assert recformer_main([*args, "--format", "torch-export"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.arch=transformer cannot be exported to torch-export" in err
    assert "data-dependent branch" in err and "long tracer story" not in err


def test_bad_requests_are_refused_by_name(transformer_ckpt, tiny_data, tmp_path, capsys):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "kept").write_text("a file the user had here")
    args = ["export", "--ckpt", str(transformer_ckpt), "--data", str(tiny_data), "--out", str(out)]
    assert recformer_main(args) == 2
    assert "--out" in capsys.readouterr().err and (out / "kept").is_file()
    ckpt = ["export", "--ckpt", str(transformer_ckpt)]
    assert recformer_main([*ckpt, "--data", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "has no spec.yaml" in capsys.readouterr().err
    bad = tmp_path / "bad.ckpt"
    bad.write_text("not a checkpoint")
    assert (
        recformer_main(["export", "--ckpt", str(bad), "--data", str(tiny_data), "--out", str(tmp_path / "y")])
        == 2
    )
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("recformer export:")]
    assert "bad.ckpt" in line
    with pytest.raises(SystemExit):
        recformer_main([*ckpt, "--data", str(tiny_data), "--out", str(tmp_path / "z"), "--format", "tflite"])
