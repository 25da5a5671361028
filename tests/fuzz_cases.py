"""Corrupt inputs for the loader fuzz harness (``tests/test_fuzz_loaders.py``) and the runner that
tries them.

:func:`build_cases` writes every input under a directory (deterministically, from a seed) and
returns the cases as JSON-able dicts:

- ``safetensors``: truncated files, lying header-length fields, header JSON edits (types, shapes,
  offsets, dtypes, ``__metadata__``), bit flips in the header and in the data;
- ``index``: sharded ``*.safetensors.index.json`` files with bad JSON, bad types, paths that leave
  the index's directory (``..``, absolute, symlinks), missing or disagreeing shards;
- ``gguf``: a small GGUF written with ``gguf.GGUFWriter``, then truncated, its header counts and
  tensor infos (name length, rank, dims, type, data offset) rewritten, bits flipped;
- ``orbax``: a checkpoint written by ``save_state``, then each of its files deleted, emptied,
  truncated or bit-flipped, its JSON files replaced, its custom metadata edited;
- ``load_state_dict``: argument sets (wrong shapes, dtypes, value and key types, symbolic dims,
  missing and unexpected keys, alignment);
- ``llama`` (:func:`build_model_cases`): a small synthetic llama GGUF (``tests/llama_files.py``)
  with one metadata key retyped, out of range, deleted or changed, or one tensor missing, extra,
  reshaped, retyped (rewritten, or in the header only) or non-finite; a Hugging Face directory
  with its ``config.json`` or tensors changed the same ways; loaded with ``load_model`` and, when
  they load, generating two tokens;
- ``cli``: ``maxjax generate`` argument sets (bad values of every flag, bad prompts, bad models),
  run through ``maxjax.cli.main`` in the runner (exit status, stdout and stderr recorded).

``python tests/fuzz_cases.py CASES.json`` runs the cases of that file and writes, for each, a line
``{"start": id}`` and then a line with the outcome (to the stdout it was started with; anything the
libraries print goes to stderr), so the parent can tell which case hung or killed the process.

Each outcome says whether the call returned or raised (the exception's type and message) and, for a
call that returned, whether the values agree with the oracle: the ``safetensors`` package reading
the same file, the ``gguf`` package reading the same file, the state that was saved (orbax), the
arrays written into the shards (index), or the arguments given (``load_state_dict``; a call that
raises must leave the module as it was).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

# -- helpers -------------------------------------------------------------------------------------


def digest(arr: Any) -> str:
    """dtype, shape and a hash of the bytes of an array."""
    a = np.asarray(arr)
    return f"{a.dtype.name}{list(a.shape)}:{hashlib.sha256(a.tobytes()).hexdigest()[:24]}"


def raw_digest(arr: Any) -> str:
    """A hash of the bytes only (GGUF: packed blocks and plain arrays compared as bytes)."""
    return hashlib.sha256(np.asarray(arr).tobytes()).hexdigest()[:24]


def _case(cases: list[dict], family: str, cid: str, op: str, path: str, expect: str, names: list[str], **extra: Any) -> None:
    cases.append({"id": f"{family}/{cid}", "family": family, "op": op, "path": path, "expect": expect, "names": names, **extra})


# -- safetensors -----------------------------------------------------------------------------------


def _st_pristine() -> dict[str, np.ndarray]:
    return {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1, -2, 3, 2**31 - 1], np.int32),
        "c": np.array([[0.5], [1.5], [-2.0]], np.float16),
        "m": np.array([True, False, True]),
        "e": np.zeros((0, 4), np.uint8),
    }


def _st_split(raw: bytes) -> tuple[dict, int]:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), n


def _st_with_header(raw: bytes, header_text: bytes) -> bytes:
    n = struct.unpack("<Q", raw[:8])[0]
    body = header_text + b" " * (-len(header_text) % 8)
    return struct.pack("<Q", len(body)) + body + raw[8 + n :]


def _st_header_edits(header: dict) -> list[tuple[str, Any]]:
    """(name, new header: a dict, or bytes for text that is not a JSON object)."""

    def edit(fn: Callable[[dict], None]) -> dict:
        h = json.loads(json.dumps(header))
        fn(h)
        return h

    def setter(name: str, key: str, value: Any) -> Callable[[dict], None]:
        return lambda h: h[name].__setitem__(key, value)

    def deleter(name: str, key: str) -> Callable[[dict], None]:
        return lambda h: h[name].pop(key)

    out: list[tuple[str, Any]] = [
        ("text-brace", b"{" * 16),
        ("text-empty", b""),
        ("text-list", b"[]"),
        ("text-number", b"5"),
        ("text-null", b"null"),
        ("text-string", b'"abc"'),
        ("text-nonutf8", b'{"a\xff": 1}'),
        ("text-dup-key", json.dumps(header).replace('"a"', '"b"', 1).encode()),
        ("text-nul", b"\x00" * 16),
    ]
    for name in ("a", "b", "m"):
        for v in (5, [], None, "x"):
            out.append((f"{name}-entry-{type(v).__name__}", edit(lambda h, name=name, v=v: h.__setitem__(name, v))))
        for key in ("dtype", "shape", "data_offsets"):
            out.append((f"{name}-no-{key}", edit(deleter(name, key))))
    for dt in ("F64", "BF16", "I32", "U32", "F16", "X9", "", 5, None, "F8_E4M3", "C64", "BOOL"):
        out.append((f"a-dtype-{dt}", edit(setter("a", "dtype", dt))))
    for shape in ([3, 2], [6], [2, 4], [-1, 6], [-2, -3], [2.5, 2], ["2", 3], [], [2**62, 2**62], [0, 3], None, "23", [2, 3, 1]):
        out.append((f"a-shape-{shape}", edit(setter("a", "shape", shape))))
    a0, a1 = header["a"]["data_offsets"]
    total = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    for offs in ([a1, a0], [-8, 16], [0.0, 24.0], ["0", "24"], [0], [0, 24, 48], [0, 2**64], [4, 28], [total, total + 24], None, "0-24"):
        out.append((f"a-offsets-{offs}", edit(setter("a", "data_offsets", offs))))
    for meta in (5, [], {"k": 5}, {"k": None}, {"k": ["x"]}, "s"):
        out.append((f"meta-{meta}", edit(lambda h, meta=meta: h.__setitem__("__metadata__", meta))))
    out.append(("extra-field", edit(lambda h: h["a"].__setitem__("foo", 1))))
    out.append(("empty-name", edit(lambda h: h.__setitem__("", h.pop("a")))))
    out.append(("unicode-name", edit(lambda h: h.__setitem__("\u00e9\u4e2d", h.pop("a")))))
    out.append(("swap-offsets-a-b", edit(lambda h: (lambda x, y: (h["a"].__setitem__("data_offsets", y), h["b"].__setitem__("data_offsets", x)))(h["a"]["data_offsets"], h["b"]["data_offsets"]))))
    return out


def build_safetensors(root: Path, rng: np.random.Generator, cases: list[dict]) -> None:
    import safetensors.numpy

    d = root / "st"
    d.mkdir()
    raw = safetensors.numpy.save(_st_pristine(), metadata={"format": "pt"})
    header, n = _st_split(raw)
    total = len(raw)

    def add(cid: str, data: bytes, expect: str = "either", suffix: str = ".safetensors", op: str = "st") -> None:
        p = d / f"{cid}{suffix}"
        p.write_bytes(data)
        _case(cases, "safetensors", cid, op, str(p), expect, [str(p)])

    add("pristine", raw, "ok")
    add("pristine-nosuffix", raw, "ok", suffix=".bin", op="load_weights")
    for cut in sorted({0, 1, 7, 8, 9, 8 + n - 1, 8 + n, 8 + n + 1, total - 1, total - 4, *rng.integers(9, total, 6).tolist()}):
        add(f"trunc-{cut}", raw[:cut], "error" if cut < total else "ok")
    for length in (0, 1, n - 1, n + 1, n + 8, total, 2**32, 2**63, 2**64 - 1, int(rng.integers(0, 2**16))):
        add(f"hlen-{length}", struct.pack("<Q", length) + raw[8:], "error" if length != n else "ok")
    for cid, new in _st_header_edits(header):
        text = new if isinstance(new, bytes) else json.dumps(new).encode()
        add(f"hdr-{cid}", _st_with_header(raw, text))
    for i, pos in enumerate(rng.integers(0, 8 + n, 14).tolist()):
        b = bytearray(raw)
        b[pos] ^= 1 << int(rng.integers(0, 8))
        add(f"flip-header-{i}-{pos}", bytes(b))
    for i, pos in enumerate(rng.integers(8 + n, total, 6).tolist()):
        b = bytearray(raw)
        b[pos] ^= 1 << int(rng.integers(0, 8))
        add(f"flip-data-{i}-{pos}", bytes(b))
    add("garbage-nosuffix", bytes(rng.integers(0, 256, 64, dtype=np.uint8)), "error", suffix=".dat", op="load_weights")
    dir_as_file = d / "adir.safetensors"
    dir_as_file.mkdir()
    _case(cases, "safetensors", "directory", "st", str(dir_as_file), "error", [str(dir_as_file)])
    _case(cases, "safetensors", "missing", "st", str(d / "nothere.safetensors"), "error", [str(d / "nothere.safetensors")])


# -- sharded safetensors index ---------------------------------------------------------------------


def _index_shards() -> dict[str, dict[str, np.ndarray]]:
    return {
        "s1.safetensors": {"x.a": np.arange(4, dtype=np.float32).reshape(2, 2), "x.b": np.array([7, 8, 9], np.int32)},
        "s2.safetensors": {"y.c": np.linspace(0, 1, 4, dtype=np.float32)},
    }


def build_index(root: Path, rng: np.random.Generator, cases: list[dict]) -> None:
    import safetensors.numpy

    base = root / "index"
    base.mkdir()
    shards = _index_shards()
    expected = {k: digest(v) for s in shards.values() for k, v in s.items()}
    outside = base / "outside.safetensors"  # beside the checkpoints: same names, other values
    safetensors.numpy.save_file({"x.a": np.full((2, 2), 66.0, np.float32), "x.b": np.zeros(3, np.int32)}, str(outside))
    good_map = {k: f for f, s in shards.items() for k in s}

    def make(
        cid: str,
        index: Any,
        expect: str,
        *,
        links: dict[str, str] | None = None,
        op: str = "index",
        subdirs: tuple[str, ...] = (),
        only: tuple[str, ...] | None = None,
    ) -> None:
        d = base / cid
        d.mkdir()
        for f, tensors in shards.items():
            safetensors.numpy.save_file(tensors, str(d / f))
        for s in subdirs:
            (d / s).mkdir()
        for name, target in (links or {}).items():
            os.symlink(target, d / name)
        p = d / "model.safetensors.index.json"
        p.write_bytes(index if isinstance(index, bytes) else json.dumps(index).encode())
        want = expected if only is None else {k: v for k, v in expected.items() if k in only}
        _case(cases, "index", cid, op, str(p if op == "index" else d), expect, [str(d)], expected=want)

    def with_value(value: Any) -> dict:  # both tensors of s1: a shard elsewhere would be read silently
        return {"metadata": {"total_size": 40}, "weight_map": {**good_map, "x.a": value, "x.b": value}}

    make("pristine", {"metadata": {"total_size": 40}, "weight_map": good_map}, "ok")
    make("pristine-dir", {"weight_map": good_map}, "ok", op="index-dir")
    for cid, text in [("json-bad", b"{"), ("json-empty", b""), ("json-nonutf8", b'{"weight_map": {"x.a": "s1\xff"}}'), ("json-nul", b"\x00\x00")]:
        make(cid, text, "error")
    for cid, index in [("top-list", []), ("top-null", None), ("top-number", 3), ("top-string", "s")]:
        make(cid, index, "error")
    for cid, wm in [("wm-missing", None), ("wm-null", "null"), ("wm-list", []), ("wm-number", 1), ("wm-string", "s1.safetensors")]:
        make(cid, {} if wm is None else {"weight_map": None if wm == "null" else wm}, "error")
    for v in (5, 1.5, None, True, [], {}, ["s1.safetensors"], "", " ", "s1.safetensors\u0000"):
        make(f"value-{json.dumps(v)}", with_value(v), "error")
    make("value-escape-parent", with_value("../outside.safetensors"), "error")
    make("value-escape-deep", with_value("sub/../../outside.safetensors"), "error", subdirs=("sub",))
    make("value-absolute-outside", with_value(str(outside)), "error")
    make("value-absolute-inside", with_value(str(base / "value-absolute-inside" / "s1.safetensors")), "error")
    make("value-symlink-outside", with_value("link.safetensors"), "error", links={"link.safetensors": str(outside)})
    make("value-symlink-relative-outside", with_value("link.safetensors"), "error", links={"link.safetensors": "../outside.safetensors"})
    make("value-symlink-dir-outside", with_value("ln/outside.safetensors"), "error", links={"ln": str(base)})
    make("value-dot-inside", with_value("./s1.safetensors"), "either")
    make("value-reenter", with_value("sub/../s1.safetensors"), "either", subdirs=("sub",))
    make("value-long", with_value("a" * 5000 + ".safetensors"), "error")
    make("value-missing-shard", with_value("s9.safetensors"), "error")
    make("value-directory", with_value("sub"), "error", subdirs=("sub",))
    make("value-index-itself", with_value("model.safetensors.index.json"), "error")
    make("value-wrong-shard", with_value("s2.safetensors"), "error")
    # the index is what is loaded: a shard it does not name is not read
    make("tensor-not-in-index", {"weight_map": {k: v for k, v in good_map.items() if k != "y.c"}}, "either", only=("x.a", "x.b"))
    make("tensor-not-in-index-same-shard", {"weight_map": {k: v for k, v in good_map.items() if k != "x.b"}}, "error")
    make("tensor-not-in-shards", {"weight_map": {**good_map, "z.z": "s1.safetensors"}}, "error")
    for meta in (5, [], "s", [1, 2]):
        make(f"meta-{json.dumps(meta)}", {"metadata": meta, "weight_map": good_map}, "either")
    make("meta-null", {"metadata": None, "weight_map": good_map}, "ok")
    for i in range(4):  # random byte flips in the index text
        text = bytearray(json.dumps({"weight_map": good_map}).encode())
        pos = int(rng.integers(0, len(text)))
        text[pos] ^= 1 << int(rng.integers(0, 8))
        make(f"flip-{i}-{pos}", bytes(text), "either")


# -- GGUF --------------------------------------------------------------------------------------------


def _gguf_pristine(path: Path) -> None:
    import gguf

    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_string("general.name", "fuzz")
    w.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5])
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("b", rng.standard_normal((4, 8)).astype(np.float16))
    w.add_tensor("c", np.arange(5, dtype=np.int32))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4 = gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("q4", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_layout(path: Path) -> tuple[list[dict], int, int]:
    """Byte offsets of each tensor info's fields, where the tensor data starts and ends."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    infos = []
    for t in reader.tensors:
        parts = t.field.parts  # name_len, name, n_dims, dims, type, offset
        pos = [t.field.offset]
        for p in parts:
            pos.append(pos[-1] + int(p.nbytes))
        infos.append(
            {"name": t.name, "name_len": pos[0], "n_dims": pos[2], "dims": pos[3], "type": pos[4], "offset": pos[5], "rel": int(parts[5][0])}
        )
    data_end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    return infos, int(reader.data_offset), data_end


