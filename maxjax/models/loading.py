"""``load_model``: a model file, directory or cached repo id -> a ready :class:`CausalLM`."""

from __future__ import annotations

import contextlib
import gc
import os
import re
from pathlib import Path
from typing import Any, Iterator

from maxjax.dtype import DType
from maxjax.models.causal_lm import CausalLM

__all__ = [
    "KV_CHECK_TOKENS", "MEMORY_ENV", "available_memory", "check_fits_in_memory", "load_model", "memory_plan",
    "resolve_model_path",
]  # fmt: skip

#: Tokens of KV cache (batch 1) that the memory check before loading counts: a request's cache is
#: sized by the request (its prompt and new tokens, rounded up to a bucket, up to the context).
KV_CHECK_TOKENS = 4096

#: Environment variable that overrides the memory :func:`available_memory` reports: a number of
#: bytes (``K``/``M``/``G``/``T`` suffixes allowed), or ``unlimited`` to turn the check off.
MEMORY_ENV = "MAXJAX_MEMORY_AVAILABLE"


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"${MEMORY_ENV} must be a number of bytes (e.g. 8G) or 'unlimited', got {text!r}")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index((m.group(2) or "_").upper()))


def available_memory() -> tuple[int, str] | None:
    """``(bytes, where that number comes from)`` of the memory a model may take now, or None
    when unknown or when ``$MAXJAX_MEMORY_AVAILABLE`` is ``unlimited``.

    The smallest of: ``MemAvailable`` in ``/proc/meminfo``, the cgroup's ``memory.max`` less its
    ``memory.current`` (in a container with a limit), or free physical pages (``os.sysconf``) where
    ``/proc`` is missing. ``$MAXJAX_MEMORY_AVAILABLE`` (bytes, ``K``/``M``/``G``/``T`` suffixes)
    replaces them all.

    Raises:
        ValueError: ``$MAXJAX_MEMORY_AVAILABLE`` is not a size or ``unlimited``.
    """
    env = os.environ.get(MEMORY_ENV)
    if env is not None and env.strip():
        if env.strip().lower() in ("unlimited", "off", "none"):
            return None
        return _parse_bytes(env), f"${MEMORY_ENV}"
    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append((max(0, int(limit) - used), "the cgroup's memory.max less memory.current"))
    except (OSError, ValueError):
        pass
    if not found:
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory (sysconf)"))
        except (OSError, ValueError, AttributeError):  # pragma: no cover - no such sysconf names
            return None
    return min(found)


def check_fits_in_memory(nbytes: int, source: str, what: str = "the model's tensors") -> None:
    """Refuses a model whose ``nbytes`` exceed :func:`available_memory`, before it is mapped or read.

    Raises:
        ValueError: too large (naming ``source`` and both numbers, and how to override).
    """
    avail = available_memory()
    if avail is None:
        return
    have, where = avail
    if nbytes > have:
        raise ValueError(
            f"{source}: {what} take {_size(nbytes)} ({nbytes} bytes), more than the {_size(have)} ({have} bytes) of "
            f"memory available ({where}); set {MEMORY_ENV}=unlimited to load it anyway"
        )


