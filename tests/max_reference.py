"""Reference outputs of MAX 26.7 itself (``scripts/reference_max.py`` writes them; committed, small)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "max_reference"


def load(area: str) -> dict[str, np.ndarray]:
    """The arrays of ``tests/data/max_reference/<area>.npz`` (written with MAX 26.7.0).

    Raises:
        FileNotFoundError: the area's file is missing (run ``scripts/reference_max.py <area>``).
    """
    path = DATA / f"{area}.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no MAX reference for {area!r}; run ~/max267/bin/python scripts/reference_max.py {area}")
    with np.load(path) as f:
        out = {k: f[k] for k in f.files}
    version = str(out.pop("__max_version__"))
    assert version == "26.7.0", f"{path}: written with MAX {version}, expected 26.7.0"
    return out