def build_gguf(root: Path, rng: np.random.Generator, cases: list[dict]) -> None:
    d = root / "gguf"
    d.mkdir()
    pristine = d / "pristine.gguf"
    _gguf_pristine(pristine)
    raw = pristine.read_bytes()
    infos, data_start, data_end = _gguf_layout(pristine)
    total = len(raw)
    _case(cases, "gguf", "pristine", "gguf", str(pristine), "ok", [str(pristine)])

    def add(cid: str, data: bytes, expect: str = "either", op: str = "gguf", suffix: str = ".gguf") -> None:
        p = d / f"{cid}{suffix}"
        p.write_bytes(data)
        _case(cases, "gguf", cid, op, str(p), expect, [str(p)])

    def put(offset: int, fmt: str, value: int) -> bytes:
        b = bytearray(raw)
        b[offset : offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
        return bytes(b)

    cuts = {0, 3, 4, 7, 8, 16, 24, 25, data_start - 1, data_start, data_start + 1, total - 1, *rng.integers(0, total, 6).tolist()}
    for info in infos[:2]:
        cuts.update(info[k] + delta for k in ("name_len", "n_dims", "dims", "type", "offset") for delta in (0, 1))
    for cut in sorted(cuts):  # past the last tensor's data there is only padding
        add(f"trunc-{cut}", raw[:cut], "error" if cut < data_end else "either")
    for v in (0, 1, 2, 4, 2**32 - 1):
        add(f"version-{v}", put(4, "<I", v))
    n_tensors, n_kv = struct.unpack("<QQ", raw[8:24])
    for v in (0, n_tensors - 1, n_tensors + 1, 2**63):
        add(f"ntensors-{v}", put(8, "<Q", v))
    for v in (0, n_kv + 1, 2**63):
        add(f"nkv-{v}", put(16, "<Q", v))
    for info in infos:
        t = info["name"]
        for v in (0, 2**40, 2**64 - 1):
            add(f"{t}-namelen-{v}", put(info["name_len"], "<Q", v))
        for v in (0, 5, 2**31):
            add(f"{t}-ndims-{v}", put(info["n_dims"], "<I", v))
        for v in (0, 1, 3, 2**40, 2**63):
            add(f"{t}-dim0-{v}", put(info["dims"], "<Q", v))
        for v in (4, 99, 2**31, 0, 1, 8, 12, 30):  # removed, unknown, F32, F16, Q8_0, Q4_K, BF16
            add(f"{t}-type-{v}", put(info["type"], "<I", v))
        for v in (info["rel"] + 1, info["rel"] + 32, 2**40, 2**64 - 1, total):
            add(f"{t}-offset-{v}", put(info["offset"], "<Q", v))
    for i, pos in enumerate(rng.integers(0, data_start, 20).tolist()):
        b = bytearray(raw)
        b[pos] ^= 1 << int(rng.integers(0, 8))
        add(f"flip-header-{i}-{pos}", bytes(b))
    for i, pos in enumerate(rng.integers(data_start, total, 4).tolist()):
        b = bytearray(raw)
        b[pos] ^= 1 << int(rng.integers(0, 8))
        add(f"flip-data-{i}-{pos}", bytes(b))
    add("magic-only", b"GGUF", "error", op="load_weights")


# -- orbax -------------------------------------------------------------------------------------------


def _orbax_state() -> dict[str, Any]:
    """The saved state (a WeightData for the quantized one) and the digests restores must give."""
    import gguf
    import jax
    import ml_dtypes

    from maxjax.dtype import DType
    from maxjax.graph.quantization import QuantizationEncoding
    from maxjax.graph.weights import WeightData

    rng = np.random.default_rng(5)
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    return {
        "w.a": rng.standard_normal((64, 64)).astype(np.float32),
        "w.b": np.arange(10, dtype=np.int32),
        "w.c": jax.device_put(rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16)),
        "q.weight": WeightData(q, "q.weight", DType.uint8, q.shape, QuantizationEncoding.Q4_0, (2, 64)),
    }


