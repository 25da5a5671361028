"""SafetensorWeights on the real MiniLM file and on files the tests write: every dtype, sharded
checkpoints, laziness, one handle per file, and bad input."""

import json
import os
import struct
import tempfile

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from safetensors.numpy import load_file, save_file

from maxjax._bundled import minilm_safetensors_path
from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph.type import DeviceRef
from maxjax.graph.weights import (
    SafetensorWeights,
    WeightData,
    Weights,
    WeightsFileError,
    WeightsFormat,
    load_weights,
    weights_format,
)

# Every dtype the safetensors format and maxjax both have.
ALL_DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e8m0fnu,
]  # fmt: skip


@pytest.fixture(scope="module")
def minilm():
    return SafetensorWeights([minilm_safetensors_path()])


def _write(path, tensors, metadata=None):
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def _rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- the real file -------------------------------------------------------------------------------


def test_minilm_every_tensor_equals_the_safetensors_package(minilm):
    reference = load_file(str(minilm_safetensors_path()))
    names = [n for n, _ in minilm.items()]
    assert sorted(names) == sorted(reference) and len(names) == 104
    for name, view in minilm.items():
        wd = view.data()
        ref = reference[name]
        assert wd.name == name
        assert wd.shape == list(ref.shape)
        assert wd.dtype == DType.from_numpy(ref.dtype)
        np.testing.assert_array_equal(wd.to_numpy(), ref)
    assert minilm.metadata == {"format": "pt"}


def test_minilm_data_is_a_buffer_and_int64_is_not_narrowed(minilm):
    emb = minilm.embeddings.word_embeddings.weight.data()
    assert isinstance(emb.data, Buffer) and emb.shape == [30522, 384] and emb.dtype is DType.float32
    ids = minilm.embeddings.position_ids.data()
    assert ids.dtype is DType.int64
    if not jax.config.jax_enable_x64:  # JAX would narrow it: the data stays a NumPy int64 array
        assert isinstance(ids.data, np.ndarray) and ids.data.dtype == np.int64
    np.testing.assert_array_equal(ids.to_numpy(), np.arange(512)[None])


def test_minilm_allocate_records_the_data_and_gives_a_weight(minilm):
    view = SafetensorWeights([minilm_safetensors_path()])
    w = view.encoder.layer[0].attention.self.query.weight.allocate(DType.float32, (384, 384))
    assert w.name == "encoder.layer.0.attention.self.query.weight"
    assert w.dtype is DType.float32 and w.shape == [384, 384] and w.align == 1
    assert list(view.allocated_weights) == [w.name]
    assert view.encoder.allocated_weights is view.allocated_weights  # one dict for every view
    np.testing.assert_array_equal(
        np.asarray(view.allocated_weights[w.name]), minilm.encoder.layer[0].attention.self.query.weight.data().to_numpy()
    )


def test_allocate_refuses_a_quantization_encoding(minilm):
    from maxjax.graph.quantization import QuantizationEncoding

    with pytest.raises(ValueError, match="not GGUF-quantized"):
        minilm.pooler.dense.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_0)


# -- every dtype: save then load -----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(ALL_DTYPES),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    data=st.data(),
)
def test_save_then_load_round_trips_every_dtype(dtype, shape, data):
    dtype = np.dtype(dtype)
    raw = data.draw(hnp.arrays(np.uint8, (int(np.prod(shape)) * dtype.itemsize,)))
    if dtype == np.bool_:
        raw = raw % 2
    arr = raw.view(dtype).reshape(shape)
    with tempfile.TemporaryDirectory() as d:
        path = _write(os.path.join(d, "x.safetensors"), {"t": arr, "pad": np.zeros(3, np.uint8)})
        w = SafetensorWeights([path])
        wd = w.t.data()
        assert wd.dtype == DType.from_numpy(dtype)
        assert tuple(int(x) for x in wd.shape) == arr.shape
        got = wd.to_numpy()
        assert got.dtype == dtype
        assert got.tobytes() == arr.tobytes()  # bit for bit (NaNs of the float kinds included)
        for view_name, zero in (("copy", False), ("zero-copy", True)):
            again = SafetensorWeights([path], zero_copy=zero).t.data().to_numpy()
            assert again.tobytes() == arr.tobytes(), view_name
        w.close()


