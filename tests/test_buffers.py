"""Mutable buffers in graphs (MAX's BufferType / BufferValue / ops.buffer_*): the caller's Buffer
holds the graph's update after execute, functional mode returns it, eager mode updates in place."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, Program
from maxjax.graph import BufferType, BufferValue, DeviceRef, Graph, TensorType, ops

CPU = DeviceRef.CPU()


def _counter_graph():
    """out = x * 2; cache[1] += x (a scatter into a buffer), then the buffer is read again."""

    def forward(x, cache):
        buf = cache.buffer
        ops.buffer_store(buf, ops.buffer_load(buf) + ops.unsqueeze(x, 0) * ops.constant(np.array([[0.0], [1.0], [0.0]], np.float32), DType.float32))
        return x * 2, ops.buffer_load(buf)[1]

    return Graph("counter", forward, input_types=[TensorType(DType.float32, [4], CPU), BufferType(DType.float32, [3, 4], CPU)])


def test_execute_updates_the_callers_buffer_each_time():
    g = _counter_graph()
    assert [str(t) for t in g.output_types] == [str(TensorType(DType.float32, [4], CPU))] * 2  # hidden output not declared
    model = InferenceSession().load(g)
    cache = Buffer.from_numpy(np.zeros((3, 4), np.float32))
    x = np.arange(4, dtype=np.float32)
    for step in (1, 2):
        old = cache._array
        doubled, row = (o.to_numpy() for o in model.execute(x, cache))
        np.testing.assert_array_equal(doubled, 2 * x)
        np.testing.assert_array_equal(row, step * x)  # the update is visible inside the graph
        want = np.zeros((3, 4), np.float32)
        want[1] = step * x
        np.testing.assert_array_equal(cache.to_numpy(), want)  # and in the caller's Buffer
        assert old.is_deleted()  # donated: no copy kept


def test_functional_mode_returns_the_buffers_after_the_outputs():
    g = _counter_graph()
    prog = Program(g)
    state = prog.prepare({})
    x = np.ones(4, np.float32)
    doubled, row, new_cache = jax.jit(prog.apply)(state, x, np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(np.asarray(new_cache)[1], x)
    np.testing.assert_array_equal(np.asarray(row), x)


def test_eager_buffer_and_refusals():
    b = BufferValue(np.zeros((2, 3), np.float32))
    ops.buffer_store(b, ops.buffer_load(b) + 1)
    np.testing.assert_array_equal(np.asarray(ops.buffer_load(b)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="does not match the buffer"):
        ops.buffer_store(b, np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="not a tensor value"):
        b.tensor
    with pytest.raises(TypeError, match="expected a BufferValue"):
        ops.buffer_load(np.zeros(3))
    assert TensorType(DType.float32, [2], CPU).as_buffer() == BufferType(DType.float32, [2], CPU)
    assert BufferType(DType.float32, [2], CPU).as_tensor() != BufferType(DType.float32, [2], CPU)