def build_orbax(root: Path, rng: np.random.Generator, cases: list[dict]) -> None:
    from maxjax.graph.weights import WeightData, save_state

    d = root / "orbax"
    d.mkdir()
    state = _orbax_state()
    expected = {k: digest(np.asarray(v.data if isinstance(v, WeightData) else v)) for k, v in state.items()}
    pristine = Path(save_state(d / "source", state))
    # orbax names its data files by random ids and writes 4 or 5 of them per process: the targets
    # are the metadata files by name and data files by role, the same in every run
    files = {
        name: name
        for name in ("_CHECKPOINT_METADATA", "_METADATA", "_sharding", "array_metadatas/process_0", "commit_success.txt", "manifest.ocdbt", "ocdbt.process_0/manifest.ocdbt")
    }
    for folder in ("d", "ocdbt.process_0/d"):
        by_size = sorted((p for p in (pristine / folder).iterdir()), key=lambda p: (p.stat().st_size, p.name))
        files[f"{folder}/largest"] = str(by_size[-1].relative_to(pristine))
        if len(by_size) > 1:  # the top-level d/ holds one file
            files[f"{folder}/smallest"] = str(by_size[0].relative_to(pristine))

    def add(cid: str, mutate: Callable[[Path], None], expect: str = "either") -> None:
        p = d / cid
        shutil.copytree(pristine, p, symlinks=True)
        mutate(p)
        for op in ("restore_state", "orbax_weights", "restore_all"):
            _case(cases, "orbax", f"{cid}/{op}", op, str(p), expect, [str(p)], expected=expected)

    def rm(rel: str) -> Callable[[Path], None]:
        return lambda p: os.remove(p / rel)

    def truncate(rel: str, frac: float) -> Callable[[Path], None]:
        return lambda p: os.truncate(p / rel, int(os.path.getsize(p / rel) * frac))

    def flip(rel: str, where: float) -> Callable[[Path], None]:
        def f(p: Path) -> None:
            b = bytearray((p / rel).read_bytes())
            if b:
                b[min(len(b) - 1, int(len(b) * where))] ^= 0x10
                (p / rel).write_bytes(bytes(b))

        return f

    def write(rel: str, text: bytes) -> Callable[[Path], None]:
        return lambda p: (p / rel).write_bytes(text)

    add("pristine", lambda p: None, "ok")
    for label, rel in files.items():
        tag = label.replace("/", "_")
        add(f"rm-{tag}", rm(rel))
        add(f"empty-{tag}", truncate(rel, 0.0))
        add(f"half-{tag}", truncate(rel, 0.5))
        for where in (0.0, 0.5, 0.999):
            add(f"flip{where}-{tag}", flip(rel, where))
    for rel in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding", "array_metadatas/process_0"):
        for i, text in enumerate((b"{", b"[]", b"{}", b"null", b'{"tree_metadata": 5, "custom_metadata": 5, "array_metadatas": 5}', b"\xff\xfe")):
            add(f"json{i}-{rel.replace('/', '_')}", write(rel, text))

    def custom(edit: Callable[[dict], None]) -> Callable[[Path], None]:
        def f(p: Path) -> None:
            meta = json.loads((p / "_CHECKPOINT_METADATA").read_text())
            edit(meta.setdefault("custom_metadata", {}).setdefault("maxjax", {}))
            (p / "_CHECKPOINT_METADATA").write_text(json.dumps(meta))

        return f

    edits: list[tuple[str, Callable[[dict], None]]] = [
        ("quant-unknown-encoding", lambda m: m["quantization"]["q.weight"].__setitem__("encoding", "Q9_9")),
        ("quant-encoding-number", lambda m: m["quantization"]["q.weight"].__setitem__("encoding", 5)),
        ("quant-shape-string", lambda m: m["quantization"]["q.weight"].__setitem__("original_shape", "2x64")),
        ("quant-entry-list", lambda m: m["quantization"].__setitem__("q.weight", [1])),
        ("quant-list", lambda m: m.__setitem__("quantization", [])),
        ("maxjax-emptied", lambda m: m.clear()),
        ("checksum-wrong", lambda m: m.setdefault("sha256", {}).__setitem__("w.b", "0" * 64)),
        ("checksum-number", lambda m: m.setdefault("sha256", {}).__setitem__("w.a", 5)),
        ("checksums-list", lambda m: m.__setitem__("sha256", [])),
    ]
    for cid, e in edits:
        add(f"custom-{cid}", custom(e))
    add("custom-not-object", lambda p: (p / "_CHECKPOINT_METADATA").write_text('{"custom_metadata": 5}'))
    not_dir = d / "file-not-dir"
    not_dir.write_bytes(b"x")
    empty = d / "empty-dir"
    empty.mkdir()
    for cid, p in (("file-not-dir", not_dir), ("empty-dir", empty), ("missing", d / "nothere")):
        for op in ("restore_state", "orbax_weights"):
            _case(cases, "orbax", f"{cid}/{op}", op, str(p), "error", [str(p)], expected=expected)


# -- load_state_dict ----------------------------------------------------------------------------------

_LSD_WEIGHTS = ("lin.weight", "lin.bias", "half.weight", "dyn")