def memory_plan(
    path: str | os.PathLike[str],
    *,
    dtype: DType = DType.float32,
    quantized_layout: str | None = None,
    policy: Any = None,
    kv_tokens: int = KV_CHECK_TOKENS,
) -> dict[str, Any] | None:
    """The memory a model will take, from headers alone (no tensor data is read).

    For a GGUF file: its header (tensor types and shapes, the model's metadata); for a Hugging
    Face directory: ``config.json`` and the safetensors headers. Quantized GGUF tensors count in
    the run-time layout ``quantized_layout`` (None: the backend policy's, e.g. ``"unpacked"``
    int8 values on AVX2, about 1.9x the file's Q4_0 bytes, and the file's own bytes for the
    encodings it reads in place, ``mapped_encodings``); float GGUF tensors as stored (F16/BF16
    widened to float32 where the policy does not keep them, ``keep_16bit_weights``);
    safetensors tensors in the dtype they load in (``dtype``: bfloat16 weights widened to float32
    take twice their file, or kept bfloat16 where the policy's ``keep_16bit_weights`` holds,
    :func:`~maxjax.models.checkpoint.float_weights_dtype`).

    Returns:
        ``{"file": bytes of the files, "weights": bytes of the weights in their run-time layout,
        "kv_cache": bytes of a batch-1 key and value cache of ``kv_tokens`` tokens in ``dtype``,
        "total": weights + kv_cache, "layout": the quantized layout counted, "kv_tokens"}``; None
        for a directory whose ``config.json`` or safetensors headers cannot be read (the loader's
        checks then name the fault). GGUF metadata that cannot be read counts no KV cache.

    Raises:
        ValueError: a GGUF tensor of a type maxjax cannot load (naming the tensor and its type),
            or a file whose header cannot be read.
    """
    import math

    import numpy as np

    from maxjax.backend import policy_for

    path = Path(path)
    layout = quantized_layout or policy_for(policy).quantized_layout
    item = np.dtype(dtype.to_numpy()).itemsize
    if path.is_dir():
        import json
        import struct

        try:
            from maxjax.models.checkpoint import float_weights_dtype

            files = sorted(path.glob("*.safetensors"))
            values, stored, blocks, head = 0, set(), set(), 0
            for f in files:
                with open(f, "rb") as fh:
                    (n,) = struct.unpack("<Q", fh.read(8))
                    header = json.loads(fh.read(min(n, 100 << 20)))
                for name, info in header.items():
                    if name == "__metadata__":
                        continue
                    values += math.prod(int(d) for d in info["shape"])
                    stored.add(info["dtype"])
                    if name.endswith(".self_attn.k_proj.weight"):  # the KV cache from the tensors (config.json is checked later)
                        blocks.add(name)
                        head = int(info["shape"][0])
            weights = values * np.dtype(float_weights_dtype(stored, dtype, policy).to_numpy()).itemsize
            layers, kv = len(blocks), 1
            file_bytes = sum(os.path.getsize(f) for f in files)
        except Exception:  # a broken config or header: the loader's own checks say what is wrong
            return None
    else:
        from maxjax.graph.weights.gguf import GGUF_PLAIN_DTYPES, open_gguf

        reader, _ = open_gguf(path)
        weights = 0
        mapped = set(policy_for(policy).mapped_encodings) if quantized_layout is None else set()
        for t in reader.tensors:
            own = "mapped" if getattr(t.tensor_type, "name", None) in mapped else layout  # read in place: the file's bytes
            nbytes = _gguf_runtime_bytes(str(path), t, own, GGUF_PLAIN_DTYPES, policy_for(policy).keep_16bit_weights)
            weights += nbytes
        # the KV cache from the tensors themselves (metadata is checked later and may lie): one
        # key and one value row of attn_k's rows (KV heads x head size) per block present
        blocks = {t.name.split(".")[1] for t in reader.tensors if t.name.startswith("blk.") and t.name.endswith(".attn_k.weight")}
        k_rows = [int(t.shape.tolist()[-1]) for t in reader.tensors if t.name == "blk.0.attn_k.weight"]
        layers, kv, head = len(blocks), 1, (k_rows[0] if k_rows else 0)
        file_bytes = os.path.getsize(path)
    kv_bytes = 2 * layers * kv * head * int(kv_tokens) * item
    return {"file": file_bytes, "weights": weights, "kv_cache": kv_bytes, "total": weights + kv_bytes, "layout": layout,
            "kv_tokens": int(kv_tokens)}  # fmt: skip


_RUNTIME_BYTES: dict[tuple[Any, ...], int] = {}  # (encoding, layout) -> bytes of 4096 values


