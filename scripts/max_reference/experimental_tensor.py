"""MAX 26.7's eager ``max.experimental.tensor.Tensor`` on the CPU: default dtypes, each method and
operator on small seeded inputs (values and MAX's dtypes), the printed form, and error types.

Each eager MAX op compiles its kernels the first time (two to nine minutes each on this shared
machine), so the inputs are two [2, 3] tensors (float32 ``x``, int32 ``i``) and the ops whose
dtype or result MAX decides (integer division and mean, argmax, comparisons, ``arange`` and
``range_like`` defaults, indexing, ``__setitem__``); the other methods are checked against NumPy.

Keys: ``in.*`` (inputs), ``out.<case>`` (values), ``dtype.<case>`` (MAX's dtype name),
``shape.<case>``, ``default.<case>`` (dtype of a constructor's result), ``repr.<case>`` (text),
``err.<case>`` ("ExceptionType: message"). Text is stored as 0-d str arrays.
"""

from __future__ import annotations

import sys

import numpy as np


def _err(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type and message are what we record
        return f"{type(e).__name__}: {e}"
    return "no error"


def build() -> dict[str, np.ndarray]:
    from max.driver import CPU
    from max.dtype import DType
    from max.experimental import tensor as T
    from max.experimental.tensor import Tensor

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2, 3)).astype(np.float32)
    is_ = rng.integers(-9, 10, (2, 3)).astype(np.int32)
    is_[is_ == 0] = 3  # divisors
    out: dict[str, np.ndarray] = {"in.x": xs, "in.i": is_}
    x, i = Tensor(xs), Tensor(is_)

    # dtypes of constructors (no kernels)
    cases = {
        "float_list": lambda: Tensor([1.0, 2.0]),
        "int_list": lambda: Tensor([1, 2, 3]),
        "bool_list": lambda: Tensor([True, False]),
        "int_scalar": lambda: Tensor(3),
        "np_int64": lambda: Tensor(np.array([1, 2])),
        "np_float64": lambda: Tensor(np.array([1.0, 2.0])),
        "np_int32": lambda: Tensor(np.array([1, 2], dtype=np.int32)),
        "np_bool": lambda: Tensor(np.array([True])),
        "zeros": lambda: Tensor.zeros([2]),
        "full_int": lambda: Tensor.full([2], 3),
        "from_dim": lambda: Tensor.from_dim(5),
    }
    for k, f in cases.items():
        out[f"default.{k}"] = np.asarray(f().dtype.name)
    with T.default_dtype(DType.int32):
        out["default.ctx_int_list"] = np.asarray(Tensor([1, 2]).dtype.name)
        out["default.ctx_np_float64"] = np.asarray(Tensor(np.array([1.0])).dtype.name)
        out["default.ctx_ones"] = np.asarray(Tensor.ones([2]).dtype.name)
    out["item.int32"] = np.asarray(Tensor([7], dtype=DType.int32).item())
    out["cast_same_is_self"] = np.asarray(x.cast(DType.float32) is x)
    out["to_same_is_self"] = np.asarray(x.to(CPU()) is x)

    def setitem() -> Tensor:
        y = Tensor(np.zeros((2, 3), dtype=np.float32))
        y[0] = Tensor(np.ones(3, dtype=np.float32))
        return y

    ops = {
        "setitem": setitem,
        "intdiv": lambda: i / i,
        "arange": lambda: Tensor.arange(5),
        "arange_float": lambda: Tensor.arange(1, 2, 0.25),
        "eq": lambda: x == x,
        "full": lambda: Tensor.full([2], 3),
        "range_like": lambda: Tensor.range_like(i),
        "argmax": lambda: x.argmax(),
        "lt": lambda: x < 0.5,
        "getitem": lambda: x[1],
        "getitem2": lambda: x[:, 1:3],
        "mean_int": lambda: i.mean(),
        "floordiv": lambda: i // 2,
        "sum": lambda: x.sum(),
        "sum_none": lambda: x.sum(axis=None),
        "arange_floor": lambda: Tensor.arange(0, 0.3, 0.1),  # MAX warns, then gives the floor length
    }
    for k, f in ops.items():
        print(f"experimental_tensor: {k}", file=sys.stderr, flush=True)  # each new kernel takes minutes
        try:
            r = f()
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            out[f"err.op.{k}"] = np.asarray(f"{type(e).__name__}: {e}")
            continue
        out[f"out.{k}"] = r.to_numpy()
        out[f"dtype.{k}"] = np.asarray(r.dtype.name)
        out[f"shape.{k}"] = np.asarray([int(d) for d in r.shape], dtype=np.int64)

    for name, sections in (("split", [1, 2]), ("split_int", 2)):
        print(f"experimental_tensor: {name}", file=sys.stderr, flush=True)
        try:
            pieces = x.split(sections, axis=1)
        except Exception as e:  # noqa: BLE001
            out[f"err.op.{name}"] = np.asarray(f"{type(e).__name__}: {e}")
            continue
        for n, piece in enumerate(pieces):
            out[f"out.{name}.{n}"] = piece.to_numpy()

    out["repr.x"] = np.asarray(repr(x))
    out["repr.i"] = np.asarray(repr(i))
    out["repr.scalar"] = np.asarray(repr(Tensor(3.5)))
    out["repr.vec"] = np.asarray(repr(Tensor([True, False])))

    errs = {
        "conflict": lambda: Tensor(np.array([1, 2], dtype=np.int32), dtype=DType.float32),
        "ragged": lambda: Tensor([[1, 2], [3]]),
        "range": lambda: Tensor([300], dtype=DType.int8),
        "float_to_int": lambda: Tensor([1.5], dtype=DType.int32),
        "empty": lambda: Tensor(),
        "item_many": lambda: x.item(),
        "bool_many": lambda: bool(x),
        "reshape_bad": lambda: x.reshape([4]),
        "squeeze_bad": lambda: x.squeeze(0),
        "permute_bad": lambda: x.permute([0]),
        "transpose_1d": lambda: Tensor([1.0, 2.0]).T,
        "sum_badaxis": lambda: x.sum(5),
        "and_float": lambda: x & x,
        "invert_float": lambda: ~x,
        "add_int_float": lambda: x + i,
        "add_pyfloat_int": lambda: i + 1.5,
        "setitem_scalar": lambda: x.__setitem__(0, 1.0),
        "arange_int_nondivisible": lambda: Tensor.arange(0, 10, 3).to_numpy(),
    }
    for k, f in errs.items():
        out[f"err.{k}"] = np.asarray(_err(f))
    return out