def build_lsd(rng: np.random.Generator, cases: list[dict]) -> None:
    """Argument sets: each a list of edits to a valid state dict (applied in the runner)."""
    fixed: list[tuple[str, list[list[Any]], str, dict]] = [
        ("valid", [], "ok", {}),
        ("valid-buffer", [["as", "lin.weight", "buffer"]], "ok", {}),
        ("valid-jax", [["as", "lin.bias", "jax"]], "ok", {}),
        ("valid-weightdata", [["as", "lin.weight", "weightdata"]], "ok", {}),
        ("dyn-rank1", [["dyn", [512]]], "error", {}),
        ("dyn-rank3", [["dyn", [7, 4, 1]]], "error", {}),
        ("dyn-static-dim", [["dyn", [7, 5]]], "error", {}),
        ("dyn-any-batch", [["dyn", [7, 4]]], "ok", {}),
        ("dyn-zero-batch", [["dyn", [0, 4]]], "ok", {}),
        ("dyn-dtype", [["dtype", "dyn", "float16"]], "error", {}),
        ("missing-strict", [["drop", "lin.bias"]], "error", {}),
        ("missing-lax", [["drop", "lin.bias"]], "ok", {"strict": False}),
        ("unexpected-strict", [["extra", "lin.biass"]], "error", {}),
        ("unexpected-lax", [["extra", "lin.biass"]], "ok", {"strict": False}),
        ("none-value", [["type", "lin.bias", "none"]], "error", {}),
        ("unaligned", [["unaligned", "lin.weight"]], "error", {}),
        ("unaligned-allowed", [["unaligned", "lin.weight"]], "ok", {"weight_alignment": 1}),
        ("not-a-mapping", [["container", "pairs"]], "error", {}),
    ]
    for cid, edits, expect, kw in fixed:
        cases.append({"id": f"lsd/{cid}", "family": "lsd", "op": "lsd", "edits": edits, "kwargs": kw, "expect": expect})
    shapes = ("transpose", "add_dim", "drop_dim", "zero", "scalar")
    dtypes = ("float16", "float64", "int32", "bool", "complex64", "object", "U3", "S3", ">f4", "uint8", "datetime64[s]")
    types = ("list", "tuple", "float", "int", "str", "dict", "np_scalar", "bytes", "set", "zero_d")
    keys = ("int", "tuple", "none", "bytes", "float", "frozenset")
    pool: list[list[Any]] = (
        [["shape", w, s] for w in _LSD_WEIGHTS[:3] for s in shapes if not (w == "lin.bias" and s in ("transpose", "drop_dim"))]
        + [["dtype", w, t] for w in _LSD_WEIGHTS[:3] for t in dtypes]
        + [["type", w, t] for w in _LSD_WEIGHTS for t in types]
        + [["key", k] for k in keys]
    )
    order = rng.permutation(len(pool))
    for i in order:  # each edit once on its own
        e = pool[int(i)]
        cases.append({"id": f"lsd/{'-'.join(map(str, e))}", "family": "lsd", "op": "lsd", "edits": [e], "kwargs": {}, "expect": "error"})
    for j in range(20):  # and some pairs, strict or not
        a, b = (pool[int(i)] for i in rng.choice(len(pool), 2, replace=False))
        kw = {"strict": bool(rng.integers(0, 2))}
        cases.append({"id": f"lsd/pair{j}", "family": "lsd", "op": "lsd", "edits": [a, b], "kwargs": kw, "expect": "error"})


