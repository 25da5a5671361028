#!/usr/bin/env python3
"""Writes reference outputs of MAX 26.7 itself, for maxjax's tests to compare against.

Run it with MAX's own interpreter (a venv of its own; MAX is never a runtime or test dependency
of maxjax)::

    python3 -m venv ~/max267 && ~/max267/bin/pip install max==26.7.0
    ~/max267/bin/python scripts/reference_max.py norm rope      # or no area: every area

Each area is a module ``scripts/max_reference/<area>.py`` with a function
``build() -> dict[str, numpy.ndarray]`` that builds MAX layers or graphs on fixed inputs and
weights and returns the arrays to keep (inputs, weights and MAX's outputs, named by the area's own
convention). They are written to ``tests/data/max_reference/<area>.npz`` (compressed, small), and
``tests/max_reference.py`` reads them back.

Raises:
    SystemExit: MAX is not importable (run with MAX's interpreter), or an unknown area.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
AREAS = HERE / "max_reference"
OUT = HERE.parent / "tests" / "data" / "max_reference"


def _areas() -> list[str]:
    return sorted(p.stem for p in AREAS.glob("*.py") if not p.stem.startswith("_"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("areas", nargs="*", help=f"areas to write (default: all of {_areas()})")
    args = parser.parse_args(argv)
    try:
        import max  # noqa: F401
        from importlib.metadata import version

        max_version = version("max")
    except ImportError:
        raise SystemExit("scripts/reference_max.py: MAX is not importable; run it with MAX 26.7's interpreter (~/max267/bin/python)")
    unknown = sorted(set(args.areas) - set(_areas()))
    if unknown:
        raise SystemExit(f"scripts/reference_max.py: unknown area(s) {unknown}; known: {_areas()}")
    OUT.mkdir(parents=True, exist_ok=True)
    for area in args.areas or _areas():
        spec = importlib.util.spec_from_file_location(f"max_reference_{area}", AREAS / f"{area}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        arrays = {k: np.asarray(v) for k, v in module.build().items()}
        arrays["__max_version__"] = np.asarray(max_version)
        path = OUT / f"{area}.npz"
        np.savez_compressed(path, **arrays)
        print(f"{path.relative_to(HERE.parent)}: {len(arrays) - 1} arrays, {path.stat().st_size / 1e3:.1f} kB", file=sys.stderr)


if __name__ == "__main__":
    main()
