"""GGUF blocks converted to the run-time layouts on the host (``maxjax/backend/kernels/layouts.cc``)
must give the bytes of the layouts' own jnp definitions, bit for bit, and a model loaded through
them must run exactly as one loaded through XLA's conversion."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest

from maxjax.backend import kernels, policy_for
from maxjax.backend.kernels import layouts
from maxjax.engine.placement import host_layout, place_layers
from maxjax.graph.quantization import as_encoding, to_layout
from maxjax.graph.weights._host import MappedFile
from maxjax.graph.weights.lazy import LazyTensor, bytes_read

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"maxjax's CPU kernels do not build here: {kernels.unavailable_reason()}")


#: where a K-quant block keeps its float16 fields (d, and dmin for Q4_K): byte offsets
_K_HALVES = {"Q4_K": (0, 2), "Q6_K": (208,)}


def _blocks(encoding: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Real blocks (uint8 [rows, row_bytes]): float rows of varied scales quantized by the gguf
    package; for the K-quants, which it cannot quantize, every bit drawn at random but for finite
    float16 scales (any bits make a valid K-quant block)."""
    rng = np.random.default_rng(seed)
    if encoding in _K_HALVES:
        size = {"Q4_K": 144, "Q6_K": 210}[encoding]
        out = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
        for at in _K_HALVES[encoding]:
            out[..., at : at + 2] = rng.uniform(-0.1, 0.1, (rows, cols // 256)).astype("<f2")[..., None].view(np.uint8)
        out[0, 0, _K_HALVES[encoding][0] : _K_HALVES[encoding][0] + 2] = 0  # a zero scale
        return out.reshape(rows, -1)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 3.0, (rows, 1)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block (scale 0)
    return gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, encoding))


def _leaves(q) -> dict:
    return {k: None if getattr(q, k) is None else np.asarray(getattr(q, k)) for k in ("values", "scale", "offset")}


def _assert_identical(got: dict, want: dict, what: str) -> None:
    for k in ("values", "scale", "offset"):
        a, b = got[k], want[k]
        assert (a is None) == (b is None), (what, k)
        if a is not None:
            assert (a.dtype, a.shape) == (b.dtype, b.shape), (what, k, a.dtype, a.shape, b.dtype, b.shape)
            assert a.tobytes() == b.tobytes(), (what, k)


@pytest.mark.parametrize("layout,encoding", sorted(layouts.HOST_LAYOUTS))
def test_bit_identical_to_the_layouts_definitions(layout, encoding):
    """Two layers of 6 rows (3 blocks a row, 2 for the K-quants; 32 rows, two tiles, for
    ``tiles``), stored in order and permuted, against ``to_layout`` (the jnp definition) of each
    layer."""
    enc = as_encoding(encoding)
    rows, cols = (6, 512) if encoding in _K_HALVES else (6, 96)  # 2 K-quant blocks, 3 others a row
    rows = 32 if layout == "tiles" else rows
    stored = [_blocks(encoding, rows, cols, seed) for seed in (0, 1)]
    orders = [None, np.array([3, 1, 0, 5, 2, 4]) if rows == 6 else np.random.default_rng(2).permutation(rows)]
    spec = layouts.layout_shapes(layout, encoding, rows, cols)
    out = {k: None if v is None else np.zeros((2, *v[0]), v[1]) for k, v in spec.items()}
    layouts.convert_layers(layout, encoding, list(zip(stored, orders)), out["values"], out["scale"], out["offset"], threads=2)
    for i, (blocks, order) in enumerate(zip(stored, orders)):
        want = _leaves(to_layout(layout, enc, jax.numpy.asarray(blocks if order is None else blocks[order])))
        _assert_identical({k: None if a is None else a[i] for k, a in out.items()}, want, f"{encoding} {layout} layer {i}")


def test_many_tasks_over_threads_match_one():
    """A weight split into many row tasks (rows well past one task's share) over 2 threads gives
    the bytes of one thread."""
    blocks = _blocks("Q4_1", 4096, 512, 3)  # 4096 rows x 320 bytes: several 1 MiB tasks
    results = []
    for threads in (1, 2):
        spec = layouts.layout_shapes("nibbles", "Q4_1", 4096, 512)
        out = {k: np.zeros((1, *v[0]), v[1]) for k, v in spec.items()}
        layouts.convert_layers("nibbles", "Q4_1", [(blocks, None)], out["values"], out["scale"], out["offset"], threads=threads)
        results.append(out)
    _assert_identical({k: a[0] for k, a in results[0].items()}, {k: a[0] for k, a in results[1].items()}, "threads")
    _assert_identical({k: a[0] for k, a in results[0].items()}, _leaves(to_layout("nibbles", as_encoding("Q4_1"), jax.numpy.asarray(blocks))), "jnp")