def build_cases(root: str | os.PathLike[str], seed: int = 17) -> list[dict]:
    """Writes every corrupt input under ``root`` and returns the cases (same seed, same cases)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases: list[dict] = []
    build_safetensors(root, rng, cases)
    build_index(root, rng, cases)
    build_gguf(root, rng, cases)
    build_orbax(root, rng, cases)
    build_lsd(rng, cases)
    return cases


# -- llama models: GGUF metadata and tensor headers, config.json, the CLI ------------------------------
#
# A small synthetic llama (tests/llama_files.py) written with one thing changed. A case that loads
# must give the config the file says (``config``: the pristine one with the change) and generate
# two tokens (the pristine model's tokens where ``same_tokens``); a case that fails must fail with
# one line naming the file and one of ``fields`` (the metadata key, config.json key, tensor or
# argument at fault).

_INT32_MAX = 2**31 - 1


def _safe(cid: str) -> str:
    """A file name for a case id."""
    return "".join(c if c.isalnum() or c in "._=+-" else "_" for c in cid)


def _llama_config(**changes: Any) -> dict:
    import llama_files as L

    return {**L.CONFIG, **changes}


def _f32(v: float) -> float:
    return float(np.float32(v))


def build_llama_gguf(root: Path, rng: np.random.Generator, cases: list[dict]) -> str:
    """Writes the GGUF model cases; returns the pristine file's path."""
    import gguf

    import llama_files as L

    d = root / "llama_gguf"
    d.mkdir()
    T = gguf.GGMLQuantizationType
    base_meta = L.gguf_metadata()
    base_tensors = L.gguf_tensors()
    pristine = L.write_gguf(d / "pristine.gguf", base_meta, base_tensors)
    pristine_config = _llama_config(rms_norm_eps=_f32(L.RMS_EPS))

    def add(cid: str, meta: list, tensors: dict, expect: str, fields: list[str], config: dict | None = None, same: bool = False, arch: str = "llama", data: bytes | None = None) -> None:
        p = d / f"{_safe(cid)}.gguf"
        if data is not None:
            p.write_bytes(data)
        else:
            L.write_gguf(p, meta, tensors, arch=arch)
        if expect != "error" and config is None:
            config = pristine_config
        _case(cases, "llama", f"gguf/{cid}", "model", str(p), expect, [str(p)], fields=fields, config=config, same_tokens=same, reference=str(pristine))

    def meta_with(key: str, entry: tuple[str, Any] | None) -> list:
        out = [e for e in base_meta if e[0] != key]
        if entry is not None:
            out.insert(1, (key, *entry))
        return out

    add("pristine", base_meta, base_tensors, "ok", [], same=True)
    ints = {  # key: (LlamaConfig field, pristine value, required)
        "llama.block_count": ("num_hidden_layers", L.BLOCKS, True),
        "llama.context_length": ("max_position_embeddings", L.CONTEXT, True),
        "llama.embedding_length": ("hidden_size", L.HIDDEN, True),
        "llama.feed_forward_length": ("intermediate_size", L.FFN, True),
        "llama.attention.head_count": ("num_attention_heads", L.HEADS, True),
        "llama.attention.head_count_kv": ("num_key_value_heads", L.KV_HEADS, True),  # its default (head_count) does not fit
        "llama.rope.dimension_count": (None, L.HEAD_DIM, False),
        "llama.vocab_size": ("vocab_size", L.VOCAB, False),  # the default (the token count) is the same
    }
    for n_key, (key, (field, v, required)) in enumerate(ints.items()):
        short = key.split(".", 1)[1]
        bad: list[tuple[str, Any]] = [
            ("u32", 0), ("i32", -1), ("i32", -v), ("u32", 2**32 - 1), ("u64", 2**63), ("i64", -(2**63)), ("f32", 1.5),
            ("f32", float("nan")), ("str", "lots"), ("str", ""), ("bool", True), ("bool", False), ("arr", [v, v]), ("arr_str", ["x"]),
        ]
        for kind, value in bad:
            add(f"{short}-{kind}-{value}", meta_with(key, (kind, value)), base_tensors, "error", [key])
        other_int = ("i32", "u64", "i64")[n_key % 3]  # another integer type of the same value loads the same model
        for kind, value in ((other_int, v), ("f32", float(v)), ("f64", float(v)), ("str", str(v)), ("arr", [v])):
            add(f"{short}-{kind}-{value}-same", meta_with(key, (kind, value)), base_tensors, "either", [key], same=True)
        if key == "llama.context_length":  # a valid other context
            for value in (64, 4096, _INT32_MAX):
                add(f"{short}-{value}", meta_with(key, ("u32", value)), base_tensors, "ok", [key], _llama_config(rms_norm_eps=_f32(L.RMS_EPS), max_position_embeddings=value))
            add(f"{short}-{2**31}", meta_with(key, ("u32", 2**31)), base_tensors, "error", [key])
        else:  # any other size disagrees with the tensors
            for value in sorted({1, v - 1, v + 1, 2 * v, v // 2, 100000} - {0, v}):
                add(f"{short}-{value}", meta_with(key, ("u32", value)), base_tensors, "error", [key])
        add(f"{short}-deleted", meta_with(key, None), base_tensors, "error" if required else "ok", [key], same=not required)
    floats = {"llama.rope.freq_base": ("rope_theta", L.ROPE_BASE), "llama.attention.layer_norm_rms_epsilon": ("rms_norm_eps", L.RMS_EPS)}
    for key, (field, v) in floats.items():
        short = key.split(".", 1)[1]
        for kind, value in (("f32", 0.0), ("f32", -0.0), ("f32", -v), ("f32", float("nan")), ("f32", float("inf")), ("f32", float("-inf")), ("f64", float("nan")), ("str", "lots"), ("str", ""), ("bool", True), ("arr", [v]), ("i32", -1), ("u32", 0)):
            add(f"{short}-{kind}-{value}", meta_with(key, (kind, value)), base_tensors, "error", [key])
        for kind, value in (("f64", v), ("u32", 1)):  # each value compiles a program of its own: few
            stored = _f32(value) if kind == "f32" else float(value)
            add(f"{short}-{kind}-{value}", meta_with(key, (kind, value)), base_tensors, "either", [key], {**pristine_config, field: stored})
        if field == "rope_theta":
            add(f"{short}-deleted", meta_with(key, None), base_tensors, "ok", [key], same=True)  # llama's default base
        else:
            add(f"{short}-deleted", meta_with(key, None), base_tensors, "error", [key])
    optional = [  # (key, (kind, value), expect)
        ("llama.attention.key_length", ("u32", L.HEAD_DIM), "ok"),
        ("llama.attention.key_length", ("u32", L.HEAD_DIM - 1), "error"),
        ("llama.attention.key_length", ("u32", 2 * L.HEAD_DIM), "error"),
        ("llama.attention.key_length", ("u32", 0), "error"),
        ("llama.attention.key_length", ("str", "16"), "either"),
        ("llama.attention.value_length", ("u32", L.HEAD_DIM), "ok"),
        ("llama.attention.value_length", ("u32", L.HEAD_DIM // 2), "error"),
        ("llama.attention.value_length", ("f32", float("nan")), "error"),
        ("llama.expert_count", ("u32", 8), "error"),
        ("llama.expert_count", ("u32", 0), "ok"),
        ("llama.expert_count", ("str", "lots"), "error"),
        ("llama.rope.scaling.type", ("str", "linear"), "error"),
        ("llama.rope.scaling.type", ("str", "none"), "ok"),
        ("llama.rope.scaling.type", ("u32", 1), "error"),
        ("llama.rope.scaling.factor", ("f32", 1.0), "ok"),
        ("llama.rope.scaling.factor", ("f32", 4.0), "error"),
        ("llama.rope.scaling.factor", ("str", "lots"), "error"),
        ("llama.rope.scaling.factor", ("f32", float("nan")), "error"),
        ("llama.rope.dimension_count", ("u32", L.HEAD_DIM // 2), "error"),
    ]
    for key, entry, expect in optional:
        add(f"{key.split('.', 1)[1]}-{entry[0]}-{entry[1]}", meta_with(key, entry), base_tensors, expect, [key], same=expect != "error")
    for arch in ("gpt2", "", "Llama"):
        add(f"arch-{arch or 'empty'}", base_meta, base_tensors, "error", ["general.architecture", "architecture"], arch=arch)
    no_tokens = [e for e in base_meta if e[0] != "tokenizer.ggml.tokens"]
    add("tokens-deleted", no_tokens, base_tensors, "error", ["tokenizer.ggml.tokens"])
    add("tokens-and-vocab-deleted", [e for e in no_tokens if e[0] != "llama.vocab_size"], base_tensors, "error", ["llama.vocab_size", "tokenizer.ggml.tokens"])
    tokens = L.vocabulary()
    more = [e if e[0] != "tokenizer.ggml.tokens" else (e[0], e[1], tokens + ["Ġx"]) for e in base_meta]
    more = [e if e[0] != "tokenizer.ggml.token_type" else (e[0], e[1], list(e[2]) + [1]) for e in more]
    add("tokens-beyond-vocab", more, base_tensors, "error", ["tokenizer.ggml.tokens", "llama.vocab_size"])
    add("tokens-beyond-embd", [e for e in more if e[0] != "llama.vocab_size"], base_tensors, "error", ["token_embd.weight", "tokenizer.ggml.tokens"])
    add("tokens-string", [e if e[0] != "tokenizer.ggml.tokens" else (e[0], "str", "abc") for e in base_meta], base_tensors, "error", ["tokenizer.ggml.tokens"])

    # tensors: missing, extra, reshaped, retyped, non-finite values
    def tensors_with(name: str, value: tuple[np.ndarray, Any] | None, after: str | None = None) -> dict:
        out = dict(base_tensors)
        if value is None:
            out.pop(name)
        else:
            out[name] = value
        return out

    def q(shape: tuple[int, ...], qtype: Any = T.Q4_1, fill: float | None = None) -> tuple[np.ndarray, Any]:
        a = rng.standard_normal(shape) * 0.1 if fill is None else np.full(shape, fill)
        if qtype is None:
            return a.astype(np.float32), None
        if qtype in (T.F16, T.F32):
            return a.astype(np.float16 if qtype == T.F16 else np.float32), None
        if qtype == T.I32:
            return a.astype(np.int32), None
        return gguf.quants.quantize(a.astype(np.float32), qtype), qtype

    H, V, F = L.HIDDEN, L.VOCAB, L.FFN
    for name in ("token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.ffn_norm.weight", "blk.0.attn_v.weight"):
        add(f"missing-{name}", base_meta, tensors_with(name, None), "error", [name])
    add("missing-block-1", base_meta, {k: v for k, v in base_tensors.items() if not k.startswith("blk.1.")}, "error", ["llama.block_count", "blk.1"])
    for name, value, expect in [
        ("blk.2.attn_q.weight", q((64, H)), "error"),
        ("blk.02.attn_q.weight", q((64, H)), "error"),
        ("blk.0.attn_q.bias", q((64,), None), "error"),
        ("foo.weight", q((4,), None), "error"),
        ("rope_freqs.weight", q((8,), None), "error"),
        ("output.weight", q((V + 1, H), T.Q8_0), "error"),
        ("output.weight", q((V, H // 2), T.F16), "error"),
        ("output.weight", q((V, H), T.I32), "error"),
    ]:
        add(f"extra-{name}-{list(value[0].shape)}-{value[1].name if value[1] is not None else value[0].dtype}", base_meta, tensors_with(name, value), expect, [name])
    add("extra-output.weight-valid", base_meta, tensors_with("output.weight", q((V, H), T.Q8_0)), "ok", ["output.weight"], _llama_config(rms_norm_eps=_f32(L.RMS_EPS), tie_word_embeddings=False))
    for name, shape in [
        ("token_embd.weight", (V + 1, H)),
        ("token_embd.weight", (V - 8, H)),
        ("token_embd.weight", (V, H + 32)),
        ("blk.0.attn_q.weight", (96, H)),
        ("blk.1.attn_k.weight", (64, H)),
        ("blk.0.attn_output.weight", (H, 96)),
        ("blk.1.ffn_up.weight", (128, H)),
        ("blk.0.ffn_down.weight", (H, 128)),
        ("blk.0.ffn_gate.weight", (1, F, H)),
        ("blk.0.attn_norm.weight", (32,)),
        ("blk.1.ffn_norm.weight", (1, H)),
        ("output_norm.weight", (H, 1)),
    ]:
        qtype = T.Q8_0 if name.startswith("token_embd") else (None if "norm" in name else T.Q4_1)
        add(f"shape-{name}-{list(shape)}", base_meta, tensors_with(name, q(shape, qtype)), "error", [name])
    for name, qtype, expect in [
        ("blk.0.attn_norm.weight", T.F16, "either"),
        ("blk.0.attn_norm.weight", T.Q8_0, "error"),
        ("output_norm.weight", T.I32, "error"),
        ("blk.0.attn_q.weight", T.Q8_0, "error"),  # one block of another type than the others
        ("blk.1.ffn_down.weight", T.Q4_0, "error"),
        ("blk.0.attn_k.weight", T.I32, "error"),
        ("token_embd.weight", T.F16, "either"),
        ("token_embd.weight", T.I32, "error"),
    ]:
        shape = dict((n, s) for n, s in [("token_embd.weight", (V, H)), ("output_norm.weight", (H,))]).get(name) or L.BLOCK_TENSORS[name.split(".")[2]][1]
        add(f"type-{name}-{qtype.name}", base_meta, tensors_with(name, q(shape, qtype)), expect, [name], _llama_config(rms_norm_eps=_f32(L.RMS_EPS)))
    both = dict(base_tensors)
    for i in range(L.BLOCKS):
        both[f"blk.{i}.attn_q.weight"] = q((64, H), T.Q8_0)
    add("type-attn_q-Q8_0-every-block", base_meta, both, "either", ["attn_q"], _llama_config(rms_norm_eps=_f32(L.RMS_EPS)))
    for name in ("blk.0.attn_norm.weight", "blk.1.ffn_norm.weight", "output_norm.weight"):
        for bad in (float("nan"), float("inf"), float("-inf")):
            a = base_tensors[name][0].copy()
            a[int(rng.integers(0, a.size))] = bad
            add(f"nonfinite-{name}-{bad}", base_meta, tensors_with(name, (a, None)), "error", [name])
    for name in ("blk.0.attn_q.weight", "token_embd.weight", "blk.1.ffn_down.weight"):  # found only while generating
        shape = (V, H) if name == "token_embd.weight" else L.BLOCK_TENSORS[name.split(".")[2]][1]
        t = dict(base_tensors)
        if name.startswith("blk."):  # F32 in every block (one type per block tensor), NaN in one
            t.update({f"blk.{i}.{name.split('.')[2]}.weight": q(shape, T.F32) for i in range(L.BLOCKS)})
        t[name] = q(shape, T.F32, float("nan"))
        add(f"nonfinite-{name}-nan-everywhere", base_meta, t, "error", [name, "non-finite"])

    # tensor headers rewritten in place (the data stays where it was)
    raw = pristine.read_bytes()
    infos, _, _ = _gguf_layout(pristine)
    for info in infos:
        if info["name"] not in ("token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.0.ffn_down.weight", "blk.0.attn_norm.weight", "output_norm.weight"):
            continue
        t = info["name"]
        for qt in (T.Q8_0, T.Q4_0, T.Q5_1, T.F16, T.F32, T.BF16, T.I8):
            b = bytearray(raw)
            b[info["type"] : info["type"] + 4] = struct.pack("<I", int(qt))
            if bytes(b) != raw:
                add(f"hdr-{t}-type-{qt.name}", [], {}, "error", [t], data=bytes(b))
        for dim in (0, 1):
            ne = struct.unpack_from("<Q", raw, info["dims"] + 8 * dim)[0] if dim == 0 or "norm" not in t else None
            if ne is None:
                continue
            for new in sorted({ne // 2, ne * 2} - {ne}):
                b = bytearray(raw)
                struct.pack_into("<Q", b, info["dims"] + 8 * dim, new)
                add(f"hdr-{t}-ne{dim}-{new}", [], {}, "error", [t], data=bytes(b))
    return str(pristine)


def build_llama_hf(root: Path, rng: np.random.Generator, cases: list[dict]) -> str:
    """Writes the Hugging Face directory cases; returns the pristine directory's path."""
    import llama_files as L

    d = root / "llama_hf"
    d.mkdir()
    base_cfg = L.hf_config()
    base_tensors = L.hf_tensors()
    pristine = L.write_hf_dir(d / "pristine", base_cfg, base_tensors)

    def add(cid: str, cfg: Any, expect: str, fields: list[str], config: dict | None = None, same: bool = False, tensors: dict | None = None, text: bytes | None = None) -> None:
        p = d / _safe(cid)
        if tensors is None:  # the pristine files, linked
            p.mkdir()
            (p / "config.json").write_bytes(text if text is not None else json.dumps(cfg).encode())
            for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
                os.link(pristine / f, p / f)
        else:
            L.write_hf_dir(p, cfg, tensors, config_text=text)
        if expect != "error" and config is None:
            config = _llama_config()
        _case(cases, "llama", f"hf/{cid}", "model", str(p), expect, [str(p)], fields=fields, config=config, same_tokens=same, reference=str(pristine))

    def with_key(key: str, value: Any) -> dict:
        c = dict(base_cfg)
        if value is _DELETE:
            c.pop(key, None)
        else:
            c[key] = value
        return c

    _case(cases, "llama", "hf/pristine", "model", str(pristine), "ok", [str(pristine)], fields=[], config=_llama_config(), same_tokens=True, reference=str(pristine))
    for i, text in enumerate((b"[]", b"[1, 2]", b'"LlamaForCausalLM"', b"5", b"null", b"{", b"", b"\xff\xfe{}", b'{"vocab_size": 264', b"{}")):
        add(f"text-{i}", None, "error", ["config.json"], text=text)
    ints = {  # key: (LlamaConfig field, value, default when null or missing: None = required)
        "vocab_size": ("vocab_size", L.VOCAB, None),
        "hidden_size": ("hidden_size", L.HIDDEN, None),
        "intermediate_size": ("intermediate_size", L.FFN, None),
        "num_hidden_layers": ("num_hidden_layers", L.BLOCKS, None),
        "num_attention_heads": ("num_attention_heads", L.HEADS, None),
        "num_key_value_heads": ("num_key_value_heads", L.KV_HEADS, "error"),  # default: num_attention_heads, does not fit
        "head_dim": ("head_dim", L.HEAD_DIM, "same"),  # default: hidden_size // num_attention_heads
        "max_position_embeddings": ("max_position_embeddings", L.CONTEXT, 2048),
    }
    for key, (field, v, default) in ints.items():
        for value in (0, -1, 1.5, "lots", True, False, [v], {}, 10**20, float("nan")):
            add(f"{key}-{json.dumps(value)}", with_key(key, value), "error", [key])
        for value in (float(v), str(v)):
            add(f"{key}-{json.dumps(value)}-same", with_key(key, value), "either", [key], same=True)
        for how, value in (("null", None), ("deleted", _DELETE)):
            if default is None or default == "error":
                add(f"{key}-{how}", with_key(key, value), "error", [key])
            elif default == "same":
                add(f"{key}-{how}", with_key(key, value), "ok", [key], same=True)
            else:
                add(f"{key}-{how}", with_key(key, value), "ok", [key], _llama_config(**{field: default}))
        if key == "max_position_embeddings":
            add(f"{key}-64", with_key(key, 64), "ok", [key], _llama_config(max_position_embeddings=64))
        else:
            for value in sorted({1, v + 1, 2 * v, 100000} - {v}):
                add(f"{key}-{value}", with_key(key, value), "error", [key])
    floats = {"rope_theta": (L.ROPE_BASE, 10000.0), "rms_norm_eps": (L.RMS_EPS, 1e-6)}
    for key, (v, default) in floats.items():
        for value in (0, -1.0, float("nan"), float("inf"), float("-inf"), "lots", "1e-5", True, [v], {}):
            add(f"{key}-{json.dumps(value)}", with_key(key, value), "error", [key])
        if key == "rope_theta":  # an integer where a float is expected (as many config.json files have it)
            add(f"{key}-{int(v)}", with_key(key, int(v)), "ok", [key], same=True)
        for how, value in (("null", None), ("deleted", _DELETE)):
            add(f"{key}-{how}", with_key(key, value), "ok", [key], _llama_config(**{key: default}), same=default == v)
    others = [
        ("tie_word_embeddings", False, "error", ["lm_head.weight", "tie_word_embeddings"]),
        ("tie_word_embeddings", "true", "error", ["tie_word_embeddings"]),
        ("tie_word_embeddings", 1, "error", ["tie_word_embeddings"]),
        ("tie_word_embeddings", _DELETE, "error", ["lm_head.weight", "tie_word_embeddings"]),
        ("architectures", ["GPT2LMHeadModel"], "error", ["architecture"]),
        ("architectures", "LlamaForCausalLM", "either", ["architectures"]),
        ("architectures", [], "ok", ["architectures"]),
        ("architectures", 5, "error", ["architecture"]),
        ("architectures", [{"a": 1}], "error", ["architecture"]),
        ("hidden_act", "gelu", "error", ["hidden_act"]),
        ("hidden_act", 5, "error", ["hidden_act"]),
        ("hidden_act", _DELETE, "ok", ["hidden_act"]),
        ("rope_scaling", {"type": "linear", "factor": 2.0}, "error", ["rope_scaling"]),
        ("rope_scaling", None, "ok", ["rope_scaling"]),
        ("rope_scaling", "x", "error", ["rope_scaling"]),
        ("attention_bias", True, "error", ["attention_bias"]),
        ("attention_bias", False, "ok", ["attention_bias"]),
        ("mlp_bias", True, "error", ["mlp_bias"]),
    ]
    for key, value, expect, fields in others:
        add(f"{key}-{'deleted' if value is _DELETE else json.dumps(value)}", with_key(key, value), expect, fields, same=expect != "error")

    def tensors_with(name: str, value: np.ndarray | None) -> dict:
        out = dict(base_tensors)
        if value is None:
            out.pop(name)
        else:
            out[name] = value
        return out

    H, V, F = L.HIDDEN, L.VOCAB, L.FFN
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        add(f"missing-{name}", base_cfg, "error", [name], tensors=tensors_with(name, None))
    rnd = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)  # noqa: E731
    for name, value, expect in [
        ("model.layers.2.self_attn.q_proj.weight", rnd(64, H), "error"),
        ("model.layers.0.self_attn.q_proj.bias", rnd(64), "error"),
        ("lm_head.weight", rnd(V, H), "either"),
        ("model.layers.0.self_attn.rotary_emb.inv_freq", rnd(8), "ok"),
        ("model.embed_tokens.weight", rnd(V + 1, H), "error"),
        ("model.layers.0.self_attn.q_proj.weight", rnd(96, H), "error"),
        ("model.layers.1.mlp.up_proj.weight", rnd(F, H + 1), "error"),
        ("model.layers.0.input_layernorm.weight", rnd(H, 1), "error"),
        ("model.layers.0.self_attn.k_proj.weight", rnd(32, H).astype(np.int32), "error"),
        ("model.layers.0.self_attn.k_proj.weight", rnd(32, H).astype(np.float16), "either"),
    ]:
        cfg = base_cfg
        add(f"tensor-{name}-{list(value.shape)}-{value.dtype}", cfg, expect, [name], _llama_config(), tensors=tensors_with(name, value))
    add("untied-with-lm_head", with_key("tie_word_embeddings", False), "ok", ["lm_head.weight"], _llama_config(tie_word_embeddings=False), tensors=tensors_with("lm_head.weight", rnd(V, H)))
    for name in ("model.layers.0.input_layernorm.weight", "model.norm.weight"):
        for bad in (float("nan"), float("inf")):
            a = base_tensors[name].copy()
            a[int(rng.integers(0, a.size))] = bad
            add(f"nonfinite-{name}-{bad}", base_cfg, "error", [name], tensors=tensors_with(name, a))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"):
        add(f"nonfinite-{name}-nan-everywhere", base_cfg, "error", [name, "non-finite", "NaN"], tensors=tensors_with(name, np.full_like(base_tensors[name], np.nan)))
    return str(pristine)


_DELETE = object()


def build_cli(root: Path, rng: np.random.Generator, cases: list[dict], models: dict[str, str]) -> None:
    """``maxjax generate`` argument sets, run in the runner's process through ``maxjax.cli.main``."""
    good = models["llama/gguf/pristine"]
    d = root / "cli"
    d.mkdir()
    empty_dir = d / "empty-dir"
    empty_dir.mkdir()
    two = d / "two-ggufs"
    two.mkdir()
    for n in ("a.gguf", "b.gguf"):
        shutil.copy(good, two / n)
    junk = d / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    st = d / "weights.safetensors"
    shutil.copy(Path(models["llama/hf/pristine"]) / "model.safetensors", st)

    def add(cid: str, argv: list[str], expect: str, fields: list[str], names: list[str] | None = None) -> None:
        cases.append({"id": f"cli/{cid}", "family": "cli", "op": "cli", "argv": ["generate", *argv], "expect": expect, "names": names or [], "fields": fields})

    base = ["--model", good, "--max-new-tokens", "2"]
    add("ok", [*base, "hello world"], "ok", [])
    add("ok-sampling", [*base, "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "--seed", "3", "hello"], "ok", [])
    add("ok-bfloat16", [*base, "--dtype", "bfloat16", "hello"], "ok", [])
    add("ok-layout-unpacked", [*base, "--quantized-layout", "unpacked", "hello"], "ok", [])
    add("ok-hf", ["--model", models["llama/hf/pristine"], "--max-new-tokens", "2", "hello"], "ok", [])
    add("chat-without-template", [*base, "--chat", "hello"], "either", ["chat"])
    for flag, values in {
        "--max-new-tokens": ["0", "-1", "abc", "1.5", "", str(10**12), str(2**64)],
        "--temperature": ["-1", "nan", "inf", "abc", "-inf"],
        "--top-p": ["0", "1.5", "nan", "-0.1"],
        "--top-k": ["-1", str(2**40), "x"],
        "--seed": [str(2**80), "abc", str(-(2**70))],
        "--dtype": ["float16", "int8"],
        "--quantized-layout": ["bogus"],
        "--mesh": ["bogus", "tp=0", "tp=x"],
    }.items():
        for v in values:
            argv = [*base, flag, v, "hello"] if flag != "--max-new-tokens" else ["--model", good, flag, v, "hello"]
            add(f"{flag}={v}", argv, "error", [flag, "mesh spec"] if flag == "--mesh" else [flag])
    add("prompt-empty", [*base, ""], "error", ["prompt", "PROMPT"])
    add("prompt-not-utf8", [*base, "ab\udcffc"], "error", ["PROMPT"])
    add("prompt-too-long", ["--model", good, "--max-new-tokens", "2", "hello " * 200], "error", ["context", "--max-new-tokens"])
    add("unknown-flag", [*base, "--bogus", "hello"], "error", ["--bogus"])
    add("no-prompt", [*base], "error", ["PROMPT"])
    for cid, path in (("missing", str(d / "nothere.gguf")), ("empty-dir", str(empty_dir)), ("two-ggufs", str(two)), ("junk", str(junk)), ("safetensors-alone", str(st))):
        add(f"model-{cid}", ["--model", path, "--max-new-tokens", "2", "hello"], "error", [os.path.basename(path)], [path])
    for cid, case_id in [
        ("block-count-100000", "llama/gguf/block_count-100000"),
        ("head-count-0", "llama/gguf/attention.head_count-u32-0"),
        ("embedding-length-0", "llama/gguf/embedding_length-u32-0"),
        ("embedding-length-63", "llama/gguf/embedding_length-63"),
        ("block-count-lots", "llama/gguf/block_count-str-lots"),
        ("rms-eps-nan", "llama/gguf/attention.layer_norm_rms_epsilon-f32-nan"),
        ("rope-base-0", "llama/gguf/rope.freq_base-f32-0.0"),
        ("norm-nan", "llama/gguf/nonfinite-blk.0.attn_norm.weight-nan"),
        ("attn-q-nan", "llama/gguf/nonfinite-blk.0.attn_q.weight-nan-everywhere"),
        ("token-embd-265-rows", "llama/gguf/shape-token_embd.weight-[265, 64]"),
        ("attn-q-retyped", "llama/gguf/hdr-blk.0.attn_q.weight-type-Q8_0"),
        ("hf-config-list", "llama/hf/text-0"),
        ("hf-heads-0", "llama/hf/num_attention_heads-0"),
        ("hf-layers-100000", "llama/hf/num_hidden_layers-100000"),
    ]:
        if case_id not in models:
            raise AssertionError(f"no model case {case_id}")
        path = models[case_id]
        add(f"model-{cid}", ["--model", path, "--max-new-tokens", "2", "hello"], "error", models[case_id + "#fields"], [path])


def build_model_cases(root: str | os.PathLike[str], seed: int = 17) -> list[dict]:
    """Writes the llama model and CLI cases under ``root`` and returns them (same seed, same cases)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases: list[dict] = []
    build_llama_gguf(root, rng, cases)
    build_llama_hf(root, rng, cases)
    models = {c["id"]: c["path"] for c in cases}
    models.update({c["id"] + "#fields": c["fields"] for c in cases})
    build_cli(root, rng, cases, models)
    return cases


# -- the runner (in the subprocess) -----------------------------------------------------------------


def _wd_numpy(wd: Any) -> np.ndarray:
    return np.asarray(wd.to_numpy())


def _run_st(case: dict) -> str | None:
    import safetensors.numpy

    from maxjax.graph.weights import SafetensorWeights, load_weights

    w = load_weights([case["path"]]) if case["op"] == "load_weights" else SafetensorWeights([case["path"]])
    got = {name: digest(_wd_numpy(v.data())) for name, v in w.items()}
    try:
        ref = {k: digest(v) for k, v in safetensors.numpy.load_file(case["path"]).items()}
    except Exception as e:
        return f"loaded {sorted(got)}, but the safetensors package refuses the file ({type(e).__name__}: {e})"
    if got != ref:
        return f"values differ from the safetensors package's: {got} != {ref}"
    return None


def _run_index(case: dict) -> str | None:
    from maxjax.graph.weights import SafetensorWeights, load_weights

    w = SafetensorWeights([case["path"]]) if case["op"] == "index" else load_weights([case["path"]])
    got = {name: digest(_wd_numpy(v.data())) for name, v in w.items()}
    if got != case["expected"]:
        return f"loaded other tensors or values than the shards hold: {got} != {case['expected']}"
    return None


def _run_gguf(case: dict) -> str | None:
    import gguf

    from maxjax.graph.weights import GGUFWeights, load_weights

    w = load_weights([case["path"]]) if case["op"] == "load_weights" else GGUFWeights(case["path"])
    got = {}
    for name, v in w.items():
        wd = v.data()
        got[name] = (raw_digest(_wd_numpy(wd)), [int(x) for x in (wd.original_shape or wd.shape)])
    try:
        reader = gguf.GGUFReader(case["path"])
        ref = {t.name: (raw_digest(t.data), [int(x) for x in reversed(t.shape.tolist())]) for t in reader.tensors}
    except Exception as e:
        return f"loaded {sorted(got)}, but the gguf package refuses the file ({type(e).__name__}: {e})"
    if got != ref:
        return f"tensors differ from the gguf package's: {got} != {ref}"
    return None


def _run_orbax(case: dict) -> str | None:
    from maxjax.graph.weights import OrbaxWeights, restore_state

    if case["op"] == "restore_state":
        got = {k: digest(np.asarray(v)) for k, v in restore_state(case["path"]).items()}
    elif case["op"] == "orbax_weights":
        w = OrbaxWeights(case["path"])
        got = {name: digest(_wd_numpy(v.data())) for name, v in w.items()}
    else:
        got = {k: digest(_wd_numpy(v)) for k, v in OrbaxWeights(case["path"]).restore_all().items()}
    if got != case["expected"]:
        bad = sorted(k for k in set(got) | set(case["expected"]) if got.get(k) != case["expected"].get(k))
        return f"restored other values than were saved (silently): {bad}"
    return None


def _lsd_module() -> Any:
    from maxjax import nn
    from maxjax.dtype import DType
    from maxjax.graph.type import DeviceRef
    from maxjax.graph.weight import Weight

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3, DType.float32, has_bias=True)
            self.half = nn.Linear(4, 2, DType.bfloat16)
            self.dyn = Weight("dyn", DType.float32, ["batch", 4], DeviceRef.CPU())

    return Net()


def _lsd_state(seed: int) -> dict[str, Any]:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    return {
        "lin.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "lin.bias": rng.standard_normal(3).astype(np.float32),
        "half.weight": rng.standard_normal((2, 4)).astype(ml_dtypes.bfloat16),
        "dyn": rng.standard_normal((6, 4)).astype(np.float32),
    }


def _lsd_apply(sd: dict[Any, Any], edit: list[Any]) -> tuple[Any, list[str]]:
    """Applies one edit; returns the new state dict and what the error must name."""
    import jax

    from maxjax.driver import Buffer
    from maxjax.graph.weights import WeightData

    kind = edit[0]
    if kind == "as":
        _, name, how = edit
        v = sd[name]
        sd[name] = {"buffer": Buffer.from_numpy, "jax": jax.device_put, "weightdata": lambda a: WeightData.from_numpy(a, name)}[how](v)
        return sd, [name]
    if kind == "dyn":
        sd["dyn"] = np.ones(edit[1], np.float32)
        return sd, ["dyn"]
    if kind == "drop":
        del sd[edit[1]]
        return sd, [edit[1]]
    if kind == "extra":
        sd[edit[1]] = np.zeros(1, np.float32)
        return sd, [edit[1]]
    if kind == "unaligned":
        v = np.asarray(sd[edit[1]])
        raw = np.zeros(v.nbytes + 1, np.uint8)
        u = raw[1:].view(v.dtype).reshape(v.shape)
        u[...] = v
        sd[edit[1]] = u
        return sd, [edit[1]]
    if kind == "container":
        return list(sd.items()), ["state_dict", "list", "mapping", "Mapping"]
    if kind == "shape":
        _, name, how = edit
        v = np.asarray(sd[name])
        sd[name] = {"transpose": lambda: v.T.copy(), "add_dim": lambda: v[None], "drop_dim": lambda: v.reshape(-1), "zero": lambda: v[:0], "scalar": lambda: v.reshape(-1)[0].copy()}[how]()
        return sd, [name]
    if kind == "dtype":
        _, name, dt = edit
        v = np.asarray(sd[name]).astype(np.float32)
        if dt == "object":
            sd[name] = v.astype(object)
        elif dt in ("U3", "S3"):
            sd[name] = v.astype(dt)
        elif dt == "datetime64[s]":
            sd[name] = v.astype(np.int64).astype(dt)
        else:
            sd[name] = v.astype(np.dtype(dt))
        return sd, [name]
    if kind == "type":
        _, name, t = edit
        v = np.asarray(sd[name]).astype(np.float32)
        sd[name] = {
            "list": lambda: v.tolist(),
            "tuple": lambda: tuple(v.reshape(-1).tolist()),
            "float": lambda: 1.5,
            "int": lambda: 3,
            "str": lambda: "weights",
            "dict": lambda: {"data": v},
            "np_scalar": lambda: np.float32(1.0),
            "bytes": lambda: v.tobytes(),
            "set": lambda: {1.0},
            "zero_d": lambda: np.array(1.0, np.float32),
            "none": lambda: None,
        }[t]()
        return sd, [name]
    if kind == "key":
        key = {"int": 0, "tuple": ("lin", "weight"), "none": None, "bytes": b"lin.weight", "float": 1.5, "frozenset": frozenset({"a"})}[edit[1]]
        sd[key] = np.zeros(1, np.float32)
        return sd, [repr(key)]
    raise AssertionError(f"unknown edit {edit}")


def _run_lsd(case: dict) -> str | None:
    m = _lsd_module()
    m.load_state_dict(_lsd_state(1))
    before = {fqn: w.value for fqn, w in m.raw_state_dict().items()}
    sd: Any = _lsd_state(2)
    subjects: list[str] = []
    for e in case["edits"]:
        sd, names = _lsd_apply(sd, e)
        subjects += names
    case["names"] = subjects
    try:
        m.load_state_dict(sd, **case["kwargs"])
    except BaseException:
        after = {fqn: w.value for fqn, w in m.raw_state_dict().items()}
        if any(after[k] is not before[k] for k in before):
            case["changed"] = sorted(k for k in before if after[k] is not before[k])
        raise
    for fqn, w in m.raw_state_dict().items():
        want = sd.get(fqn) if isinstance(sd, dict) else None
        if want is None:
            if w.value is not before[fqn]:
                return f"{fqn} changed though the state dict has no value for it"
        elif w.value is not want:
            return f"{fqn} holds another value than the one given"
    return None


_REFERENCE_TOKENS: dict[str, list[int]] = {}
_PROMPT = "hello world"


def _generate(lm: Any) -> list[int]:
    return lm.generate([_PROMPT], 2, stop_at_eos=False)[0].token_ids


def _run_model(case: dict) -> str | None:
    import math

    from maxjax.models import load_model

    lm = load_model(case["path"])
    got = lm.config.to_dict()
    want = case["config"]
    if want is None:  # an input that must be refused: generating may still find it out (NaN weights)
        _generate(lm)
        return None
    if set(got) != set(want) or any(
        not (math.isclose(got[k], want[k], rel_tol=1e-6) if isinstance(want[k], float) else got[k] == want[k]) for k in want
    ):
        diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
        return f"loaded another config than the file says (got, want): {diff}"
    tokens = _generate(lm)
    if len(tokens) != 2:
        return f"generated {len(tokens)} tokens, not 2"
    if case.get("same_tokens"):
        ref = case["reference"]
        if ref not in _REFERENCE_TOKENS:
            _REFERENCE_TOKENS[ref] = _generate(load_model(ref))
        if tokens != _REFERENCE_TOKENS[ref]:
            return f"generated {tokens}, the unchanged model {_REFERENCE_TOKENS[ref]}"
    return None


def _run_cli(case: dict) -> dict:
    import contextlib
    import io

    from maxjax.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")
        try:
            code = cli_main(case["argv"])
        except SystemExit as e:  # argparse
            code = e.code
    return {"exit": code, "stderr": err.getvalue()[-3000:], "stdout": out.getvalue()[-300:]}


def _run_selftest(case: dict) -> str | None:
    """Cases that check the harness itself: one that hangs, one that kills its process, one that loads."""
    import signal
    import time

    if case["op"] == "hang":
        time.sleep(3600)
    elif case["op"] == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    return None


_RUNNERS = {
    "safetensors": _run_st,
    "index": _run_index,
    "gguf": _run_gguf,
    "orbax": _run_orbax,
    "lsd": _run_lsd,
    "llama": _run_model,
    "cli": _run_cli,
    "selftest": _run_selftest,
}


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def run(cases: list[dict], out: Any) -> None:
    for case in cases:
        out.write(json.dumps({"start": case["id"]}) + "\n")
        out.flush()
        result: dict[str, Any] = {"id": case["id"]}
        try:
            mismatch = _RUNNERS[case["family"]](case)
            if isinstance(mismatch, dict):  # the CLI's exit status and output, judged by the parent
                result.update(status="ok", **mismatch)
            else:
                result.update(status="ok", mismatch=mismatch)
        except BaseException as e:  # noqa: BLE001 - every exception is an outcome to judge
            result.update(
                status="raised",
                type=f"{type(e).__module__}.{type(e).__qualname__}",
                clean_type=isinstance(e, (ValueError, OSError, KeyError)),
                message=_message(e)[:2000],
                changed=case.get("changed"),
            )
        if "names" in case:
            result["names"] = case["names"]
        out.write(json.dumps(result) + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    # Outcomes go to the stdout this process was started with; whatever the libraries print goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    warnings.simplefilter("ignore", np.exceptions.ComplexWarning)  # edits that cast complex values
    with open(argv[0]) as f:
        cases = json.load(f)
    import jax  # noqa: F401 - imported before the first case is timed
    import orbax.checkpoint  # noqa: F401

    import maxjax.graph.weights  # noqa: F401
    import maxjax.nn  # noqa: F401

    if any(c["family"] in ("llama", "cli") for c in cases):
        import maxjax.cli  # noqa: F401
        import maxjax.models  # noqa: F401
        from maxjax.engine import enable_compilation_cache

        if os.environ.get("MAXJAX_FUZZ_CACHE_DIR"):  # models of one config compile once per run
            enable_compilation_cache(os.environ["MAXJAX_FUZZ_CACHE_DIR"])
    run(cases, out)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