def test_complex_tensors_open_but_do_not_load(tmp_path):
    path = _write(tmp_path / "c.safetensors", {"c": np.ones(2, np.complex64), "f": np.ones(2, np.float32)})
    w = SafetensorWeights(path)
    assert w.f.data().dtype is DType.float32
    with pytest.raises(WeightsFileError, match=r"c\.safetensors: tensor 'c' has dtype C64"):
        w.c.data()


def test_allocate_as_bytes(tmp_path):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = SafetensorWeights(_write(tmp_path / "b.safetensors", {"w": arr, "s": np.array(2.5, np.float32)}))
    wt = w.w.allocate_as_bytes()
    assert wt.dtype is DType.uint8 and wt.shape == [2, 12]
    assert np.asarray(w.allocated_weights["w"]).tobytes() == arr.tobytes()
    assert w.s.allocate_as_bytes().shape == [4]
    with pytest.raises(ValueError, match="float32, not DType.int32"):
        w.w.allocate_as_bytes(DType.int32)


# -- many files, sharded checkpoints -------------------------------------------------------------


def _sharded(tmp_path):
    a = {"model.a.weight": np.full((2, 2), 1, np.float32), "model.b": np.arange(3, dtype=np.int32)}
    b = {"model.c.weight": np.full((4,), 3, np.float16)}
    _write(tmp_path / "model-00001-of-00002.safetensors", a, {"format": "pt"})
    _write(tmp_path / "model-00002-of-00002.safetensors", b, {"format": "pt"})
    index = {
        "metadata": {"total_size": 30},
        "weight_map": {**{k: "model-00001-of-00002.safetensors" for k in a}, **{k: "model-00002-of-00002.safetensors" for k in b}},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return a, b


def test_sharded_checkpoint_by_index_directory_or_files(tmp_path):
    a, b = _sharded(tmp_path)
    shards = sorted(str(p) for p in tmp_path.glob("*.safetensors"))
    for source in ([tmp_path / "model.safetensors.index.json"], [tmp_path], shards):
        w = load_weights(source)
        assert isinstance(w, SafetensorWeights) and isinstance(w, Weights)
        assert [n for n, _ in w.items()] == ["model.a.weight", "model.b", "model.c.weight"]
        for name, arr in {**a, **b}.items():
            np.testing.assert_array_equal(w[name].data().to_numpy(), arr)
    meta = SafetensorWeights([tmp_path / "model.safetensors.index.json"]).metadata
    assert meta == {"total_size": 30, "format": "pt"}


def test_index_that_disagrees_with_its_shards(tmp_path):
    _sharded(tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.b"] = "model-00002-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightsFileError, match="puts tensor 'model.b' here"):
        SafetensorWeights([index_path])
    index["weight_map"]["model.b"] = "model-00009-of-00009.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightsFileError, match="index.json: names shard 'model-00009-of-00009.safetensors'"):
        SafetensorWeights([index_path])


def _rewrite_index(directory, **weight_map):
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"].update(weight_map)
    path.write_text(json.dumps(index))
    return path


def test_index_cannot_name_a_file_outside_its_directory(tmp_path):
    outside = tmp_path / "outside.safetensors"
    save_file({"model.a.weight": np.full((2, 2), 66, np.float32), "model.b": np.zeros(3, np.int32)}, str(outside))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _sharded(ckpt)
    os.symlink(outside, ckpt / "link.safetensors")
    for shard, why in [
        ("../outside.safetensors", r"the shard path '\.\./outside\.safetensors', which leads out of .*ckpt$"),
        (str(outside), r"the absolute shard path '.*outside\.safetensors'; shards are named relative to the index$"),
        ("link.safetensors", r"the shard path 'link\.safetensors', a link to .*outside\.safetensors, outside .*ckpt$"),
    ]:
        index = _rewrite_index(ckpt, **{"model.a.weight": shard, "model.b": shard})
        with pytest.raises(WeightsFileError, match=rf"^{index}: weight_map gives tensor 'model.a.weight' {why}"):
            SafetensorWeights([index])
        with pytest.raises(WeightsFileError, match="weight_map gives tensor 'model.a.weight'"):
            load_weights([ckpt])


def test_index_and_shards_linked_into_one_blob_directory_load(tmp_path):
    """The Hugging Face cache's layout: snapshots/<rev>/* are links into blobs/."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    a, b = _sharded(blobs)
    for f in blobs.iterdir():
        os.symlink(os.path.relpath(f, snap), snap / f.name)
    w = SafetensorWeights([snap / "model.safetensors.index.json"])
    for name, arr in {**a, **b}.items():
        np.testing.assert_array_equal(w[name].data().to_numpy(), arr)


@pytest.mark.parametrize("value", [5, None, 1.5, True, [], {}, ""])
def test_index_value_that_is_not_a_file_name(tmp_path, value):
    _sharded(tmp_path)
    index = _rewrite_index(tmp_path, **{"model.b": value})
    with pytest.raises(WeightsFileError) as info:
        SafetensorWeights([index])
    assert str(info.value) == f"{index}: weight_map gives tensor 'model.b' the shard {value!r}, which is not a file name"


def test_a_tensor_in_two_files_is_an_error(tmp_path):
    p1 = _write(tmp_path / "a.safetensors", {"x": np.zeros(2, np.float32)})
    p2 = _write(tmp_path / "b.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(WeightsFileError, match=r"b\.safetensors: tensor 'x' is also in .*a\.safetensors"):
        SafetensorWeights([p1, p2])


# -- laziness, memory maps -----------------------------------------------------------------------


def test_nothing_is_read_until_data(tmp_path):
    path = _write(tmp_path / "lazy.safetensors", {"w": np.zeros((4, 4), np.float32)})
    w = SafetensorWeights([path])
    # Change the tensor's bytes on disk after opening: data() must see the new bytes.
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - 64)
        f.write(np.full(16, 7.0, np.float32).tobytes())
    np.testing.assert_array_equal(w.w.data().to_numpy(), np.full((4, 4), 7.0, np.float32))


def test_opening_a_huge_checkpoint_reads_only_its_header(tmp_path):
    nbytes = 2 << 30  # a 2 GiB tensor in a sparse file
    header = json.dumps({"big": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    before = _rss_kb()
    w = SafetensorWeights([path])
    assert w.big.exists() and [n for n, _ in w.items()] == ["big"]
    assert _rss_kb() - before < 50_000  # far less than the 2 GiB of data
    w.close()


def test_one_map_and_at_most_one_descriptor_per_file(tmp_path):
    path = os.path.realpath(_write(tmp_path / "one.safetensors", {f"t{i}": np.full(8, i, np.float32) for i in range(5)}))
    w = SafetensorWeights([path])
    for name, view in w.items():
        view.data()
        view.allocate()
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if line.rstrip().endswith(path))
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            pass
    assert maps == 1 and fds <= 1
    w.close()


def test_a_file_truncated_after_opening_raises_instead_of_crashing(tmp_path):
    path = _write(tmp_path / "t.safetensors", {"a": np.ones(1024, np.float32), "b": np.ones(1024, np.float32)})
    w = SafetensorWeights([path])
    os.truncate(path, os.path.getsize(path) - 4096)
    with pytest.raises(WeightsFileError, match=r"t.safetensors: the file shrank to \d+ bytes since it was opened"):
        w.b.data()
    w.close()
    with pytest.raises(WeightsFileError, match="the weights were closed"):
        w.a.data()


def test_zero_copy_arrays_alias_the_file_map_and_copies_do_not(tmp_path):
    arr = np.arange(64, dtype=np.float32)
    path = str(tmp_path / "z.safetensors")
    for pad in range(64):  # metadata length that puts the data 64-byte aligned (JAX adopts only those)
        _write(path, {"w": arr}, {"pad": "x" * pad})
        with open(path, "rb") as f:
            if (8 + struct.unpack("<Q", f.read(8))[0]) % 64 == 0:
                break
    aliased = SafetensorWeights([path], zero_copy=True).w.data()
    copied = SafetensorWeights([path]).w.data()
    np.testing.assert_array_equal(aliased.to_numpy(), arr)
    with open(path, "r+b") as f:  # rewrite the tensor's bytes in place (same size: no SIGBUS)
        f.seek(os.path.getsize(path) - arr.nbytes)
        f.write((arr + 100).tobytes())
    np.testing.assert_array_equal(aliased.to_numpy(), arr + 100)  # the array is the file's memory
    np.testing.assert_array_equal(copied.to_numpy(), arr)  # the default mode copied the bytes


# -- load_weights / weights_format ----------------------------------------------------------------


def test_weights_format_and_load_weights_errors(tmp_path):
    st_path = _write(tmp_path / "a.safetensors", {"x": np.zeros(2, np.float32)})
    assert weights_format([st_path]) is WeightsFormat.safetensors
    with pytest.raises(ValueError, match="at least one path"):
        weights_format([])
    with pytest.raises(ValueError, match="missing.safetensors: no such file"):
        load_weights([tmp_path / "missing.safetensors"])
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="different formats"):
        weights_format([st_path, tmp_path / "m.gguf"])
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04rest-of-a-zip")
    with pytest.raises(ValueError, match="pytorch_model.bin: looks like a PyTorch checkpoint"):
        load_weights([tmp_path / "pytorch_model.bin"])
    (tmp_path / "junk.dat").write_bytes(b"hello world")
    with pytest.raises(ValueError, match="junk.dat: unknown weights format"):
        load_weights([tmp_path / "junk.dat"])


def test_format_from_contents_when_the_suffix_says_nothing(tmp_path):
    path = _write(tmp_path / "weights.dat", {"x": np.arange(3, dtype=np.float32)})
    assert weights_format([path]) is WeightsFormat.safetensors
    np.testing.assert_array_equal(load_weights([path]).x.data().to_numpy(), np.arange(3, dtype=np.float32))


# -- bad input ------------------------------------------------------------------------------------


def _good_bytes():
    return safetensors.numpy.save({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.int16)})


def _header(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), n


def _with_header(raw, header):
    n = struct.unpack("<Q", raw[:8])[0]
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body + raw[8 + n :]


@pytest.mark.parametrize(
    "case,expected",
    [
        ("truncated", r"tensor 'b' ends at byte 32 of the data section, but the file holds only 28 bytes .*truncated"),
        ("header_truncated", r"header length field says \d+ bytes but only \d+ bytes follow it"),
        ("empty", r"fewer than the 8-byte header length"),
        ("bad_json", r"not a valid safetensors file"),
        ("lying_shape", r"tensor 'a' \(F32 \[2, 4\]\) needs 32 bytes but its data_offsets \[0, 24\] span 24"),
        ("lying_offsets", r"tensor 'b' ends at byte 40 of the data section, but the file holds only 32"),
    ],
)
def test_bad_files_raise_naming_the_file_and_the_defect(tmp_path, case, expected):
    raw = _good_bytes()
    header, n = _header(raw)
    if case == "truncated":
        data = raw[:-4]
    elif case == "header_truncated":
        data = raw[:20]
    elif case == "empty":
        data = b""
    elif case == "bad_json":
        data = raw[:8] + b"{" * n + raw[8 + n :]
    elif case == "lying_shape":
        header["a"]["shape"] = [2, 4]
        data = _with_header(raw, header)
    else:
        header["b"]["data_offsets"] = [32, 40]
        data = _with_header(raw, header)
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(data)
    with pytest.raises(WeightsFileError, match=expected) as info:
        SafetensorWeights([path])
    assert str(info.value).startswith(str(path))


def test_bool_bytes_other_than_0_and_1_are_refused(tmp_path):
    raw = bytearray(safetensors.numpy.save({"m": np.array([True, False, True])}))
    raw[-2] = 7
    path = tmp_path / "bool.safetensors"
    path.write_bytes(bytes(raw))
    with pytest.raises(WeightsFileError, match=r"bool tensor 'm' holds byte 7 at offset \d+"):
        SafetensorWeights([path]).m.data()


def test_device_argument_reaches_the_weight(minilm):
    w = minilm.pooler.dense.bias.allocate(device=DeviceRef.CPU())
    assert w.device == DeviceRef.CPU()
    assert isinstance(minilm.pooler.dense.bias.data(), WeightData)
