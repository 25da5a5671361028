"""A llama checkpoint's metadata and tensors are checked before anything is built (issue 17).

Small synthetic checkpoints (``tests/llama_files.py``) with one thing wrong: each must be refused
with one line naming the file and the key or tensor at fault, expected against actual, and fast.
The fuzz harness (``tests/test_fuzz_loaders.py``) tries a few hundred more.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

import llama_files as L
from maxjax.cli import main as cli_main
from maxjax.dtype import DType
from maxjax.models import load_model, registry
from maxjax.models.generation import NonFiniteLogitsError
from maxjax.models.llama import LlamaConfig
from maxjax.models.loading import MEMORY_ENV, available_memory, check_fits_in_memory

T = gguf.GGMLQuantizationType


def _meta(**edits):
    """The pristine metadata with ``key=(kind, value)`` edits (None deletes); keys use '__' for '.'."""
    edits = {k.replace("__", "."): v for k, v in edits.items()}
    out = [e for e in L.gguf_metadata() if e[0] not in edits]
    out += [(k, *v) for k, v in edits.items() if v is not None]
    return out


def _gguf(tmp_path, meta=None, tensors=None, name="m.gguf") -> Path:
    return L.write_gguf(tmp_path / name, meta if meta is not None else L.gguf_metadata(), tensors if tensors is not None else L.gguf_tensors())


def _refused(path, match: str) -> str:
    with pytest.raises(ValueError, match=match) as e:
        load_model(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


@pytest.fixture
def no_build(monkeypatch):
    """Fails the test if a module is built (the checks must come first)."""
    arch = registry._REGISTRY["llama"]

    def build(*a, **k):
        raise AssertionError("a module was built before the checks failed")

    monkeypatch.setitem(registry._REGISTRY, "llama", dataclasses.replace(arch, build=build))


def test_a_lying_block_count_is_refused_before_building(tmp_path, no_build):
    # (its time was asserted here once, under a second; a loaded GPU host took 1.14 s: speed is
    # for benchmarks, not unit tests)
    path = _gguf(tmp_path, _meta(llama__block_count=("u32", 100000)))
    _refused(path, r"llama\.block_count is 100000, but the file has no tensors of block 2 \(blk\.2\.\*\): it has blocks blk\.0 to blk\.1")


@pytest.mark.parametrize(
    "edits,message",
    [
        ({"llama__attention__head_count": ("u32", 0)}, r"llama\.attention\.head_count must be a positive integer, got 0$"),
        ({"llama__embedding_length": ("u32", 0)}, r"llama\.embedding_length must be a positive integer, got 0$"),
        ({"llama__embedding_length": ("u32", 63)}, r"llama\.embedding_length \(63\) must be a multiple of llama\.attention\.head_count \(4\)"),
        ({"llama__embedding_length": ("u32", 60)}, r"llama\.embedding_length / llama\.attention\.head_count = 60 / 4 = 15: the head size must be even"),
        ({"llama__attention__head_count": ("u32", 3)}, r"llama\.attention\.head_count \(3\) must be a multiple of llama\.attention\.head_count_kv \(2\)"),
        ({"llama__block_count": ("str", "lots")}, r"llama\.block_count must be a positive integer, got 'lots' \(a string\)"),
        ({"llama__block_count": ("f32", 2.0)}, r"llama\.block_count must be a positive integer, got 2\.0"),
        ({"llama__block_count": ("bool", True)}, r"llama\.block_count must be a positive integer, got True \(a boolean\)"),
        ({"llama__context_length": ("u32", 2**32 - 1)}, r"llama\.context_length must be a positive integer of at most 2147483647, got 4294967295"),
        ({"llama__attention__head_count_kv": ("arr", [2, 2])}, r"llama\.attention\.head_count_kv must be a positive integer, got \[2, 2\] \(a list\)"),
        ({"llama__attention__layer_norm_rms_epsilon": ("f32", float("nan"))}, r"llama\.attention\.layer_norm_rms_epsilon must be a finite number > 0, got nan"),
        ({"llama__attention__layer_norm_rms_epsilon": None}, r"GGUF metadata has no 'llama\.attention\.layer_norm_rms_epsilon'"),
        ({"llama__rope__freq_base": ("f32", 0.0)}, r"llama\.rope\.freq_base must be a finite number > 0, got 0\.0"),
        ({"llama__rope__freq_base": ("f32", float("inf"))}, r"llama\.rope\.freq_base must be a finite number > 0, got inf"),
        ({"llama__attention__key_length": ("u32", 15)}, r"llama\.attention\.key_length must be even .* got 15"),
        ({"llama__attention__value_length": ("u32", 8)}, r"llama\.attention\.value_length is 8, but the head size \(llama\.embedding_length / llama\.attention\.head_count = 64 / 4\) is 16"),
        ({"llama__rope__dimension_count": ("u32", 8)}, r"llama\.rope\.dimension_count is 8, but the head size \(.*\) is 16: partial rotary"),
        ({"llama__expert_count": ("u32", 8)}, r"llama\.expert_count is 8: mixture-of-experts"),
        ({"llama__rope__scaling__factor": ("str", "lots")}, r"llama\.rope\.scaling\.factor must be a finite number > 0, got 'lots'"),
        ({"llama__vocab_size": ("u32", 200)}, r"tokenizer\.ggml\.tokens has 264 tokens, more than llama\.vocab_size \(200\)"),
    ],
)
def test_bad_metadata_is_one_line_naming_the_file_and_key(tmp_path, no_build, edits, message):
    _refused(_gguf(tmp_path, _meta(**edits)), message)


def _retyped_in_header(src: Path, dst: Path, name: str, qtype) -> Path:
    from fuzz_cases import _gguf_layout

    raw = bytearray(src.read_bytes())
    (info,) = [i for i in _gguf_layout(src)[0] if i["name"] == name]
    struct.pack_into("<I", raw, info["type"], int(qtype))
    dst.write_bytes(bytes(raw))
    return dst


def _with(name, value):
    t = L.gguf_tensors()
    if value is None:
        del t[name]
    else:
        t[name] = value
    return t


def _q(shape, qtype=T.Q4_1, fill=None):
    a = np.random.default_rng(1).standard_normal(shape) * 0.1 if fill is None else np.full(shape, fill)
    if qtype in (None, T.F32):
        return a.astype(np.float32), None
    return gguf.quants.quantize(a.astype(np.float32), qtype), qtype


def test_tensors_are_checked_against_the_metadata(tmp_path, no_build):
    # vocabulary: token_embd rows against llama.vocab_size (49153 rows loaded before)
    _refused(
        _gguf(tmp_path, tensors=_with("token_embd.weight", _q((265, 64), T.Q8_0)), name="a.gguf"),
        r"tensor token_embd\.weight has shape \[265, 64\], expected \[264, 64\] = \[llama\.vocab_size, llama\.embedding_length\]$",
    )
    _refused(
        _gguf(tmp_path, tensors=_with("blk.1.attn_k.weight", _q((64, 64))), name="b.gguf"),
        r"tensor blk\.1\.attn_k\.weight has shape \[64, 64\], expected \[32, 64\] = \[llama\.attention\.head_count_kv \* head size",
    )
    _refused(_gguf(tmp_path, tensors=_with("blk.1.ffn_up.weight", None), name="c.gguf"), r"tensor blk\.1\.ffn_up\.weight is missing")
    _refused(_gguf(tmp_path, tensors=_with("blk.2.attn_q.weight", _q((64, 64))), name="d.gguf"), r"llama\.block_count is 2, but the file has tensors of block 2")
    _refused(_gguf(tmp_path, tensors=_with("blk.0.attn_q.bias", _q((64,), None)), name="e.gguf"), r"tensor blk\.0\.attn_q\.bias is not a llama tensor")
    _refused(_gguf(tmp_path, tensors=_with("blk.0.attn_norm.weight", _q((64,), T.Q8_0)), name="f.gguf"), r"tensor blk\.0\.attn_norm\.weight is Q8_0; maxjax's llama takes a norm weight as F32$")
    _refused(_gguf(tmp_path, tensors=_with("blk.0.attn_k.weight", (np.zeros((32, 64), np.int32), None)), name="g.gguf"), r"tensor blk\.0\.attn_k\.weight is I32")
    _refused(
        _gguf(tmp_path, tensors=_with("blk.0.attn_q.weight", _q((64, 64), T.Q8_0)), name="h.gguf"),
        r"tensor blk\.0\.attn_q\.weight is Q8_0, but blk\.1\.attn_q\.weight is Q4_1: maxjax runs every block with one program",
    )
    nan_norm = L.gguf_tensors()["blk.1.ffn_norm.weight"][0].copy()
    nan_norm[5] = np.nan
    _refused(_gguf(tmp_path, tensors=_with("blk.1.ffn_norm.weight", (nan_norm, None)), name="i.gguf"), r"tensor blk\.1\.ffn_norm\.weight holds 1 non-finite value\(s\) \(nan at index 5\)")
    _refused(_gguf(tmp_path, tensors=_with("rope_freqs.weight", _q((8,), None)), name="j.gguf"), r"rope_freqs\.weight\) is not supported")


def test_a_tensor_retyped_in_the_header_is_blamed_on_that_tensor(tmp_path, no_build):
    """Q4_1 -> Q8_0 on blk.0.attn_q was blamed on layers.1.self_attn.q_proj.weight."""
    pristine = L.write_llama_gguf(tmp_path / "pristine.gguf")
    path = _retyped_in_header(pristine, tmp_path / "retyped.gguf", "blk.0.attn_q.weight", T.Q8_0)
    msg = _refused(path, r"tensor blk\.0\.attn_q\.weight \(Q8_0 \[64, 64\]: 4352 bytes at offset \d+ of the data section\) would end at \d+, but the next tensor, blk\.0\.attn_k\.weight, starts at")
    assert "layers.1" not in msg
    smaller = _retyped_in_header(pristine, tmp_path / "retyped-smaller.gguf", "blk.0.attn_norm.weight", T.F16)
    _refused(smaller, r"tensor blk\.0\.attn_norm\.weight \(F16 \[64\]: 128 bytes")


def _hf(tmp_path, cfg=None, tensors=None, text=None, name="hf"):
    return L.write_hf_dir(tmp_path / name, cfg if cfg is not None else L.hf_config(), tensors if tensors is not None else L.hf_tensors(), config_text=text)


@pytest.mark.parametrize(
    "edit,message",
    [
        ({"text": b"[1, 2]"}, r"config\.json: must be a JSON object, got a list"),
        ({"text": b"{"}, r"config\.json: not valid JSON: Expecting property name"),
        ({"text": b"\xff{}"}, r"config\.json: not UTF-8 text \(byte 0xff at offset 0\)"),
        ({"num_attention_heads": 0}, r"config\.json: num_attention_heads must be a positive integer, got 0$"),
        ({"hidden_size": "lots"}, r"config\.json: hidden_size must be a positive integer, got 'lots' \(a string\)"),
        ({"num_hidden_layers": 2.0}, r"config\.json: num_hidden_layers must be a positive integer, got 2\.0"),
        ({"vocab_size": None}, r"config\.json: vocab_size must be a positive integer, got null"),
        ({"rms_norm_eps": float("nan")}, r"config\.json: rms_norm_eps must be a finite number > 0, got nan"),
        ({"rope_theta": 0}, r"config\.json: rope_theta must be a finite number > 0, got 0"),
        ({"tie_word_embeddings": "true"}, r"config\.json: tie_word_embeddings must be true or false, got 'true' \(a string\)"),
        ({"hidden_act": "gelu"}, r"config\.json: hidden_act must be 'silu'"),
        ({"num_key_value_heads": 3}, r"config\.json: num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
        ({"num_hidden_layers": 100000}, r"config\.json: num_hidden_layers is 100000, but the file has no tensors of block 2"),
        ({"intermediate_size": 128}, r"model\.safetensors: tensor model\.layers\.0\.mlp\.down_proj\.weight has shape \[64, 96\], expected \[64, 128\] = \[hidden_size, intermediate_size\]"),
        ({"tie_word_embeddings": False}, r"model\.safetensors: tensor lm_head\.weight is missing \(config\.json's tie_word_embeddings is false\)"),
    ],
)
def test_bad_config_json_is_one_line_naming_the_file_and_key(tmp_path, no_build, edit, message):
    text = edit.pop("text", None)
    cfg = {**L.hf_config(), **edit}
    path = _hf(tmp_path, cfg, text=text)
    _refused(path, message)


def test_hugging_face_tensors_are_checked(tmp_path, no_build):
    t = L.hf_tensors()
    t["model.layers.0.input_layernorm.weight"][3] = np.inf
    _refused(_hf(tmp_path, tensors=t, name="a"), r"model\.safetensors: tensor model\.layers\.0\.input_layernorm\.weight holds 1 non-finite value\(s\) \(inf at index 3\)")
    t = L.hf_tensors()
    t["model.layers.1.self_attn.k_proj.weight"] = t["model.layers.1.self_attn.k_proj.weight"].astype(np.int32)
    _refused(_hf(tmp_path, tensors=t, name="b"), r"tensor model\.layers\.1\.self_attn\.k_proj\.weight is int32; maxjax's llama takes float32, bfloat16, float16 weights")
    t = L.hf_tensors()
    t["model.layers.0.mlp.gate_proj.bias"] = np.zeros(96, np.float32)
    _refused(_hf(tmp_path, tensors=t, name="c"), r"tensor model\.layers\.0\.mlp\.gate_proj\.bias is not a llama tensor")


def test_tied_embeddings_ignore_a_stored_head_as_hugging_face_does(tmp_path):
    t = L.hf_tensors()
    t["lm_head.weight"] = np.zeros((L.VOCAB, L.HIDDEN), np.float32)
    lm = load_model(_hf(tmp_path, tensors=t))
    assert lm.config.tie_word_embeddings and "lm_head.weight" not in lm.module.raw_state_dict()


def test_a_model_larger_than_the_memory_available_is_refused_before_it_is_opened(tmp_path, monkeypatch, no_build):
    path = L.write_llama_gguf(tmp_path / "m.gguf")
    size = path.stat().st_size
    monkeypatch.setenv(MEMORY_ENV, "10000")
    msg = _refused(path, rf"its files take .* \({size} bytes\), more than the 9\.8 KiB \(10000 bytes\) of memory available \(\${MEMORY_ENV}\); set {MEMORY_ENV}=unlimited")
    assert msg
    with pytest.raises(ValueError, match=r"x\.gguf: the model's tensors take 2\.0 GiB \(2147483648 bytes\), more than"):
        check_fits_in_memory(2**31, "x.gguf")
    monkeypatch.setenv(MEMORY_ENV, "1G")
    assert available_memory() == (2**30, f"${MEMORY_ENV}")
    monkeypatch.setenv(MEMORY_ENV, "unlimited")
    check_fits_in_memory(2**62, "x.gguf")
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match=rf"\${MEMORY_ENV} must be a number of bytes"):
        check_fits_in_memory(1, "x.gguf")
    monkeypatch.delenv(MEMORY_ENV)
    have, where = available_memory()
    assert have > 0 and where


def test_non_finite_logits_are_an_error_not_a_silent_eos(tmp_path, capsys):
    """NaN weights in a matrix (not checked at load: reading every weight would cost a pass over
    the file) give NaN logits: generation reports them instead of decoding EOS from them."""
    path = _gguf(tmp_path, tensors=_with("blk.0.attn_q.weight", _q((64, 64), T.F32, np.nan)) | {"blk.1.attn_q.weight": _q((64, 64), T.F32)})
    lm = load_model(path)
    with pytest.raises(NonFiniteLogitsError, match=rf"{path}: the model computed non-finite logits \(NaN or infinity\) for new token 1 of row 0"):
        lm.generate(["hello"], 4)
    assert issubclass(NonFiniteLogitsError, ValueError)
    assert cli_main(["generate", "--model", str(path), "--max-new-tokens", "3", "hello"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "non-finite logits" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv,code,message",
    [
        (["--max-new-tokens", "abc", "hi"], 2, "maxjax generate: error: argument --max-new-tokens: invalid int value: 'abc' (see maxjax generate --help)"),
        (["--bogus", "hi"], 2, "maxjax generate: error: unrecognized arguments: --bogus"),
        (["--dtype", "float16", "hi"], 2, "argument --dtype: invalid choice: 'float16'"),
    ],
)
def test_cli_usage_errors_are_one_line(capsys, argv, code, message):
    with pytest.raises(SystemExit) as e:
        cli_main(["generate", *argv])
    assert e.value.code == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_names_max_new_tokens_beyond_the_context(tmp_path, capsys):
    path = L.write_llama_gguf(tmp_path / "m.gguf")
    assert cli_main(["generate", "--model", str(path), "--max-new-tokens", str(2**64), "hello"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--max-new-tokens {2**64}: the prompt (1 tokens) plus the new tokens exceed the model's context of 128 tokens ({path})" in err


def test_the_synthetic_model_round_trips_its_config(tmp_path):
    gguf_config = LlamaConfig.from_gguf_metadata(dict((k, v) for k, _, v in L.gguf_metadata()) | {"general.architecture": "llama"}, False, "x")
    hf_config = LlamaConfig.from_hf_config(json.loads(json.dumps(L.hf_config())))
    assert dataclasses.replace(gguf_config, rms_norm_eps=L.RMS_EPS) == hf_config == LlamaConfig(**L.CONFIG)
    defaults = {k: v for k, v in L.hf_config().items() if k not in ("head_dim", "num_key_value_heads", "rope_theta", "rms_norm_eps")}
    assert LlamaConfig.from_hf_config(defaults) == LlamaConfig(**{**L.CONFIG, "num_key_value_heads": L.HEADS, "rms_norm_eps": 1e-6})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_hugging_face_weights_widen_on_read_to_the_same_model(tmp_path, dtype):
    """A bfloat16/float16 checkpoint loads as float32 (each tensor converted in its one copy out of
    the map): the same logits, bit for bit, as a float32 checkpoint of the same rounded values.
    (A bfloat16 one keeps its weights where the policy's ``keep_16bit_weights`` holds, the
    CPU's default: tests/test_16bit_weights.py; this is the policy that widens at load.)"""
    import dataclasses

    import jax
    import ml_dtypes

    from maxjax.backend import policy_for
    from maxjax.graph.weights.lazy import LazyTensor
    from maxjax.models import checkpoint

    widen = dataclasses.replace(policy_for("cpu"), keep_16bit_weights=False)
    low = {k: v.astype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float16) for k, v in L.hf_tensors().items()}
    narrow = _hf(tmp_path, tensors=low, name="narrow")
    wide = _hf(tmp_path, tensors={k: v.astype(np.float32) for k, v in low.items()}, name="wide")
    _, _, state = checkpoint.open_hf_checkpoint(narrow, lazy=True, policy=widen)
    w = state["layers.1.mlp.down_proj.weight"]
    assert w.dtype == DType.float32 and isinstance(w.data, LazyTensor) and w.data.stored_dtype.itemsize == 2
    np.testing.assert_array_equal(np.asarray(w.data), low["model.layers.1.mlp.down_proj.weight"].astype(np.float32))
    a, b = load_model(narrow, policy=widen), load_model(wide)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(a.state))
    tokens = np.array([[3, 9, 4, 17, 2]], np.int32)
    la = a.prefill(tokens, [5], *a.new_cache(1, 16))[1]
    lb = b.prefill(tokens, [5], *b.new_cache(1, 16))[1]
    np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
    assert a.generate(["the"], 6)[0].token_ids == b.generate(["the"], 6)[0].token_ids


