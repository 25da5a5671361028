"""SmolLM2-135M-Instruct (the real Q4_1 GGUF) end to end, against Hugging Face transformers.

The reference (tests/data/smollm2_reference.json) was made by scripts/reference_smollm2.py with
transformers on PyTorch, float32, on the same GGUF. torch is not needed here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from maxjax.cli import main as cli_main
from maxjax.models import load_model

REF = json.loads((Path(__file__).parent / "data" / "smollm2_reference.json").read_text())["cases"]


@pytest.fixture(scope="module")
def lm():
    return load_model()


@pytest.mark.parametrize("case,chat", [("raw", False), ("chat", True)])
def test_tokens_logits_and_greedy_continuation_match_transformers(lm, case, chat):
    ref = REF[case]
    ids = lm.encode_prompt(ref["prompt"], chat=chat)
    assert ids == ref["prompt_ids"]
    k, v = lm.new_cache(1, 128)
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, : len(ids)] = ids
    _, logits, _, _ = lm.prefill(tokens, [len(ids)], k, v)
    logits = np.asarray(logits)[0]
    top = ref["top20_last_prompt_position"]
    assert list(np.argsort(-logits, kind="stable")[:20]) == top["ids"]
    np.testing.assert_allclose(logits[top["ids"]], np.array(top["logits"], np.float32), atol=1e-3, rtol=0)
    out = lm.generate([ref["prompt"]], 32, chat=chat, stop_at_eos=False)[0]
    assert out.token_ids == ref["greedy"]["token_ids"]


def test_bfloat16_drifts_from_float32_no_more_than_transformers_bfloat16():
    """``--dtype bfloat16`` against transformers' own bfloat16 run of the same file.

    bfloat16 keeps 8 significant bits: at logits of 16 to 32 one step is 0.125, and a whole
    model in bfloat16 moves the logits by a few tenths (transformers: up to 0.59 and 0.71 over
    the vocabulary for the two prompts), enough to flip the greedy near-ties the reference
    lists. maxjax's bfloat16 must stay within 4 steps of transformers' bfloat16 at the
    float32 top-20 and drift from float32 no more than twice as far as transformers' does.
    """
    from maxjax.dtype import DType

    lm16 = load_model(dtype=DType.bfloat16)
    for ref in REF.values():
        ids = ref["prompt_ids"]
        k, v = lm16.new_cache(1, 128)
        tokens = np.zeros((1, 64), np.int32)
        tokens[0, : len(ids)] = ids
        _, logits, _, _ = lm16.prefill(tokens, [len(ids)], k, v)
        top = ref["top20_last_prompt_position"]
        ours = np.asarray(logits, np.float32)[0][top["ids"]]
        f32 = np.array(top["logits"], np.float32)
        hf16 = np.array(ref["bfloat16"]["logits_at_float32_top20"], np.float32)
        assert np.abs(ours - hf16).max() <= 4 * 0.125
        assert np.abs(ours - f32).max() <= 2 * ref["bfloat16"]["max_abs_diff_vs_float32"]
        assert np.abs(ours - f32).max() > 0  # it is bfloat16 indeed


def test_chat_stops_at_end_of_turn(lm):
    out = lm.generate([REF["chat"]["prompt"]], 32, chat=True)[0]
    assert out.finish_reason == "eos"
    assert out.text == REF["chat"]["greedy"]["text_until_eos"]


def test_batch_of_different_lengths_equals_one_by_one_and_never_recompiles_per_token(lm):
    prompts = ["The quick brown fox", "Once upon a time, in a land far away, there lived"]
    singles = [lm.generate([p], 12, stop_at_eos=False)[0].token_ids for p in prompts]
    before = lm.num_compiles
    batch = lm.generate(prompts, 12, stop_at_eos=False)
    assert [b.token_ids for b in batch] == singles
    compiled_for_batch = lm.num_compiles - before
    assert compiled_for_batch == 2  # one prefill and one decode shape for batch 2; none per token
    lm.generate(prompts, 24, stop_at_eos=False)  # more tokens, same cache bucket
    lm.generate(["A different prompt", "of other lengths entirely here"], 5, stop_at_eos=False)
    assert lm.num_compiles - before == compiled_for_batch


def test_compile_time_is_reported_apart_from_decode_time(lm):
    prompts = ["A batch of three", "of a shape no other test uses", "so that it compiles here"]
    a = lm.generate(prompts, 4, stop_at_eos=False)[0]
    b = lm.generate(prompts, 4, stop_at_eos=False)[0]
    assert a.compile_seconds > 0.05 and b.compile_seconds == 0
    assert a.decode_seconds < a.compile_seconds  # three decode steps, without their compile
    assert a.token_ids == b.token_ids


def test_sampling_is_reproducible_and_top_k_1_is_greedy(lm):
    p = "The quick brown fox"
    a = lm.generate([p], 10, temperature=0.9, top_p=0.95, seed=3, stop_at_eos=False)[0].token_ids
    b = lm.generate([p], 10, temperature=0.9, top_p=0.95, seed=3, stop_at_eos=False)[0].token_ids
    c = lm.generate([p], 10, temperature=0.9, top_p=0.95, seed=4, stop_at_eos=False)[0].token_ids
    assert a == b and a != c
    k1 = lm.generate([p], 10, temperature=1.5, top_k=1, seed=5, stop_at_eos=False)[0].token_ids
    assert k1 == REF["raw"]["greedy"]["token_ids"][:10]


def test_stream_pieces_join_to_the_text(lm):
    pieces = list(lm.stream("The quick brown fox", 16, stop_at_eos=False))
    assert len(pieces) > 3
    assert "".join(pieces) == lm.last_generation.text
    assert lm.last_generation.token_ids == REF["raw"]["greedy"]["token_ids"][:16]


def test_bad_generation_arguments(lm):
    with pytest.raises(ValueError, match="the prompt is empty"):
        lm.generate([""], 4)
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        lm.generate(["hi"], 0)
    with pytest.raises(ValueError, match="exceeds the model's context of 8192 tokens"):
        lm.generate(["hello " * 9000], 4)


def test_generate_tokens_from_ids_matches_generate(lm):
    chat_ids = lm.encode_prompt("What is the capital of France?", chat=True)
    raw_ids = REF["raw"]["prompt_ids"]
    outs = lm.generate_tokens([raw_ids, chat_ids], 12)
    assert outs[0].token_ids == REF["raw"]["greedy"]["token_ids"][:12]
    assert outs[1].token_ids == REF["chat"]["greedy"]["token_ids"][: len(outs[1].token_ids)]
    assert outs[0].prompt_ids == raw_ids and outs[0].prompt == ""
    with pytest.raises(ValueError, match="row 1: the prompt is empty"):
        lm.generate_tokens([[1, 2], []], 4)
    with pytest.raises(ValueError, match=r"row 0: token id 49152 is outside the vocabulary \[0, 49152\)"):
        lm.generate_tokens([[1, 49152]], 4)


def test_weights_take_the_policy_layout_and_nibbles_stay_4_bit_with_the_same_tokens(lm, capsys):
    import jax

    from maxjax.graph.quantization import LAYOUTS, NibbleArray

    layers = lm.state["stacked"][0]
    expected = LAYOUTS[lm.program.policy.quantized_layout]  # the CPU policy's choice for this CPU
    assert type(layers["self_attn.q_proj.weight"]) is expected
    assert type(layers["mlp.down_proj.weight"]) is expected
    nib = load_model(quantized_layout="nibbles")
    down = nib.state["stacked"][0]["mlp.down_proj.weight"]
    assert isinstance(down, NibbleArray) and down.shape == (lm.config.num_hidden_layers, 576, 1536)
    # a Q4_1 weight takes exactly its bytes in the file: 20 per block of 32 values
    assert down.nbytes == sum(a.nbytes for a in jax.tree.leaves(down)) == lm.config.num_hidden_layers * 576 * 1536 // 32 * 20
    other = "unpacked" if lm.program.quantized_layout == "nibbles" else "nibbles"
    assert cli_main(["generate", "--quantized-layout", other, "--max-new-tokens", "8", "--verbose", "The quick brown fox"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(" with a quick brown bear.")
    # --verbose: the peak resident set and its measured parts, which add up to it
    m = re.search(r"\[memory: peak RSS ([\d,]+) MB = weights ([\d,]+) MB \(quantized layout (\w+)\) \+ KV cache ([\d,]+) MB "
                  r"\+ before loading ([\d,]+) MB .* \+ rest (-?[\d,]+) MB", err)  # fmt: skip
    assert m, err
    peak, weights, layout, kv, before, rest = (int(v.replace(",", "")) if v[0].isdigit() or v[0] == "-" else v for v in m.groups())
    assert layout == other and abs(peak - (weights + kv + before + rest)) <= 2  # MB rounding
    nib_mb = sum(a.nbytes for a in jax.tree.leaves(nib.state)) / 1e6
    assert kv > 0 and (abs(weights - nib_mb) <= 1 if other == "nibbles" else weights > nib_mb)  # unpacked: one byte a value


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.5}, "temperature must be a finite number >= 0, got -0.5"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"top_p": 0.0}, r"top_p must be a finite number in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be a finite number in \(0, 1\], got 1.5"),
        ({"top_k": -1}, r"top_k must be an integer in \[0, 2147483647\], got -1"),
        ({"top_k": 2.5}, r"top_k must be an integer"),
        ({"seed": 2**80}, r"seed must be an integer in \[-2\*\*63, 2\*\*63 - 1\]"),
    ],
)
def test_generate_refuses_bad_sampling_parameters_before_running(lm, kwargs, message):
    compiles = lm.num_compiles
    with pytest.raises(ValueError, match=message):
        lm.generate(["hi"], 4, **kwargs)
    with pytest.raises(ValueError, match=message):
        lm.generate_tokens([[504]], 4, **kwargs)
    assert lm.num_compiles == compiles


def test_cli_generate_streams_and_summarises(capsys):
    assert cli_main(["generate", "--max-new-tokens", "8", "The quick brown fox"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(" with a quick brown bear.")
    assert "[4 prompt tokens, 8 new tokens (length), time to first token" in err and "tokens/s" in err
    assert "compile" in err  # the CLI's first run of each shape compiles: it says how long that took


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", ""], "the prompt is empty"),
        (["generate", "--max-new-tokens", "0", "hi"], "--max-new-tokens must be at least 1"),
        (["generate", "--model", "/no/such/model.gguf", "hi"], "no such file or directory"),
        (["generate", "--top-k", "1099511627776", "hi"], "--top-k must be an integer in [0, 2147483647], got 1099511627776"),
        (["generate", "--seed", str(2**80), "hi"], "--seed must be an integer in [-2**63, 2**63 - 1]"),
        (["generate", "--temperature", "nan", "hi"], "--temperature must be a finite number >= 0, got nan"),
        (["generate", "ab\udcffc"], "PROMPT is not valid UTF-8 text: byte 0xff at character 2"),
    ],
)
def test_cli_generate_bad_input_is_one_line(capsys, argv, message):
    assert cli_main(argv) == 1
    out, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unsupported_architecture_gguf(tmp_path, capsys):
    import gguf

    path = tmp_path / "tiny_gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2' \(supported: llama\)"):
        load_model(path)
    assert cli_main(["generate", "--model", str(path), "hi"]) == 1
    assert "unsupported architecture 'gpt2'" in capsys.readouterr().err


def _hf_name(name: str) -> str:
    return name if name == "lm_head.weight" else "model." + name


def test_hugging_face_directory_and_cache_id_load_the_same_model(lm, tmp_path, monkeypatch):
    """The GGUF's weights written as a Hugging Face llama directory (float32 safetensors, config.json,
    tokenizer.json) generate the same greedy tokens, from the directory and by repo id from a cache."""
    import safetensors.numpy

    from maxjax.graph.weights import GGUFWeights
    from maxjax.models import resolve_model_path
    from maxjax.models.llama import llama_from_gguf

    model_dir = tmp_path / "snapshot"
    model_dir.mkdir()
    state = llama_from_gguf(GGUFWeights(lm.source))
    safetensors.numpy.save_file(
        {_hf_name(k): np.ascontiguousarray(v.dequantize().to_numpy() if v.quantization_encoding else v.to_numpy(), np.float32) for k, v in state.items()},
        str(model_dir / "model.safetensors"),
    )
    config = dict(lm.config.to_dict(), architectures=["LlamaForCausalLM"], model_type="llama")
    (model_dir / "config.json").write_text(json.dumps(config))
    lm.tokenizer.backend.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": lm.tokenizer.chat_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    hf = load_model(model_dir)
    assert hf.config == lm.config
    out = hf.generate([REF["raw"]["prompt"]], 8, stop_at_eos=False)[0]
    assert out.prompt_ids == REF["raw"]["prompt_ids"]
    assert out.token_ids == REF["raw"]["greedy"]["token_ids"][:8]

    hub = tmp_path / "hub"
    snap = hub / "models--HuggingFaceTB--SmolLM2-test" / "snapshots" / "abc123"
    snap.parent.mkdir(parents=True)
    snap.symlink_to(model_dir, target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert resolve_model_path("HuggingFaceTB/SmolLM2-test") == snap
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        resolve_model_path("HuggingFaceTB/missing")
