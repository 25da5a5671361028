"""``maxjax embed``: JSON lines that match sentence-transformers, the cosine table, input errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from maxjax.cli import main

REF = np.load(Path(__file__).parent / "data" / "minilm_reference.npz")
SENTENCES = [str(s) for s in REF["sentences"]]


def test_embed_input_file_prints_json_lines_and_similarity(tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text(f"{SENTENCES[2]}\n\n{SENTENCES[3]}\n{SENTENCES[4]}\n", encoding="utf-8")  # a blank line is skipped
    assert main(["embed", "--input", str(path), "--batch-size", "2", "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["text"] for d in lines] == SENTENCES[2:5]
    emb = np.array([d["embedding"] for d in lines], np.float32)
    ref = REF["embeddings"][2:5]
    cos = (emb * ref).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)
    assert emb.shape == (3, 384) and cos.min() >= 0.99999
    assert main(["embed", "--similarity", SENTENCES[2], SENTENCES[3], SENTENCES[4]]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 4 and rows[1].split()[-3:][0] == "1.000"
    expected = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    assert rows[1].split()[-2] == f"{float(expected[0] @ expected[1]):.3f}"


def test_embed_bad_input_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe not utf-8\n")
    assert main(["embed", "--input", str(bad)]) == 1
    assert capsys.readouterr().err.strip() == f"maxjax embed: error: --input {bad}: not UTF-8 text (byte 0xff at offset 5)"
    assert main(["embed"]) == 1
    assert "no sentences" in capsys.readouterr().err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    assert main(["embed", "--input", str(blank)]) == 1
    assert "no non-blank line" in capsys.readouterr().err
    assert main(["embed", "--batch-size", "0", "x"]) == 1
    assert "--batch-size must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["embed", "--model", str(tmp_path), "x"]) == 1
    assert capsys.readouterr().err.strip() == f"maxjax embed: error: {tmp_path}: no config.json in the model directory (required)"