def test_a_bfloat16_checkpoint_loaded_in_bfloat16_keeps_its_weights(tmp_path, monkeypatch):
    """``load_model(dtype=bfloat16)`` on a Hugging Face directory: the weights stay bfloat16 (as MAX's
    Llama runs them: half the float32 bytes, none converted), the memory check counts them so, and
    the logits are the float32 model's to bfloat16 rounding; a float32 file narrows on read."""
    import dataclasses

    import jax
    import ml_dtypes

    from maxjax.backend import policy_for

    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in L.hf_tensors().items()}
    narrow = _hf(tmp_path, tensors=low, name="narrow")
    wide = _hf(tmp_path, tensors={k: v.astype(np.float32) for k, v in low.items()}, name="wide")
    a32 = load_model(narrow, policy=dataclasses.replace(policy_for("cpu"), keep_16bit_weights=False))  # widened at load
    a = load_model(narrow, dtype=DType.bfloat16)
    b = load_model(wide, dtype=DType.bfloat16)
    leaves = jax.tree.leaves(a.state)
    assert {x.dtype for x in leaves} == {np.dtype(ml_dtypes.bfloat16)} == {x.dtype for x in jax.tree.leaves(b.state)}
    assert 2 * sum(x.nbytes for x in leaves) == sum(x.nbytes for x in jax.tree.leaves(a32.state))
    w = np.asarray(a.module.state_dict()["layers.1.mlp.down_proj.weight"])
    np.testing.assert_array_equal(w, low["model.layers.1.mlp.down_proj.weight"])  # the file's values, unchanged
    tokens = np.array([[3, 9, 4, 17, 2]], np.int32)
    k, v = a.new_cache(1, 16)
    assert k.dtype == v.dtype == ml_dtypes.bfloat16
    la, l32 = (np.asarray(m.prefill(tokens, [5], *m.new_cache(1, 16))[1], np.float32) for m in (a, a32))
    lb = np.asarray(b.prefill(tokens, [5], *b.new_cache(1, 16))[1], np.float32)
    np.testing.assert_array_equal(la, lb)  # same values, whichever file dtype they came from
    scale = float(np.abs(l32).max())
    assert 0 < float(np.abs(la - l32).max()) < 0.05 * scale  # bfloat16 activations: close, not equal
    assert len(a.generate(["the"], 4)[0].token_ids) == 4
    # the memory check counts the weights in the load dtype: float32 would not fit, bfloat16 does
    from maxjax.models.loading import memory_plan

    need32, need16 = (memory_plan(narrow, dtype=d)["total"] for d in (DType.float32, DType.bfloat16))
    assert need16 < need32
    monkeypatch.setenv(MEMORY_ENV, str((need16 + need32) // 2))
    _refused(narrow, r"does not fit in memory: .* needed")
    assert load_model(narrow, dtype=DType.bfloat16).config == a.config


def test_a_bad_tokenizer_is_reported_before_a_failure_of_the_weights_built_beside_it(tmp_path, no_build):
    """The tokenizer is built on a second thread while the weights are placed; its error still
    comes first, as when it was built before anything else (here the module's build fails too)."""
    meta = [(k, kind, "no-such-pre" if k == "tokenizer.ggml.pre" else v) for k, kind, v in L.gguf_metadata()]
    _refused(_gguf(tmp_path, meta=meta), r"unsupported pre-tokenizer tokenizer\.ggml\.pre='no-such-pre'; supported: ")
    with pytest.raises(AssertionError, match="a module was built"):  # a good tokenizer: the build's own error
        load_model(_gguf(tmp_path, name="good-tokenizer.gguf"))


def test_the_tokenizer_built_beside_the_weights_is_the_files(tmp_path):
    from maxjax.tokenizer import Tokenizer

    path = _gguf(tmp_path)
    lm = load_model(path)
    alone = Tokenizer.from_gguf(path)
    for text in ("hello world", "hell\u00e9 <|im_end|> the"):
        assert lm.tokenizer.encode(text) == alone.encode(text)
    assert lm.tokenizer.eos_token_ids == alone.eos_token_ids
