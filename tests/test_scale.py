"""Issue 23 (scale): synthetic Llama-3-shaped GGUFs, and the checks that refuse a model before loading it.

The tiny synthetic GGUF (2 blocks, hidden 64, SmolLM2's tokenizer) is written once per module by
``scripts/make_synthetic_gguf.py``; the real shapes are checked from the script's tensor plan
(parameter counts of the published models) without writing their files.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_synthetic_gguf as synth  # noqa: E402

from maxjax.models import load_model  # noqa: E402
from maxjax.models.loading import MEMORY_ENV, memory_plan  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return synth.write_gguf("tiny", "q8_0", tmp_path_factory.mktemp("synth") / "tiny-q8_0.gguf", verbose=False)


def test_real_shapes_have_the_published_parameter_counts():
    # Llama-3.2-1B, -3.2-3B and -3.1-8B as Hugging Face counts them (tied embeddings count once)
    counts = {name: sum(math.prod(shape) for _, shape, _, _ in synth.tensor_plan(synth.SHAPES[name])) for name in synth.SHAPES}
    assert counts["llama-3.2-1b"] == 1_235_814_400
    assert counts["llama-3.2-3b"] == 3_212_749_824
    assert counts["llama-3.1-8b"] == 8_030_261_248


def test_tiny_gguf_metadata_and_shapes(tiny):
    r = gguf.GGUFReader(str(tiny))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert meta["general.architecture"] == "llama"
    assert (meta["llama.block_count"], meta["llama.embedding_length"], meta["llama.feed_forward_length"]) == (2, 64, 128)
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (4, 2)
    assert meta["llama.rope.freq_base"] == 500000.0 and meta["llama.rope.dimension_count"] == 16
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert meta["llama.vocab_size"] == len(tokens) == 49152
    shapes = {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist()))) for t in r.tensors}
    assert shapes["token_embd.weight"] == ("Q8_0", (49152, 64))
    assert shapes["blk.1.attn_k.weight"] == ("Q8_0", (32, 64))  # 2 KV heads of 16
    assert shapes["blk.0.ffn_down.weight"] == ("Q8_0", (64, 128))
    assert shapes["blk.0.attn_norm.weight"] == ("F32", (64,))
    assert "output.weight" not in shapes  # tied, as Llama 3.2
    assert len(shapes) == 1 + 2 * 9 + 1
    # the blocks are the quantizer's: finite, not all alike, of the planned scale (1/sqrt(64))
    q = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    w = gguf.quants.dequantize(np.asarray(q.data), q.tensor_type)
    assert np.isfinite(w).all() and 0.08 < float(w.std()) < 0.17


def test_padded_vocabulary_keeps_every_id_valid():
    fields = synth.tokenizer_fields(128256)
    tokens, types = fields["tokenizer.ggml.tokens"][0], fields["tokenizer.ggml.token_type"][0]
    assert len(tokens) == len(types) == 128256 and len(set(tokens)) == 128256
    assert tokens[-1] == "<|reserved_special_token_79103|>" and types[-1] == int(gguf.TokenType.UNUSED)


def test_a_tokenizer_only_gguf_stands_in_for_the_package(tmp_path, monkeypatch):
    """``--tokenizer-only`` writes the tokenizer alone; ``$MAXJAX_SYNTHETIC_TOKENIZER`` pointing at
    it gives the files the same tokenizer as the bundled SmolLM2's (a machine without it)."""
    from maxjax.tokenizer import Tokenizer

    tok = tmp_path / "tokenizer.gguf"
    assert synth.main(["--shape", "tiny", "--tokenizer-only", "--out", str(tok)]) == 0
    assert tok.stat().st_size < 4 << 20  # the metadata alone (SmolLM2's file is 94 MB)
    bundled, bundled_tokens = synth.tokenizer_gguf(), synth.tokenizer_fields(128256)["tokenizer.ggml.tokens"][0]
    synth.tokenizer_fields.cache_clear()
    monkeypatch.setenv("MAXJAX_SYNTHETIC_TOKENIZER", str(tok))
    try:
        assert synth.tokenizer_gguf() == tok != bundled
        assert synth.tokenizer_fields(128256)["tokenizer.ggml.tokens"][0] == bundled_tokens
    finally:
        synth.tokenizer_fields.cache_clear()
    text = "The quick brown fox, 1234 times."
    ids = Tokenizer.from_gguf(str(tok)).encode(text)
    assert ids == Tokenizer.from_gguf(str(bundled)).encode(text) and len(ids) > 5


def test_tiny_loads_and_decodes(tiny):
    from maxjax.graph.weights import gguf as gguf_weights

    lm = load_model(tiny)
    # the parsed metadata (tens of MB for a 128k vocabulary) is not kept once the model is built
    assert not [k for k in gguf_weights._CACHE if k[0] == str(Path(tiny).resolve())]
    assert (lm.config.num_hidden_layers, lm.config.hidden_size, lm.config.vocab_size) == (2, 64, 49152)
    (g,) = lm.generate(["Hello"], max_new_tokens=6, stop_at_eos=False)
    assert len(g.token_ids) == 6 and all(0 <= t < 49152 for t in g.token_ids)
    k, v = lm.new_cache(1, 16)
    ids = np.asarray([lm.encode_prompt("Hello")], np.int32)
    _, logits, _, _ = lm.prefill(ids, [ids.shape[1]], k, v)
    assert np.isfinite(np.asarray(logits)).all() and float(np.asarray(logits).std()) > 0


