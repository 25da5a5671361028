"""Checks maxjax's training interop against transformers on torch (run once by hand; not a test).

    .venv/bin/python scripts/reference_train.py [--hf-python /work/refenv/bin/python]

1. Export: SmolLM2 with LoRA adapters on q_proj/v_proj (a fixed, nonzero update), merged and
   written by ``maxjax.train.export.save_pretrained``, is loaded by transformers
   (``AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained(DIR)``): the tokenizer gives the
   same ids as maxjax's, the chat template renders the same text, and the logits of a prompt
   match maxjax's (maximum absolute difference printed), as does a greedy continuation.
2. Import: a randomly initialized ``transformers.LlamaForCausalLM`` (a small config) saved with
   ``save_pretrained`` (its ``state_dict`` as safetensors, and ``config.json``) is loaded into
   maxjax modules by name (``maxjax.models.load_model(DIR)``): the logits of every position match
   torch's.

The torch side runs in ``--hf-python`` (it needs torch, transformers and safetensors; no jax) as a
subprocess fed a JSON request. Prints the comparisons and exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

TORCH_SIDE = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
req = json.load(open(sys.argv[1]))
torch.manual_seed(0)
out = {}
tok = AutoTokenizer.from_pretrained(req["export"])
model = AutoModelForCausalLM.from_pretrained(req["export"], dtype=torch.float32).eval()
out["ids"] = tok(req["prompt"], add_special_tokens=False)["input_ids"]
out["chat"] = tok.apply_chat_template([{"role": "user", "content": req["prompt"]}], tokenize=False, add_generation_prompt=True)
with torch.no_grad():
    logits = model(torch.tensor([req["maxjax_ids"]])).logits[0, -1]
    out["logits"] = logits.tolist()
    gen = model.generate(torch.tensor([req["maxjax_ids"]]), max_new_tokens=16, do_sample=False, eos_token_id=None)
out["greedy"] = gen[0, len(req["maxjax_ids"]):].tolist()
cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False)
small = LlamaForCausalLM(cfg).eval()
small.save_pretrained(req["small"], safe_serialization=True)
with torch.no_grad():
    out["small_logits"] = small(torch.tensor([req["small_ids"]])).logits[0].tolist()
json.dump(out, open(sys.argv[2], "w"))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-python", default="/work/refenv/bin/python", help="a Python with torch and transformers")
    args = ap.parse_args(argv)
    if not os.path.exists(args.hf_python):
        print(f"error: {args.hf_python} does not exist: pass --hf-python a Python with torch and transformers", file=sys.stderr)
        return 2
    import jax
    import numpy as np

    from maxjax import nn, train
    from maxjax.models import load_model
    from maxjax.train.export import save_pretrained

    prompt = "The functools module provides"
    lm = load_model()
    model = train.dequantized(lm.module)
    train.apply_lora(model, ["q_proj", "v_proj"], rank=4, alpha=8, key=jax.random.key(0))
    st = nn.state(model)
    rng = np.random.default_rng(0)
    st = {k: (v + 0.02 * rng.standard_normal(v.shape).astype(np.float32) if "lora_B" in k else v) for k, v in st.items()}
    with tempfile.TemporaryDirectory() as tmp:
        export = save_pretrained(os.path.join(tmp, "export"), model, train.merge_lora(model, st), lm.config, lm.tokenizer)
        ids = lm.tokenizer.encode(prompt)
        small_ids = [int(i) for i in rng.integers(0, 300, 12)]
        req = {"export": export, "prompt": prompt, "maxjax_ids": ids, "small": os.path.join(tmp, "small"), "small_ids": small_ids}
        with open(os.path.join(tmp, "req.json"), "w") as f:
            json.dump(req, f)
        script = os.path.join(tmp, "torch_side.py")
        with open(script, "w") as f:
            f.write(TORCH_SIDE)
        res_path = os.path.join(tmp, "res.json")
        subprocess.run([args.hf_python, script, os.path.join(tmp, "req.json"), res_path], check=True)
        res = json.load(open(res_path))

        failures = []
        tuned = load_model(export)
        _, last, _, _ = tuned.prefill(np.asarray([ids], np.int32), [len(ids)], *tuned.new_cache(1, 64))
        diff = float(np.abs(np.asarray(last[0]) - np.asarray(res["logits"])).max())
        greedy = tuned.generate_tokens([ids], max_new_tokens=16, stop_at_eos=False)[0].token_ids
        chat = tuned.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        print(f"1. export loaded by transformers: ids equal: {res['ids'] == ids}; chat template equal: {res['chat'] == chat}; "
              f"last-position logits max |diff| {diff:.2e}; greedy 16 tokens equal: {list(greedy) == res['greedy']}")  # fmt: skip
        if res["ids"] != ids or res["chat"] != chat or diff > 1e-3 or list(greedy) != res["greedy"]:
            failures.append("export")
        # the directory has no tokenizer (load_model needs one): load the module alone
        from maxjax.graph.weights import load_weights
        from maxjax.models.registry import for_hf_config

        cfg = json.load(open(os.path.join(req["small"], "config.json")))
        arch = for_hf_config(cfg, req["small"])
        config = arch.config_from_hf(cfg, req["small"])
        small = arch.build(config)
        small.load_state_dict(arch.weights_from_hf(load_weights([os.path.join(req["small"], "model.safetensors")]), config),
                              weight_alignment=1)  # fmt: skip
        got = np.asarray(small(np.asarray([small_ids], np.int32)))[0]
        diff2 = float(np.abs(got - np.asarray(res["small_logits"])).max())
        print(f"2. torch LlamaForCausalLM state_dict (safetensors) loaded into maxjax by name: logits of every position max |diff| {diff2:.2e}")
        if diff2 > 1e-4:
            failures.append("import")
    print("OK" if not failures else f"FAILED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