def _gguf_runtime_bytes(source: str, t: Any, layout: str, plain: dict, keep_16bit: bool = True) -> int:
    """Bytes of one GGUF tensor in memory at run time (its quantized layout, or float dtype:
    F16/BF16 as stored where ``keep_16bit``, the policy's ``keep_16bit_weights``, else float32)."""
    import math

    import jax
    import numpy as np

    from maxjax.graph.quantization import QuantizationEncoding, to_layout

    logical = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type in plain:
        size = np.dtype(plain[t.tensor_type].to_numpy()).itemsize
        if t.tensor_type.name in ("F16", "BF16") and not keep_16bit:  # widened at load
            size = 4
        return math.prod(logical) * size
    try:
        enc = QuantizationEncoding.from_gguf(t.tensor_type)
    except ValueError:
        supported = [e.value for e in QuantizationEncoding if e.is_gguf] + [k.name for k in plain]
        raise ValueError(
            f"{source}: tensor {t.name!r} uses GGML type {t.tensor_type.name}, which maxjax cannot load "
            f"(supported: {', '.join(supported)}); nothing was loaded"
        ) from None
    numel = math.prod(logical)
    key = (enc, layout)
    if key not in _RUNTIME_BYTES:  # bytes per value of the layout (values and per-block scales): from one small block
        sample = tuple(int(d) for d in enc.packed_shape((16, 256)))  # 16 rows: a tile of the tiles layout
        try:
            value = jax.eval_shape(lambda p: to_layout(layout, enc, p), jax.ShapeDtypeStruct(sample, np.uint8))
            _RUNTIME_BYTES[key] = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(value))
        except Exception:  # a layout that cannot take this encoding: count the file's bytes
            _RUNTIME_BYTES[key] = math.prod(sample)
    return -(-numel * _RUNTIME_BYTES[key] // 4096)


def check_memory_plan(plan: dict[str, Any] | None, source: str) -> None:
    """Refuses a model whose :func:`memory_plan` total exceeds :func:`available_memory`.

    Raises:
        ValueError: too large: one line with the file size, the run-time layout's bytes, the KV
            cache's bytes and the memory available (and where that number comes from).
    """
    avail = available_memory()
    if avail is None or plan is None:
        return
    have, where = avail
    if plan["total"] > have:
        raise ValueError(
            f"{source}: does not fit in memory: file {_size(plan['file'])}, weights in their run-time layout "
            f"({plan['layout']} for quantized tensors) {_size(plan['weights'])}, KV cache for {plan['kv_tokens']} tokens "
            f"{_size(plan['kv_cache'])}: {_size(plan['total'])} ({plan['total']} bytes) needed, {_size(have)} ({have} bytes) "
            f"available ({where}); nothing was loaded. Set {MEMORY_ENV}=unlimited to load it anyway"
        )


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """The file or directory for ``model``: None (the bundled SmolLM2 GGUF), a GGUF file, a model
    directory, or a Hugging Face repo id found in the local Hugging Face cache.

    Raises:
        FileNotFoundError: nothing by that name (the message says where it looked).
    """
    from maxjax._bundled import smollm2_gguf_path

    if model is None:
        return smollm2_gguf_path()
    p = Path(model).expanduser()
    if p.exists():
        return p
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
        repo = hub / ("models--" + text.replace("/", "--"))
        snapshots = sorted((repo / "snapshots").glob("*"), key=lambda s: s.stat().st_mtime) if repo.is_dir() else []
        for snap in reversed(snapshots):
            if (snap / "config.json").exists() or list(snap.glob("*.gguf")):
                return snap
        raise FileNotFoundError(f"model {text!r}: not a file or directory, and not in the Hugging Face cache at {hub}")
    raise FileNotFoundError(f"model {text!r}: no such file or directory")


def load_model(
    model: str | os.PathLike[str] | None = None,
    *,
    dtype: DType = DType.float32,
    progress: bool = False,
    quantized_layout: str | None = None,
    policy: Any = None,
    mesh: Any = None,
    mesh_axes: tuple[str, str] = ("dp", "tp"),
    arithmetic: str = "auto",
) -> CausalLM:
    """Loads a model for generation: a GGUF file, a Hugging Face directory (or repo id in the local
    cache), or with no argument the bundled SmolLM2-135M-Instruct (Q4_1 GGUF).

    ``dtype``: the activations' and KV cache's DType (float32, MAX's default, or bfloat16), and
    that of a Hugging Face checkpoint's float weights: a bfloat16 file loaded in bfloat16 keeps
    its weights as they are (half the memory of float32; float32 files round to it on read); a
    GGUF's quantized weights stay packed and its float tensors float32.

    ``arithmetic``: ``"int8"`` runs a GGUF-quantized model's products of 16 rows and more (the
    policy's ``int8_min_rows``) as int8 dots, in the ``int8`` quantized layout (see
    :class:`~maxjax.graph.quantization.Int8Array`; not bit-identical to the file); ``"q8_0"``
    multiplies the file's quantized values by activations rounded to Q8_0 blocks, llama.cpp's and
    MAX's CPU arithmetic (the policy's ``q8_activations``: integer dots in maxjax's CPU kernel,
    faster at batch 1; a row's tokens may then change with the rows decoded beside it, as a
    rounding step amplifies the float32 differences between paths); ``"float32"`` multiplies the
    file's values exactly with float32 activations; ``"auto"`` (default) is the backend policy's
    ``arithmetic`` (float32 on every platform for now).

    ``quantized_layout`` is how a GGUF's quantized weights are kept in memory (see
    :class:`CausalLM`; None: the backend policy's choice for the platform; ``"tiles"``: Q4_0 copied
    at load into tiles of 16 rows for integer dots, :class:`~maxjax.graph.quantization.TiledArray`,
    which runs ``"q8_0"`` arithmetic), ``policy`` the
    :class:`~maxjax.backend.BackendPolicy` (None: the default backend's); ``mesh`` a
    ``jax.sharding.Mesh`` to run tensor parallel over its ``mesh_axes[1]`` axis and data parallel
    over ``mesh_axes[0]`` (see :class:`CausalLM`).

    Python's cyclic garbage collector is paused while the model loads, and restored as it was
    after: a load allocates hundreds of thousands of long-lived objects (a Llama 3 tokenizer's
    400k tokens and merges, the traced graph), and a full collection falling inside a load cost
    0.08-0.09 s of it (a Llama-3.2-1B-shaped Q4_0 file on a 2-core Zen 5 EPYC: 0.39-0.48 -> 0.39-0.40
    s, alternating runs; the first generation no slower).

    Nothing is mapped, built or loaded before the files are known to fit in the memory available
    (:func:`check_fits_in_memory`); then, from the headers alone, the weights in their run-time
    layout plus a KV cache of :data:`KV_CHECK_TOKENS` tokens must fit too (:func:`memory_plan`;
    a tensor of an unsupported type is named first), and the checkpoint's metadata is checked
    against its tensors (see :mod:`maxjax.models.llama.checks`).

    Raises:
        FileNotFoundError: no such model.
        ValueError: an unknown format or an unsupported architecture; files larger than the memory
            available (with the file size, run-time layout and KV cache bytes and the memory
            available); a tensor of an unsupported type (naming it); metadata, a ``config.json`` or
            tensors that are wrong (one line naming the file and the key or tensor); an unknown
            ``arithmetic``, or ``"int8"`` with another ``quantized_layout``, on a model without
            quantized weights, or on a mesh (saying what runs instead); ``"q8_0"`` (or the
            ``tiles`` layout) with the ``int8`` layout or on a model without GGUF-quantized
            weights; the ``tiles`` layout with ``"float32"`` or ``"int8"`` arithmetic.
    """
    with _collector_paused():
        return _load_model(model, dtype, progress, quantized_layout, policy, mesh, mesh_axes, arithmetic)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, and as it was after (see :func:`load_model`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load_model(model: Any, dtype: DType, progress: Any, quantized_layout: str | None, policy: Any, mesh: Any, mesh_axes: Any,
                arithmetic: str) -> CausalLM:  # fmt: skip
    """:func:`load_model`'s body."""
    quantized_layout = _layout_for_arithmetic(arithmetic, quantized_layout, policy, mesh, model)
    policy = _policy_for_arithmetic(arithmetic, policy, quantized_layout)
    path = resolve_model_path(model)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists():
            _check_size(sorted(path.glob("*.safetensors")), str(path), mesh)
            if mesh is None:
                check_memory_plan(memory_plan(path, dtype=dtype, quantized_layout=quantized_layout, policy=policy), str(path))
            return CausalLM.from_pretrained_dir(path, dtype, progress, quantized_layout, policy, mesh, mesh_axes)
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            raise ValueError(f"{path}: neither a Hugging Face model directory (config.json) nor a folder with one .gguf")
    from maxjax.graph.weights import WeightsFormat, weights_format

    fmt = weights_format([path])
    if fmt is not WeightsFormat.gguf:
        raise ValueError(f"{path}: a {fmt.value} file alone cannot be generated from; pass its model directory")
    _check_size([path], str(path), mesh)  # the file alone, before it is opened
    if mesh is None:  # from the header: the run-time layout and the KV cache, before any tensor is read
        check_memory_plan(memory_plan(path, dtype=dtype, quantized_layout=quantized_layout, policy=policy), str(path))
    return CausalLM.from_gguf(path, dtype, progress, quantized_layout, policy, mesh, mesh_axes)


ARITHMETIC = ("auto", "float32", "int8", "q8_0")


def _layout_for_arithmetic(arithmetic: str, quantized_layout: str | None, policy: Any, mesh: Any, model: Any) -> str | None:
    """The quantized layout ``arithmetic`` asks for (see :func:`load_model`)."""
    from maxjax.backend import policy_for

    if arithmetic not in ARITHMETIC:
        raise ValueError(f"arithmetic must be one of {', '.join(ARITHMETIC)}, got {arithmetic!r}")
    if _tiles(quantized_layout, policy):  # integer dots with Q8_0 activations, by definition
        if arithmetic not in ("auto", "q8_0"):
            raise ValueError(f"quantized_layout='tiles' multiplies Q8_0 activations (arithmetic='q8_0'), not arithmetic={arithmetic!r}")
        from maxjax.backend import kernels

        if policy_for(policy).platform == "cpu" and not (kernels.available() and kernels.tiles_built()):
            why = kernels.unavailable_reason() or "the kernels here are built without AVX-512"
            raise ValueError(f"quantized_layout='tiles' needs maxjax's tiles kernel (AVX-512 CPUs): {why}; 'nibbles' or 'mapped' run here")
        _require_gguf("q8_0", model)
        return quantized_layout
    if arithmetic == "auto":
        if quantized_layout is not None or policy_for(policy).arithmetic == "float32":
            return quantized_layout  # an explicit layout says it (int8 included)
        arithmetic = policy_for(policy).arithmetic
    if arithmetic in ("float32", "q8_0"):
        if quantized_layout == "int8":
            kept = "keeps the file's values exactly" if arithmetic == "float32" else "multiplies the file's values"
            raise ValueError(f"arithmetic={arithmetic!r} {kept}; quantized_layout='int8' requantizes them")
        if arithmetic == "q8_0":
            _require_gguf(arithmetic, model)
        return quantized_layout
    if quantized_layout not in (None, "int8"):
        raise ValueError(f"arithmetic='int8' needs quantized_layout='int8', got {quantized_layout!r}")
    if mesh is not None:
        raise ValueError("arithmetic='int8' is not supported on a device mesh yet; float32 runs there (arithmetic='float32')")
    if not policy_for(policy).int8_min_rows:
        raise ValueError(f"arithmetic='int8': the {policy_for(policy).platform} policy has no int8 dots; float32 runs there")
    _require_gguf(arithmetic, model)
    return "int8"


def _tiles(quantized_layout: str | None, policy: Any) -> bool:
    """Whether the model is asked for in the ``tiles`` layout: by ``quantized_layout``, or where
    that is None by the policy's."""
    from maxjax.backend import policy_for

    return (quantized_layout or policy_for(policy).quantized_layout) == "tiles"


def _require_gguf(arithmetic: str, model: Any) -> None:
    """Raises for ``arithmetic`` (``"int8"``, ``"q8_0"``) on a Hugging Face model of float weights."""
    path = Path(resolve_model_path(model))
    if path.is_dir() and (path / "config.json").exists():
        raise ValueError(f"arithmetic={arithmetic!r} needs a GGUF-quantized model; {path} has float weights (arithmetic='float32' runs it)")


def _policy_for_arithmetic(arithmetic: str, policy: Any, quantized_layout: str | None = None) -> Any:
    """``policy`` (None: the default backend's) as ``arithmetic`` runs it: ``"q8_0"`` (or the
    ``tiles`` layout) with ``q8_activations`` on, ``"float32"`` with it off; ``policy`` itself
    otherwise."""
    import dataclasses

    from maxjax.backend import policy_for

    if _tiles(quantized_layout, policy):  # its arithmetic, for every other quantized weight too
        arithmetic = "q8_0"
    want = {"q8_0": True, "float32": False}.get(arithmetic)
    if want is not None and policy_for(policy).q8_activations != want:
        return dataclasses.replace(policy_for(policy), q8_activations=want)
    return policy


def _check_size(files: list[Path], source: str, mesh: Any) -> None:
    """The files' size against the memory available, before they are opened (on a mesh each
    process reads its own shards: its part)."""
    try:
        total = sum(os.path.getsize(f) for f in files)
    except OSError:  # the loader says what is wrong with the file
        return
    if mesh is not None:
        import jax

        total //= max(1, jax.process_count())
    check_fits_in_memory(total, source, "its files")