def test_too_large_is_refused_with_the_numbers(tiny, monkeypatch):
    plan = memory_plan(tiny)
    assert plan["weights"] > 3_000_000 and plan["kv_cache"] == 2 * 2 * 2 * 16 * 4096 * 4
    budget = plan["file"] + 1  # the file alone fits; with the run-time layout and the KV cache it does not
    assert plan["total"] > budget
    monkeypatch.setenv(MEMORY_ENV, str(budget))
    with pytest.raises(ValueError) as e:
        load_model(tiny)
    msg = str(e.value)
    for number in (f"{plan['total']} bytes", f"{budget} bytes"):
        assert number in msg
    assert "file 5.0 MiB" in msg and "KV cache for 4096 tokens 2.0 MiB" in msg and f"${MEMORY_ENV}" in msg
    monkeypatch.setenv(MEMORY_ENV, "1K")  # smaller than the file: refused before it is opened
    with pytest.raises(ValueError, match=r"its files take .* more than the 1\.0 KiB"):
        load_model(tiny)


def test_unsupported_type_is_named_before_loading(tmp_path, monkeypatch):
    path = synth.write_gguf("tiny", "q8_0", tmp_path / "mx.gguf", verbose=False, types={"blk.1.ffn_up.weight": "mxfp4"})
    monkeypatch.setenv(MEMORY_ENV, str(path.stat().st_size + 1))  # too small to load: the type is named first
    with pytest.raises(ValueError, match=r"tensor 'blk\.1\.ffn_up\.weight' uses GGML type MXFP4, which maxjax cannot load"):
        load_model(path)


def _mapping(address: int) -> tuple[int, int, list[str]] | None:
    """``(start, end, VmFlags)`` of the mapping of this process that holds ``address`` (Linux
    smaps), or None."""
    found, inside = None, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
            if inside:
                found = (lo, hi, [])
        elif inside and line.startswith("VmFlags:"):
            found = (found[0], found[1], line.split()[1:])
    return found


def test_host_buffers_for_weights_are_maps_of_their_own_and_jax_adopts_them():
    import gc
    import mmap

    import jax

    from maxjax.engine.placement import host_stack
    from maxjax.graph.weights._host import aligned_empty

    small = aligned_empty(1000)
    assert small.ctypes.data % 64 == 0 and small.nbytes == 1000 and small.flags.writeable
    if Path("/proc/self/smaps").exists():
        big = aligned_empty(8 << 20)
        big[:] = 1
        lo, hi, flags = _mapping(big.ctypes.data)  # the kernel may merge it with a neighbouring map
        assert big.ctypes.data % mmap.PAGESIZE == 0 and lo <= big.ctypes.data and big.ctypes.data + (8 << 20) <= hi
        assert "hg" not in flags  # not advised for huge pages (their synchronous compaction stalls loads)
    layers = [np.full((1024, 1024), i, np.float32) for i in range(3)]  # 12 MiB
    stack = host_stack(layers)
    assert stack.shape == (3, 1024, 1024) and stack.ctypes.data % 64 == 0 and not stack.flags.writeable
    device = jax.device_put(stack)
    assert device.unsafe_buffer_pointer() == stack.ctypes.data  # adopted, not copied
    del stack, layers
    gc.collect()  # the map lives as long as the array that JAX adopted
    np.testing.assert_array_equal(np.asarray(device)[:, 0, 0], [0, 1, 2])
    np.testing.assert_array_equal(np.asarray(device)[2, 1023, 1023], 2)


_CHURN = """
import json, threading
from maxjax.backend.cpu import release_freed_heap

def rss_anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

kept = []

def churn():  # 256 MB in 64 KiB blocks, each written and freed, a small block kept after each
    blocks = []
    for _ in range(4096):
        blocks.append(bytearray(b"x" * 65536))
        kept.append(bytearray(1024))  # malloc (pymalloc takes 512 bytes and less): pins the heap above the freed block
    del blocks

thread = threading.Thread(target=churn)
thread.start()
thread.join()
before = rss_anon()
released = release_freed_heap()
print(json.dumps([released, before, rss_anon()]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_freed_heap_goes_back_to_the_system():
    """Memory a worker thread allocated in blocks below glibc's mmap threshold and freed stays
    resident in its arena until :func:`release_freed_heap` gives it back (what a compile leaves,
    which the CPU policy releases after each one). In a fresh process: the state of this one's
    arenas is whatever the tests before left."""
    import json
    import subprocess

    from maxjax.backend import policy_for
    from maxjax.backend.cpu import _malloc_trim

    if _malloc_trim() is None:
        pytest.skip("the C library has no malloc_trim (not glibc)")
    assert policy_for("cpu").release_freed_heap
    out = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, timeout=120, check=True)
    released, before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert released and before - after > 128 << 20, (before >> 20, after >> 20)