def test_bad_inputs_raise_naming_the_layer():
    blocks = _blocks("Q4_0", 4, 64, 0)
    spec = layouts.layout_shapes("unpacked", "Q4_0", 4, 64)
    out = {k: None if v is None else np.zeros((2, *v[0]), v[1]) for k, v in spec.items()}
    with pytest.raises(ValueError, match=r"layer 1 has 3 rows, expected 4"):
        layouts.convert_layers("unpacked", "Q4_0", [(blocks, None), (blocks[:3], None)], out["values"], out["scale"], None)
    with pytest.raises(ValueError, match=r"layer 0: row indices must be 4 rows of \[0, 4\)"):
        layouts.convert_layers("unpacked", "Q4_0", [(blocks, np.array([0, 1, 2, 4])), (blocks, None)], out["values"], out["scale"], None)
    with pytest.raises(ValueError, match=r"layer 0 blocks are uint8\[4, 40\], expected C-contiguous uint8 \[rows, 36\]"):
        layouts.convert_layers("unpacked", "Q4_0", [(np.zeros((4, 40), np.uint8), None)] * 2, out["values"], out["scale"], None)
    with pytest.raises(ValueError, match=r"scale is float16\[2, 4, 2\], expected a writable C-contiguous float32\[2, 4, 2\]"):
        layouts.convert_layers("unpacked", "Q4_0", [(blocks, None)] * 2, out["values"], out["scale"].astype(np.float16), None)
    with pytest.raises(ValueError, match=r"offset must be None for Q4_0 unpacked"):
        layouts.convert_layers("unpacked", "Q4_0", [(blocks, None)] * 2, out["values"], out["scale"], out["scale"])
    with pytest.raises(ValueError, match=r"no host conversion of Q6_K to the 'nibbles' layout"):
        layouts.layout_shapes("nibbles", "Q6_K", 4, 256)
    with pytest.raises(ValueError, match=r"Q4_K \[4, 96\] cannot take the 'unpacked' layout \(256-value blocks"):
        layouts.layout_shapes("unpacked", "Q4_K", 4, 96)


def test_placed_from_a_mapped_file_as_by_xla(tmp_path):
    """``place_layers`` of a stack read lazily out of a mapped GGUF-like file: the host conversion
    gives the leaves XLA's conversion gives, adopted by JAX on the CPU (no copy), and it counts
    the bytes it read; an odd number of rows takes ``unpacked`` as ``to_layout`` does."""
    layers = [_blocks("Q4_0", 8, 64, s) for s in range(3)]
    path = tmp_path / "blocks.bin"
    path.write_bytes(b"".join(b.tobytes() for b in layers))
    mapped = MappedFile.open(str(path))
    nbytes = layers[0].nbytes

    def lazy():
        return [LazyTensor(mapped, i * nbytes, np.uint8, layers[0].shape) for i in range(3)]

    before = bytes_read(str(path))
    got = place_layers(lazy(), None, stacked=True, encoding="Q4_0", quantized_layout="nibbles", host_conversion=True)
    assert bytes_read(str(path)) - before == 3 * nbytes
    want = place_layers(lazy(), None, stacked=True, encoding="Q4_0", quantized_layout="nibbles")
    assert type(got) is type(want) and got.layout == "nibbles"
    _assert_identical(_leaves(got), _leaves(want), "stack")
    host = host_layout(lazy(), "Q4_0", "nibbles", stacked=True)
    assert not host.values.flags.writeable and host.values.ctypes.data % 64 == 0
    device = jax.device_put(host.values)
    assert device.unsafe_buffer_pointer() == host.values.ctypes.data  # adopted, not copied

    odd = [LazyTensor(mapped, 0, np.uint8, layers[0].shape).take_rows(np.arange(7))]
    got = place_layers(odd, None, stacked=False, encoding="Q4_0", quantized_layout="nibbles", host_conversion=True)
    assert got.layout == "unpacked"
    _assert_identical(_leaves(got), _leaves(to_layout("unpacked", as_encoding("Q4_0"), jax.numpy.asarray(layers[0][:7]))), "odd rows")
    # Q8_0 and Q6_K under the nibbles policy take unpacked, as to_layout gives them; Q5_K is left to XLA
    for enc, blocks in (("Q8_0", _blocks("Q8_0", 8, 64, 5)), ("Q6_K", _blocks("Q6_K", 8, 256, 6))):
        got = host_layout([blocks], enc, "nibbles", stacked=False)
        assert got.layout == "unpacked"
        _assert_identical(_leaves(got), _leaves(to_layout("nibbles", as_encoding(enc), jax.numpy.asarray(blocks))), enc)
    assert host_layout([np.zeros((8, 176), np.uint8)], "Q5_K", "nibbles", stacked=False) is None  # one 256-value block a row


def test_a_model_loads_identically_either_way(tmp_path):
    """A tiny Llama-shaped Q4_0 GGUF: loaded with the host conversion (the CPU policy's default)
    and with XLA's, every placed leaf is bit-identical and the logits equal."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import make_synthetic_gguf as synth

    from maxjax.models import load_model

    path = synth.write_gguf("tiny", "q4_0", tmp_path / "tiny-q4_0.gguf", verbose=False)
    cpu = policy_for("cpu")
    assert cpu.host_layout_conversion
    host = load_model(path, quantized_layout="nibbles")  # not the policy's mapped Q4_0: converted
    xla = load_model(path, quantized_layout="nibbles", policy=dataclasses.replace(cpu, host_layout_conversion=False))
    a, b = jax.tree.leaves(host.state), jax.tree.leaves(xla.state)
    assert len(a) == len(b) and any(np.asarray(x).dtype == np.uint8 for x in a)
    for x, y in zip(a, b):
        assert (x.dtype, x.shape) == (y.dtype, y.shape) and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    ids = np.asarray([host.encode_prompt("Hello there")], np.int32)
    outs = [np.asarray(lm.prefill(ids, [ids.shape[1]], *lm.new_cache(1, 16))[1]) for lm in (host, xla)]
    np.testing.assert_array_equal(outs[0], outs[1])
