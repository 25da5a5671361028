"""Orbax: save a module's state with its shardings, restore it onto the module's abstract state,
read it as a Weights source and load it straight into load_state_dict."""

import os
import subprocess
import sys
import textwrap

import gguf
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from maxjax import nn
from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.weights import (
    OrbaxWeights,
    Weights,
    WeightsFileError,
    WeightsFormat,
    load_weights,
    restore_state,
    save_state,
    weights_format,
)


class Net(nn.Module):
    def __init__(self, hidden=16, enc=None):
        super().__init__()
        self.up = nn.Linear(8, hidden, DType.float32, has_bias=True)
        self.down = nn.Linear(hidden, 8, DType.bfloat16)
        self.q = nn.Linear(64, 4, DType.float32, quantization_encoding=enc) if enc else None

    def __call__(self, x):
        return self.down(self.up(x).cast(DType.bfloat16))


def _values(net, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for fqn, w in net.raw_state_dict().items():
        shape = tuple(int(d) for d in w.shape)
        if w.quantization_encoding is not None:
            out[fqn] = gguf.quants.quantize(rng.standard_normal((shape[0], 64)).astype(np.float32), w.quantization_encoding.to_gguf())
        else:
            # a jax.Array: the core's to_jax_array cannot take bfloat16 NumPy arrays (reported)
            out[fqn] = jax.device_put(rng.standard_normal(shape).astype(w.dtype.to_numpy()))
    return out


def sharded_round_trip(directory):
    """Save a module whose weights are sharded over an 8-device mesh; restore onto another module's
    abstract state; check values and shardings. Needs 8 devices."""
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("x", "y"))  # Auto axes
    specs = {"up.weight": P("y", "x"), "up.bias": P("y"), "down.weight": P(None, "y")}

    def build():
        net = Net()
        for fqn, w in net.raw_state_dict().items():
            w.sharding = NamedSharding(mesh, specs[fqn])
        return net

    src = build()
    values = _values(src)
    src.load_state_dict(values)
    state = nn.state(src)
    assert state["up.weight"].sharding == NamedSharding(mesh, P("y", "x"))
    path = save_state(os.path.join(directory, "ckpt"), src)

    dst = build()
    restored = restore_state(path, dst)  # onto nn.abstract_state(dst): shapes, dtypes, shardings
    for fqn, arr in restored.items():
        assert arr.sharding == NamedSharding(mesh, specs[fqn]), fqn
        np.testing.assert_array_equal(np.asarray(arr), values[fqn])
    dst.load_state_dict(restored)
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(dst(x)), np.asarray(src(x)))
    return True


def test_sharded_save_and_restore_onto_the_abstract_state(tmp_path):
    if jax.device_count() >= 8:
        assert sharded_round_trip(str(tmp_path))
        return
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("t", {__file__!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        assert mod.sharded_round_trip({str(tmp_path)!r})
        """
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_orbax_weights_source_keeps_encodings_and_loads_into_a_module(tmp_path):
    src = Net(enc=QuantizationEncoding.Q4_0)
    values = _values(src, seed=1)
    src.load_state_dict(values)
    path = save_state(tmp_path / "q", src)
    assert weights_format([path]) is WeightsFormat.orbax
    weights = load_weights([path])
    assert isinstance(weights, OrbaxWeights) and isinstance(weights, Weights)
    assert [n for n, _ in weights.items()] == ["down.weight", "q.weight", "up.bias", "up.weight"]
    q = weights.q.weight.data()
    assert q.quantization_encoding is QuantizationEncoding.Q4_0
    assert q.dtype is DType.uint8 and q.shape == [4, 36] and q.original_shape == [4, 64]
    np.testing.assert_array_equal(q.to_numpy(), values["q.weight"])
    assert weights.down.weight.data().dtype is DType.bfloat16
    dst = Net(enc=QuantizationEncoding.Q4_0)
    dst.load_state_dict({n: v.data() for n, v in weights.items()})
    for fqn, arr in nn.state(dst).items():  # the quantized weight as a PackedArray of the same bytes
        np.testing.assert_array_equal(np.asarray(arr.packed_bytes() if fqn == "q.weight" else arr), values[fqn])
    every = weights.restore_all()
    assert set(every) == set(values) and every["q.weight"].quantization_encoding is QuantizationEncoding.Q4_0
    w = weights.up.bias.allocate(DType.float32, (16,))
    assert w.name == "up.bias" and list(weights.allocated_weights) == ["up.bias"]


def test_restore_refuses_a_target_that_does_not_match(tmp_path):
    src = Net()
    src.load_state_dict(_values(src))
    path = save_state(tmp_path / "c", src)
    with pytest.raises(ValueError, match=r"'up.weight': the target's shape is \(32, 8\), the checkpoint's \(16, 8\)"):
        restore_state(path, Net(hidden=32))
    with pytest.raises(ValueError, match=r"'extra' is not in the checkpoint"):
        restore_state(path, {"extra": jax.ShapeDtypeStruct((2,), np.float32)})
    with pytest.raises(ValueError, match="already exists"):
        save_state(path, src)
    save_state(path, src, overwrite=True)
    plain = restore_state(path)
    assert set(plain) == {"up.weight", "up.bias", "down.weight"}


def test_saving_a_module_with_unloaded_weights_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Weight 'up.weight' was not initialized"):
        save_state(tmp_path / "u", Net())
    assert not (tmp_path / "u").exists()


def test_not_an_orbax_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsFileError, match="empty: not an orbax checkpoint"):
        OrbaxWeights(tmp_path / "empty")
    with pytest.raises(WeightsFileError, match="nothere: no such checkpoint directory"):
        OrbaxWeights(tmp_path / "nothere")
