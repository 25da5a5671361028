"""GGUFWeights on the real SmolLM2 file and on GGUF files the tests write (every plain type, every
supported block encoding, 3-D tensors), and on broken files."""

import os
import struct

import gguf
import numpy as np
import pytest

from maxjax._bundled import smollm2_gguf_path
from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.weights import GGUFWeights, WeightsFileError, WeightsFormat, load_weights, weights_format
from maxjax.graph.weights.gguf import clear_reader_cache

T = gguf.GGMLQuantizationType
E = QuantizationEncoding


@pytest.fixture(scope="module")
def smollm2():
    return GGUFWeights(smollm2_gguf_path())


def write_gguf(path, tensors, kv=None):
    """Writes ``{name: (array, raw_dtype or None)}`` (and uint32 ``kv``) with gguf.GGUFWriter."""
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in (kv or {}).items():
        w.add_uint32(k, v)
    for name, (arr, raw_dtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def random_kquant(enc, rows, cols, seed=0):
    """Random k-quant blocks with small finite float16 scales (so values are finite)."""
    rng = np.random.default_rng(seed)
    bpe, bsize = enc.block_parameters
    nb = cols // bpe
    data = rng.integers(0, 256, (rows, nb, bsize), dtype=np.uint8)
    offsets = {E.Q4_K: [0, 2], E.Q5_K: [0, 2], E.Q6_K: [208]}[enc]
    for off in offsets:
        scale = (rng.standard_normal((rows, nb)) * 0.01).astype("<f2")
        data[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return data.reshape(rows, nb * bsize)


# -- the real file -------------------------------------------------------------------------------


def test_smollm2_tensors_as_described(smollm2):
    names = [n for n, _ in smollm2.items()]
    assert len(names) == 272
    kinds = {}
    for name in names:
        wd = smollm2[name].data() if name == "token_embd.weight" or name.startswith("blk.0.") else None
        if wd is not None:
            kinds[name] = wd
    emb = kinds["token_embd.weight"]
    assert emb.quantization_encoding is E.Q8_0 and emb.dtype is DType.uint8
    assert emb.shape == [49152, 612] and emb.original_shape == [49152, 576]
    q = kinds["blk.0.attn_q.weight"]
    assert q.quantization_encoding is E.Q4_1 and q.shape == [576, 360] and q.original_shape == [576, 576]
    down = kinds["blk.0.ffn_down.weight"]  # GGUF ne = [1536, 576]: the [576, 1536] matrix
    assert down.original_shape == [576, 1536] and down.shape == [576, 960]
    norm = kinds["blk.0.attn_norm.weight"]
    assert norm.dtype is DType.float32 and norm.shape == [576] and norm.quantization_encoding is None
    assert not smollm2.output.weight.exists()  # tied embeddings
    meta = smollm2.metadata
    assert meta["general.architecture"] == "llama"
    assert meta["llama.attention.head_count"] == 9 and meta["llama.attention.head_count_kv"] == 3
    assert len(meta["tokenizer.ggml.tokens"]) == 49152


def test_smollm2_packed_bytes_and_dequantization_match_the_gguf_package(smollm2):
    by_name = {t.name: t for t in smollm2.reader.tensors}  # the gguf package's parse of the file
    for name in ("token_embd.weight", "blk.3.attn_k.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
        wd = smollm2[name].data()
        ref = np.asarray(by_name[name].data)
        np.testing.assert_array_equal(wd.to_numpy(), ref)
        if wd.quantization_encoding is not None:
            rows = slice(0, 256)  # the gguf package's numpy dequantizer is slow on the whole embedding
            expect = gguf.quants.dequantize(ref[rows], by_name[name].tensor_type)
            np.testing.assert_array_equal(wd.dequantize().to_numpy()[rows], expect)


def test_smollm2_loads_packed(smollm2):
    """Every weight packed: the loaded bytes are the file's tensor bytes, all of them."""
    loaded = {n: v.data() for n, v in smollm2.items()}
    assert sum(wd.nbytes for wd in loaded.values()) == sum(int(t.n_bytes) for t in smollm2.reader.tensors)
    assert sum(wd.nbytes for wd in loaded.values()) <= os.path.getsize(smollm2_gguf_path())
    encodings = {}
    for wd in loaded.values():
        key = wd.quantization_encoding.value if wd.quantization_encoding else wd.dtype.name
        encodings[key] = encodings.get(key, 0) + 1
    assert encodings == {"Q8_0": 1, "Q4_1": 210, "float32": 61}


def test_allocate_quantized(smollm2):
    w = GGUFWeights(smollm2_gguf_path())
    wt = w.blk[1].attn_v.weight.allocate()
    assert wt.name == "blk.1.attn_v.weight"
    assert wt.dtype is DType.uint8 and wt.shape == [192, 360] and wt.quantization_encoding is E.Q4_1
    assert wt.original_dtype_and_shape == (DType.float32, [192, 576])
    assert w.blk[1].attn_v.weight.allocate(shape=(192, 576), quantization_encoding=E.Q4_1).shape == [192, 360]
    with pytest.raises(ValueError, match="is Q4_1, but quantization_encoding=.*Q8_0"):
        w.blk[1].attn_k.weight.allocate(quantization_encoding=E.Q8_0)
    with pytest.raises(ValueError, match=r"had different shape \(expected=\(1, 2\), actual=\(Dim\(192\), Dim\(360\)\)\)"):
        w.blk[1].attn_k.weight.allocate(shape=(1, 2))
    assert sorted(w.allocated_weights) == ["blk.1.attn_v.weight"]  # failed allocates recorded nothing


def test_missing_name_says_did_you_mean(smollm2):
    with pytest.raises(KeyError, match=r"Could not find weight named blk.0.attn_qq.weight .*Did you mean 'blk.0.attn_q.weight'"):
        smollm2.blk[0].attn_qq.weight.data()
    with pytest.raises(KeyError, match=r"It is a prefix of 9 weight"):
        smollm2.blk[0].data()


def test_load_weights_picks_gguf_by_suffix_and_by_contents(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"x": (np.arange(4, dtype=np.float32), None)})
    assert weights_format([path]) is WeightsFormat.gguf
    renamed = tmp_path / "model.bin"
    os.rename(path, renamed)
    w = load_weights([renamed])
    assert isinstance(w, GGUFWeights)
    np.testing.assert_array_equal(w.x.data().to_numpy(), np.arange(4, dtype=np.float32))
    other = write_gguf(tmp_path / "n.gguf", {"x": (np.zeros(2, np.float32), None)})
    with pytest.raises(ValueError, match="exactly one path"):
        load_weights([renamed, other])


# -- files the tests write: every type -----------------------------------------------------------


def test_plain_types_and_row_major_shapes(tmp_path):
    rng = np.random.default_rng(0)
    f = rng.standard_normal((3, 64)).astype(np.float32)
    arrays = {
        "f32": f,
        "f16": f.astype(np.float16),
        "f64": f.astype(np.float64),
        "i8": np.arange(-6, 6, dtype=np.int8).reshape(3, 4),
        "i16": np.arange(12, dtype=np.int16).reshape(4, 3),
        "i32": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "i64": np.arange(5, dtype=np.int64) * (1 << 40),
    }
    path = write_gguf(tmp_path / "plain.gguf", {k: (v, None) for k, v in arrays.items()})
    w = GGUFWeights(path)
    for name, arr in arrays.items():
        wd = w[name].data()
        assert wd.dtype == DType.from_numpy(arr.dtype), name
        assert tuple(int(d) for d in wd.shape) == arr.shape, name
        np.testing.assert_array_equal(wd.to_numpy(), arr)  # int64 beyond 2**31 kept exactly


def test_bf16_bytes_are_reinterpreted(tmp_path):
    import ml_dtypes

    f = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    packed = gguf.quants.quantize(f, T.BF16)  # uint8 [4, 64]: what the reader hands out
    w = GGUFWeights(write_gguf(tmp_path / "bf16.gguf", {"w": (packed, T.BF16)}))
    wd = w.w.data()
    assert wd.dtype is DType.bfloat16 and wd.shape == [4, 32] and wd.quantization_encoding is None
    np.testing.assert_array_equal(wd.to_numpy(), f.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("enc", [E.Q4_0, E.Q4_1, E.Q5_0, E.Q5_1, E.Q8_0, E.Q4_K, E.Q5_K, E.Q6_K])
def test_every_block_encoding_loads_packed_and_dequantizes_like_gguf(tmp_path, enc):
    rows, cols = 3, 512
    if enc in (E.Q4_K, E.Q5_K, E.Q6_K):  # the gguf package cannot quantize k-quants: random blocks
        packed = random_kquant(enc, rows, cols)
    else:
        floats = np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32)
        packed = gguf.quants.quantize(floats, enc.to_gguf())
    w = GGUFWeights(write_gguf(tmp_path / f"{enc.value}.gguf", {"w": (packed, enc.to_gguf())}))
    wd = w.w.data()
    assert wd.quantization_encoding is enc and wd.dtype is DType.uint8
    assert wd.shape == list(packed.shape) and wd.original_shape == [rows, cols]
    np.testing.assert_array_equal(wd.to_numpy(), packed)
    np.testing.assert_array_equal(wd.dequantize().to_numpy(), gguf.quants.dequantize(packed, enc.to_gguf()))


def test_three_dimensional_quantized_tensor_is_packed_as_rows(tmp_path):
    floats = np.random.default_rng(3).standard_normal((2, 3, 64)).astype(np.float32)
    packed = gguf.quants.quantize(floats, T.Q8_0)  # [2, 3, 68]
    wd = GGUFWeights(write_gguf(tmp_path / "q3.gguf", {"e": (packed, T.Q8_0)})).e.data()
    assert wd.shape == [6, 68] and wd.original_shape == [2, 3, 64]
    np.testing.assert_array_equal(wd.dequantize().to_numpy(), gguf.quants.dequantize(packed, T.Q8_0))


def test_unsupported_block_type_opens_but_data_says_why(tmp_path):
    blocks = np.zeros((2, 84), np.uint8)  # Q2_K: 84 bytes per 256 elements
    w = GGUFWeights(write_gguf(tmp_path / "q2k.gguf", {"w": (blocks, T.Q2_K), "ok": (np.ones(2, np.float32), None)}))
    assert w.w.exists()
    with pytest.raises(WeightsFileError, match=r"q2k.gguf: tensor 'w' uses GGML type Q2_K, which maxjax cannot load"):
        w.w.data()
    np.testing.assert_array_equal(w.ok.data().to_numpy(), np.ones(2, np.float32))


def test_gguf_reader_source_and_cache(tmp_path):
    path = write_gguf(tmp_path / "r.gguf", {"x": (np.arange(3, dtype=np.float32), None)})
    a, b = GGUFWeights(path), GGUFWeights(path)
    assert a.reader is b.reader  # one reader (and map) per unchanged file
    from_reader = GGUFWeights(gguf.GGUFReader(path))
    np.testing.assert_array_equal(from_reader.x.data().to_numpy(), np.arange(3, dtype=np.float32))
    clear_reader_cache()
    assert GGUFWeights(path).reader is not a.reader


# -- bad input ------------------------------------------------------------------------------------


def _small(tmp_path):
    path = write_gguf(
        tmp_path / "good.gguf",
        {"a": (np.arange(64, dtype=np.float32), None), "b": (np.ones((2, 32), np.float32), None)},
        kv={"llama.block_count": 1},
    )
    return open(path, "rb").read()


def _tensor_field_offsets(raw, tmp_path, name):
    """Byte offsets of tensor ``name``'s type and data-offset fields in the header."""
    p = tmp_path / "probe.gguf"
    p.write_bytes(raw)
    reader = gguf.GGUFReader(str(p))
    t = next(t for t in reader.tensors if t.name == name)
    parts = t.field.parts  # name_len, name, n_dims, dims, type, offset
    type_off = t.field.offset + sum(int(x.nbytes) for x in parts[:4])
    return type_off, type_off + 4


def _write_bad(tmp_path, name, data):
    clear_reader_cache()
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_forget_reader_drops_that_file_only(tmp_path):
    from maxjax.graph.weights.gguf import _CACHE, forget_reader, open_gguf

    a = write_gguf(tmp_path / "a.gguf", {"w": (np.ones(32, np.float32), None)})
    b = write_gguf(tmp_path / "b.gguf", {"w": (np.zeros(32, np.float32), None)})
    ra, rb = open_gguf(a)[0], open_gguf(b)[0]
    forget_reader(a)
    forget_reader(tmp_path / "never-opened.gguf")
    assert open_gguf(b)[0] is rb and open_gguf(a)[0] is not ra
    assert [k[0] for k in _CACHE].count(os.path.realpath(a)) == 1


def test_truncated_tensor_data_names_the_tensor_and_offsets(tmp_path):
    raw = _small(tmp_path)
    p = _write_bad(tmp_path, "trunc.gguf", raw[:-100])
    with pytest.raises(WeightsFileError, match=r"trunc.gguf: tensor 'b' \(F32 \[2, 32\], 256 bytes at offset \d+\) extends past the end of the file"):
        GGUFWeights(p)


def test_truncated_header(tmp_path):
    raw = _small(tmp_path)
    p = _write_bad(tmp_path, "head.gguf", raw[:30])
    with pytest.raises(WeightsFileError, match=r"head.gguf: truncated or corrupted header: reading .* at offset \d+ goes past the end of the file \(30 bytes\)"):
        GGUFWeights(p)


def test_not_a_gguf_file(tmp_path):
    p = _write_bad(tmp_path, "x.gguf", b"NOPE" + bytes(60))
    with pytest.raises(WeightsFileError, match=r"x.gguf: not a GGUF file: it starts with b'NOPE'"):
        GGUFWeights(p)
    e = _write_bad(tmp_path, "empty.gguf", b"")
    with pytest.raises(WeightsFileError, match=r"empty.gguf: is empty"):
        GGUFWeights(e)
    with pytest.raises(WeightsFileError, match=r"nothere.gguf: no such file"):
        GGUFWeights(tmp_path / "nothere.gguf")


def test_unknown_version(tmp_path):
    raw = bytearray(_small(tmp_path))
    raw[4:8] = struct.pack("<I", 7)
    p = _write_bad(tmp_path, "v7.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"v7.gguf: unsupported GGUF version 7"):
        GGUFWeights(p)


def test_unknown_tensor_type(tmp_path):
    raw = bytearray(_small(tmp_path))
    type_off, _ = _tensor_field_offsets(bytes(raw), tmp_path, "b")
    raw[type_off : type_off + 4] = struct.pack("<I", 250)
    p = _write_bad(tmp_path, "type.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"type.gguf: tensor 'b' has unknown GGML tensor type 250"):
        GGUFWeights(p)


def test_tensor_offset_lying_past_the_end(tmp_path):
    raw = bytearray(_small(tmp_path))
    _, data_off = _tensor_field_offsets(bytes(raw), tmp_path, "a")
    raw[data_off : data_off + 8] = struct.pack("<Q", 1 << 40)
    p = _write_bad(tmp_path, "far.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"far.gguf: tensor 'a' .* extends past the end of the file"):
        GGUFWeights(p)


def test_lying_lengths_in_the_header_are_reported_not_looped_over(tmp_path):
    raw = bytearray(_small(tmp_path))
    # The first metadata key's length (u64 right after magic, version, tensor and kv counts).
    raw[24:32] = struct.pack("<Q", 1 << 50)
    p = _write_bad(tmp_path, "key.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"key.gguf: truncated or corrupted header: .* at offset 32"):
        GGUFWeights(p)
    raw = bytearray(_small(tmp_path))
    raw[8:16] = struct.pack("<Q", 1 << 60)  # tensor count
    p = _write_bad(tmp_path, "count.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"count.gguf: truncated or corrupted header"):
        GGUFWeights(p)


def _metadata_gguf(path, rng):
    """A GGUF whose metadata holds every kind of array the parser has a fast path for (and a
    nested one it leaves to the package): strings with accents, emoji, spaces and empty entries,
    every numeric type and bools (the package's writer refuses empty arrays)."""
    V = gguf.GGUFValueType
    words = ["", " ", "Ġthe", "naïve", "日本", "🙂", "a" * 300] + [f"tok{i}" for i in range(5000)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("t.strings", [words[i] for i in rng.integers(0, len(words), 20000)], V.ARRAY, sub_type=V.STRING)
    for name, vt, dt in [("i8", V.INT8, np.int8), ("u16", V.UINT16, np.uint16), ("i32", V.INT32, np.int32),
                         ("u64", V.UINT64, np.uint64), ("f32", V.FLOAT32, np.float32), ("f64", V.FLOAT64, np.float64)]:
        w.add_key_value(f"t.{name}", [dt(v).item() for v in rng.integers(0, 100, 3000)], V.ARRAY, sub_type=vt)
    w.add_key_value("t.bools", [bool(v) for v in rng.integers(0, 2, 50)], V.ARRAY, sub_type=V.BOOL)
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.string", "plain")
    w.add_tensor("w", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_metadata_parts_are_the_gguf_packages_own(tmp_path):
    """maxjax's reader parses arrays of strings and numbers in one pass each (a tokenizer's 400k
    entries in well under a second instead of seconds): every field must come out exactly as the
    package's own reader gives it (parts, their dtypes and shapes, data indices, types, contents)."""
    from maxjax.graph.weights.gguf import _CheckedReader

    path = _metadata_gguf(tmp_path / "meta.gguf", np.random.default_rng(0))
    ours, theirs = _CheckedReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for name, a in theirs.fields.items():
        b = ours.fields[name]
        assert (b.offset, b.name, b.data, b.types) == (a.offset, a.name, a.data, a.types), name
        assert len(b.parts) == len(a.parts), name
        for x, y in zip(a.parts, b.parts):
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and np.array_equal(x, y), name
        ca, cb = a.contents(), b.contents()
        assert np.array_equal(ca, cb) if isinstance(ca, np.ndarray) else ca == cb, name
    assert ours.fields["t.strings"].contents()[:0] == [] and "naïve" in ours.fields["t.strings"].contents()
    assert GGUFWeights(path).w.data().to_numpy().tolist() == [1.0] * 32


def test_lying_length_inside_a_string_array_is_reported(tmp_path):
    path = _metadata_gguf(tmp_path / "meta.gguf", np.random.default_rng(0))
    raw = bytearray(open(path, "rb").read())
    first = raw.index(b"t.strings") + len(b"t.strings") + 4 + 4 + 8  # key, value type, item type, count
    raw[first : first + 8] = struct.pack("<Q", 1 << 40)  # the first string's length
    p = _write_bad(tmp_path, "str.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=rf"str.gguf: truncated or corrupted header: reading {1 << 40} x uint8 .* at offset {first + 8} goes past the end of the file"):
        GGUFWeights(p)
    raw = bytearray(open(path, "rb").read())
    count = raw.index(b"t.i32") + len(b"t.i32") + 4 + 4
    raw[count : count + 8] = struct.pack("<Q", 1 << 40)  # an int32 array's entry count
    p = _write_bad(tmp_path, "i32.gguf", bytes(raw))
    with pytest.raises(WeightsFileError, match=r"i32.gguf: truncated or corrupted header: reading \d+ x int32"):
        GGUFWeights(p)


def test_file_truncated_after_opening_raises_instead_of_crashing(tmp_path):
    path = write_gguf(tmp_path / "shrink.gguf", {"a": (np.ones(1024, np.float32), None), "b": (np.ones(1024, np.float32), None)})
    w = GGUFWeights(path)
    os.truncate(path, os.path.getsize(path) - 4096)
    with pytest.raises(WeightsFileError, match=r"shrink.gguf: the file shrank to \d+ bytes since it was opened"):
        w.b.data()


def test_nothing_is_read_until_data(tmp_path):
    path = write_gguf(tmp_path / "lazy.gguf", {"w": (np.zeros(64, np.float32), None)})
    w = GGUFWeights(path)
    offset = int(w.reader.tensors[0].data_offset)
    with open(path, "r+b") as f:  # change the tensor's bytes on disk after opening
        f.seek(offset)
        f.write(np.full(64, 5.0, np.float32).tobytes())
    np.testing.assert_array_equal(w.w.data().to_numpy(), np.full(64, 5.0, np.float32))
