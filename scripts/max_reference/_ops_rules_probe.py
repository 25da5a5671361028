"""What MAX 26.7 does with the rows of ``tests/ops_rules_cases.py`` (run with MAX's interpreter).

    ~/max267/bin/python scripts/max_reference/_ops_rules_probe.py [--maxjax] [--write]

Prints one line per case: its id, what the table expects, and what the library did (an exception
type and message, or the output type). ``--write`` also writes MAX's dtype-promotion table to
``tests/data/ops_rules_promotion.json`` (``{"lhs|rhs|op": dtype name or exception type}``).
``--maxjax`` runs the same rows on maxjax instead (to compare; never with ``--write``).
"""

from __future__ import annotations

import itertools
import json
import sys
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from ops_rules_cases import CASES, PROMOTION_DTYPES, PROMOTION_OPS, describe, parse_input  # noqa: E402

USE_MAXJAX = "--maxjax" in sys.argv
if USE_MAXJAX:
    sys.path.insert(0, str(ROOT))
    from maxjax.dtype import DType
    from maxjax.graph import DeviceRef, Dim, Graph, TensorType, ops
else:
    from max.dtype import DType
    from max.graph import DeviceRef, Dim, Graph, TensorType, ops

warnings.simplefilter("ignore")
M = types.SimpleNamespace(ops=ops, DType=DType, Dim=Dim, DeviceRef=DeviceRef)


def _type(spec: str) -> TensorType:
    dtype, shape, device = parse_input(spec)
    return TensorType(getattr(DType, dtype), shape, DeviceRef.GPU() if device == "gpu" else DeviceRef.CPU())


def run(name: str, inputs: tuple[str, ...], call) -> tuple[str, str]:
    try:
        with Graph(name, input_types=[_type(s) for s in inputs]) as g:
            out = call(M, *g.inputs)
            return "ok", describe(out)
    except (ValueError, TypeError, IndexError) as e:
        return type(e).__name__, str(e).splitlines()[0][:160] if str(e) else ""
    except Exception as e:  # anything else is worth seeing
        return type(e).__name__, str(e).splitlines()[0][:160] if str(e) else ""


SCALARS = ["1", "-1", "1.5", "True", "300", "70000", "16777217"]


def _binary(op: str):
    if op == "where":
        return lambda m, c, a, b: m.ops.where(c, a, b)
    if op == "max":
        return lambda m, a, b: m.ops.max(a, b)
    return lambda m, a, b: getattr(m.ops, op)(a, b)


def promotion_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for op in PROMOTION_OPS:
        f = _binary(op)
        pre = ("bool[2]",) if op == "where" else ()
        for lhs, rhs in itertools.product(PROMOTION_DTYPES, PROMOTION_DTYPES):
            res, msg = run("p", (*pre, f"{lhs}[2]", f"{rhs}[2]"), f)
            table[f"{lhs}|{rhs}|{op}"] = res if res != "ok" else msg.split("[")[0]
        for t, s in itertools.product(PROMOTION_DTYPES, SCALARS):
            v = eval(s)
            if op == "where":
                g1 = lambda m, c, a, v=v: m.ops.where(c, a, v)  # noqa: E731
                g2 = lambda m, c, a, v=v: m.ops.where(c, v, a)  # noqa: E731
            else:
                g1 = lambda m, a, v=v, f=f: f(m, a, v)  # noqa: E731
                g2 = lambda m, a, v=v, f=f: f(m, v, a)  # noqa: E731
            for key, g in ((f"{t}|{s}|{op}", g1), (f"{s}|{t}|{op}", g2)):
                res, msg = run("p", (*pre, f"{t}[2]"), g)
                table[key] = res if res != "ok" else msg.split("[")[0]
    return table


def main() -> None:
    for c in CASES:
        res, msg = run(c.id, c.inputs, c.call)
        got = res if res != "ok" else f"ok {msg}"
        want = c.expected if c.expected != "ok" else f"ok {c.out}"
        flag = "  " if got == want else "!!"
        print(f"{flag} {c.id:32s} want {want:22s} got {res:12s} {msg}")
    if "--promotion" in sys.argv or "--write" in sys.argv:
        table = promotion_table()
        if "--write" in sys.argv and not USE_MAXJAX:
            out = ROOT / "tests" / "data" / "ops_rules_promotion.json"
            out.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
            print(f"wrote {len(table)} rows to {out}")
        else:
            print(json.dumps(table, indent=0))


if __name__ == "__main__":
    main()
