"""What an orbax checkpoint written by ``save_state`` says about its arrays, checked.

:func:`read_metadata` reads the two metadata files of a checkpoint directory and says which one is
damaged, and how, when they cannot be used:

- ``_CHECKPOINT_METADATA`` (orbax's step metadata, JSON) holds the ``custom_metadata``: maxjax's
  entry gives each quantized array's encoding and float shape and each array's SHA-256;
- ``_METADATA`` (the tree metadata, JSON), read by orbax with the arrays' own metadata (tensorstore),
  gives each array's shape and dtype;
- ``array_metadatas/process_<i>`` (JSON, one per writing process), which orbax reads when it
  restores, are checked to be JSON objects here, so that a damaged one is named before a restore.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.weights._orbax_calls import one_line, quiet_reads
from maxjax.graph.weights.errors import WeightsFileError

__all__ = ["CheckpointMetadata", "read_metadata", "META_KEY", "STEP_METADATA", "TREE_METADATA"]

META_KEY = "maxjax"  # maxjax's entry in the custom metadata
STEP_METADATA = "_CHECKPOINT_METADATA"
TREE_METADATA = "_METADATA"
ARRAY_METADATAS = "array_metadatas"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENCODINGS = {e.value for e in QuantizationEncoding}


@dataclass
class CheckpointMetadata:
    """Attributes:
    arrays: ``{name: orbax ArrayMetadata}`` (``.shape``, ``.dtype``), in the checkpoint's order.
    quantization: ``{name: {"encoding": "Q4_0", "original_shape": [rows, cols] or None}}``.
    sha256: ``{name: hex digest}`` (empty for checkpoints written before maxjax kept them).
    custom: the rest of the custom metadata (without maxjax's entry).
    """

    arrays: dict[str, Any]
    quantization: dict[str, dict[str, Any]] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)


def read_metadata(path: str) -> CheckpointMetadata:
    """The checked metadata of the checkpoint directory ``path``.

    Raises:
        WeightsFileError: a metadata file is missing, not JSON or of the wrong structure, or
            orbax/tensorstore cannot read an array's metadata (naming the file and the defect);
            the checkpoint is not a flat ``{name: array}`` tree; maxjax's entry is damaged (naming
            the array).
    """
    custom = _custom_metadata(path)
    arrays = _arrays(path)
    _check_array_metadatas(path)
    step_file = os.path.join(path, STEP_METADATA)
    entry = custom.get(META_KEY)
    if entry is None:
        entry = {}
    if not isinstance(entry, Mapping):
        raise WeightsFileError(step_file, f"damaged: custom_metadata[{META_KEY!r}] is not an object")
    quant = entry.get("quantization") or {}
    sums = entry.get("sha256") or {}
    if not isinstance(quant, Mapping) or not isinstance(sums, Mapping):
        raise WeightsFileError(step_file, f"damaged: custom_metadata[{META_KEY!r}] holds a 'quantization' or 'sha256' that is not an object")
    for name, q in quant.items():
        problem = _quant_problem(q)
        if problem:
            raise WeightsFileError(step_file, f"damaged: the quantization entry of array {name!r} {problem}")
    for name, h in sums.items():
        if not isinstance(h, str) or not _HEX64.fullmatch(h):
            raise WeightsFileError(step_file, f"damaged: the SHA-256 of array {name!r} is {h!r}, not 64 hex digits")
    rest = {k: v for k, v in custom.items() if k != META_KEY}
    return CheckpointMetadata(arrays, {k: dict(v) for k, v in quant.items()}, dict(sums), rest)


def _quant_problem(q: Any) -> str | None:
    if not isinstance(q, Mapping):
        return f"is {q!r}, not an object"
    if q.get("encoding") not in _ENCODINGS:
        return f"names encoding {q.get('encoding')!r} (known: {', '.join(sorted(_ENCODINGS))})"
    shape = q.get("original_shape")
    if shape is not None and not (
        isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        return f"has original_shape {shape!r}, not a list of sizes"
    return None


def _custom_metadata(path: str) -> dict[str, Any]:
    """The ``custom_metadata`` object of ``_CHECKPOINT_METADATA`` (empty when there is none)."""
    step_file = os.path.join(path, STEP_METADATA)
    if not os.path.exists(step_file):
        return {}
    try:
        with open(step_file, "rb") as f:
            step = json.loads(f.read())
    except OSError as e:
        raise WeightsFileError(step_file, f"cannot read the orbax step metadata: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise WeightsFileError(step_file, f"damaged orbax step metadata: not valid JSON ({e})") from None
    if not isinstance(step, dict):
        raise WeightsFileError(step_file, f"damaged orbax step metadata: a JSON {type(step).__name__}, not an object")
    custom = step.get("custom_metadata")
    if custom is None:
        return {}
    if not isinstance(custom, dict):
        raise WeightsFileError(step_file, f"damaged orbax step metadata: custom_metadata is a {type(custom).__name__}, not an object")
    return custom


def _check_array_metadatas(path: str) -> None:
    folder = os.path.join(path, ARRAY_METADATAS)
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        file = os.path.join(folder, name)
        try:
            with open(file, "rb") as f:
                doc = json.loads(f.read())
        except OSError as e:
            raise WeightsFileError(file, f"cannot read the orbax array metadata: {e.strerror or e}") from None
        except ValueError as e:
            raise WeightsFileError(file, f"damaged orbax array metadata: not valid JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get(ARRAY_METADATAS), list):
            raise WeightsFileError(file, f"damaged orbax array metadata: not an object with an {ARRAY_METADATAS!r} list")


def _arrays(path: str) -> dict[str, Any]:
    """``{name: ArrayMetadata}`` from orbax's tree metadata and the arrays' own metadata."""
    import orbax.checkpoint as ocp
    from etils import epath

    tree_file = os.path.join(path, TREE_METADATA)
    if not os.path.exists(tree_file):
        raise WeightsFileError(path, f"damaged orbax checkpoint: its tree metadata file {TREE_METADATA} is missing")
    try:
        with quiet_reads():
            meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path))
    except ValueError as e:
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
            raise WeightsFileError(tree_file, f"damaged orbax tree metadata: not valid JSON ({e})") from None
        raise WeightsFileError(path, f"damaged orbax checkpoint: cannot read its arrays' metadata: {one_line(e)}") from None
    except (AttributeError, KeyError, TypeError, IndexError) as e:  # JSON of the wrong structure
        raise WeightsFileError(tree_file, f"damaged orbax tree metadata: unexpected structure ({one_line(e)})") from None
    except Exception as e:
        raise WeightsFileError(path, f"damaged orbax checkpoint: cannot read its metadata: {one_line(e)}") from None
    tree = getattr(meta, "tree", meta)
    if not isinstance(tree, Mapping) or not all(isinstance(k, str) for k in tree):
        raise WeightsFileError(path, "not a flat {name: array} checkpoint (as maxjax's save_state writes)")
    for name, m in tree.items():
        try:
            shape = tuple(int(d) for d in m.shape)
            np.dtype(m.dtype)
        except Exception:
            raise WeightsFileError(path, f"array {name!r} has no array metadata (shape and dtype): a {type(m).__name__}") from None
        if any(d < 0 for d in shape):
            raise WeightsFileError(path, f"array {name!r} has the shape {shape}")
    return dict(tree)
