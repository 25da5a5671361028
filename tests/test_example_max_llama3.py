"""examples/max_llama3.py: SmolLM2 built as MAX's llama3.py builds a Llama3, run as a MAX graph
(ragged batch, paged KV cache as a graph buffer) through InferenceSession, gives the greedy tokens
of ``maxjax generate`` for both reference prompts in one ragged batch."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_max_llama3_example_matches_generate(capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import max_llama3
    finally:
        sys.path.remove(str(EXAMPLES))
    got, want = max_llama3.main(["--max-new-tokens", "4"])
    assert len(got) == 2 and all(len(g) == 4 for g in got)
    assert got == want, capsys.readouterr().out
