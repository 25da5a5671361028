"""The training examples run end to end on a small slice of the corpus (issue 15, items 2 and 3)."""

from __future__ import annotations

import importlib.util
import json
import os
import re

import pytest

from maxjax.train.data import python_docs_path

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def _docs():
    try:
        python_docs_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_finetune_smollm2_lowers_held_out_perplexity_and_exports_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "tuned"
    code = _load("finetune_smollm2").main([
        "--steps", "5", "--batch", "2", "--seq", "32", "--lr", "5e-3", "--eval-batches", "2", "--max-files", "12",
        "--max-new-tokens", "2", "--out", str(out), "--checkpoints", str(tmp_path / "ckpt"), "--checkpoint-every", "2",
        "--no-progress",
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    last = text.strip().splitlines()[-1]
    m = re.fullmatch(r"held-out perplexity: ([\d.]+) -> ([\d.]+) \(exported to (.+)\)", last)
    assert m, last
    assert float(m.group(2)) < float(m.group(1))
    assert m.group(3) == str(out) and (out / "model.safetensors").exists()
    assert "before: " in text and "after: " in text and "train step compiled in" in text
    assert sorted(int(n) for n in os.listdir(tmp_path / "ckpt") if n.isdigit())[-1] == 5


def test_finetune_smollm2_refuses_a_missing_corpus(tmp_path, capsys):
    assert _load("finetune_smollm2").main(["--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"error: corpus '{tmp_path / 'none'}': no such file or directory"
    with pytest.raises(SystemExit):
        _load("finetune_smollm2").parse_args(["--steps", "0"])


def test_train_from_scratch_plots_its_loss_curve(tmp_path, capsys):
    code = _load("train_from_scratch").main([
        "--steps", "6", "--layers", "1", "--hidden", "64", "--seq", "32", "--batch", "2", "--max-files", "6",
        "--eval-every", "3", "--eval-batches", "1", "--out", str(tmp_path), "--no-progress",
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    m = re.fullmatch(r"held-out bits per byte: ([\d.]+) -> ([\d.]+) \(loss curve: (.+)\)", text.strip().splitlines()[-1])
    assert m and float(m.group(2)) < float(m.group(1))
    assert os.path.getsize(tmp_path / "loss.png") > 1000
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history["loss"]) == 6 and history["eval_step"] == [0, 3, 6]
