#!/usr/bin/env python3
"""The MAX 26.7 API coverage table: which of MAX's public names maxjax has, with MAX's parameters.

Reads MAX 26.7's inventory (``../shared/max-26.7-inventory.json`` beside the checkout, or
``shared/`` in it, or beside the main checkout of a git worktree; ``--inventory PATH``): for each MAX module (``nn``, ``nn.attention``, ...,
``graph``, ``graph.ops``, ``driver``, ``engine``) a dict of public name -> signature string (as
``str(inspect.signature(...))`` printed it, ``self`` included for classes; ``?`` where unknown).
Each name is looked up in the same maxjax module (``max.nn.X`` -> ``maxjax.nn.X``) and reported as

- ``present``: there, with MAX's parameter names in MAX's order. Presence only for ``?``
  signatures, for MAX's generic ones (``(self, *args, **kwargs)``: natives, Protocols, Enums)
  and for maxjax Enums; private parameters (``_name``) are left out on both sides;
- ``differs``: there, with other parameters (the missing / extra / reordered names are listed);
  allowed only with a reason in :data:`REASONS` (shown in the table);
- ``absent``: not there; the reason comes from :data:`REASONS`.

Usage::

    python scripts/max_api_table.py            # prints the Markdown section and the counts
    python scripts/max_api_table.py --write    # rewrites README.md between the markers
    python scripts/max_api_table.py --check    # exit 1 when README.md's section is stale

``tests/test_max_api_coverage.py`` checks that README.md's section equals what this script makes,
that every absent name has a reason, and that every present name has MAX's parameter names or a
reason for the difference.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN = "<!-- max-api-table:begin -->"
END = "<!-- max-api-table:end -->"

# -- reasons -----------------------------------------------------------------------------------
# The one hand-kept dict: "module.Name" -> why the name is absent from maxjax, or why a present
# name's parameters differ from MAX's. A key "*.Name" gives the reason for that name in every
# module (re-exports). Shared texts first.
_MESH = "multi-device class of MAX's per-device style; one maxjax layer on a jax.sharding.Mesh (NamedSharding) does this"
_DEV = "MAX driver runtime API (virtual devices, launch traces, device queues/events, pinned copies, peer access); JAX's runtime manages devices and transfers"
_ENGINE = "MAX engine compile-artifact API (MEF files, compile-only models, debug/log config); maxjax compiles with jax.jit and keeps nothing on disk"
_MLIR = "MAX graph-compiler internal (MLIR module/types, Mojo kernel libraries, custom extensions); maxjax's graph is a DAG of jnp ops"
_QUANT = "quantized-format layer (GPTQ / FP8 / FP4 scales) not built; maxjax's quantized path is GGUF blocks (QuantizedArray)"
_KV = "paged / ragged KV-cache machinery of MAX's serving engine; maxjax's engine keeps its own dense cache (maxjax.serve)"
_TODO = "not built yet (issue 21: MAX's layer library)"
_SPEC = "speculative-decoding sampler over MAX's fused GPU sampling kernels (seeded top-k/top-p); not built"
_REEXPORT = "a name MAX's module imports from elsewhere (re-export); maxjax has it at its home module"


def _each(names: str, reason: str, module: str) -> dict[str, str]:
    return {f"{module}.{n}": reason for n in names.split()}


REASONS: dict[str, str] = {
    # re-exports that MAX's module namespaces carry
    **{f"*.{n}": _REEXPORT for n in "DType DeviceRef Dim TensorType TensorValue BufferValue Weight Graph Module Shardable "
       "ShardingStrategy QuantizationEncoding QuantizationConfig Segment Allreduce Operation InterpolationMode".split()},
    # max.nn (and the same names in its submodules)
    **_each("split_batch split_batch_replicated", _MESH, "nn"),
    **_each("MoEQuantized", _QUANT, "nn"),
    **_each("HyperConnection", _TODO, "nn"),
    "nn.RMSNorm": "maxjax adds device= (MAX 26.7 puts the weight on the CPU and has no device argument)",
    # max.nn.attention
    # max.nn.conv, embedding, linear, norm, rotary_embedding, transformer
    "nn.norm.RMSNorm": "see max.nn.RMSNorm",
    **_each("LogitsPostprocessMixin",
            _TODO, "nn.transformer"),
    # max.nn.sampling
    "nn.sampling.stochastic_acceptance_sampler": _SPEC,
    # max.nn.kv_cache
    **_each("AttnKey AttnKeyInterface BatchCharacteristics CacheLeafParamInterface compute_max_seq_len_fitting_in_cache compute_num_device_blocks estimated_memory_size HostStagingAlloc KVCacheAssignments KVCacheBuffer KVCacheBufferInterface KVCacheGroupId KVCacheMemory KVConnectorConfigInterface KVConnectorType KVHashAlgo KVLeafRegion MHAAttnKey MLAAttnKey MLAKVCacheParams MSAAttnKey MSAKVCacheParams MultiKVCacheBuffer MultiKVCacheParams PACKED_PAGE_STRIDE packed_page_stride padded_lut_cols PagedCacheValues PagedKVLeafRegion recurrent_leaf recurrent_leaves RecurrentKVLeafRegion RecurrentLeafInputs RecurrentStateBuffer RecurrentStateInputsPerDevice RecurrentStateParams RecurrentStateRegion ScratchKVLeafRegion spec_decode_cache_slack", _KV, "nn.kv_cache"),
    # max.driver
    # max.dtype
    "dtype.finfo": "not built yet (dtype coverage); DType.finfo-style limits come from jnp.finfo",
    # max.engine
    **_each("MefStore", _ENGINE, "engine"),
    # max.graph
    **_each("GraphBlock GraphDebugConfig ProfileScopeColor", _MLIR, "graph"),
    "graph.AlgebraicDim": "maxjax's AlgebraicDim holds a symbolic expression (expr=) where MAX's holds an MLIR attribute (attr=)",
    # max.graph.ops
    **_each("allgather_rms_norm_quant_mxfp6 allgather_rms_norm_quant_mxfp8", "allgather + RMSNorm + MXFP6/MXFP8 quantization in one GPU kernel; maxjax has no MX block-scaled float formats", "graph.ops"),
    "graph.ops.side_stream": _DEV,
    "graph.ops.assert_same_device": _DEV,
    # max.graph.weights
    "graph.weights.GGUFWeights": "maxjax adds zero_copy / lazy (memory-mapped, loaded on first use)",
    "graph.weights.SafetensorWeights": "maxjax adds zero_copy; MAX's private _st_* maps are internal",
    "graph.weights.WeightData": "maxjax adds original_shape (the shape before a quantized layout's packing)",
    "graph.weights.load_weights": "maxjax passes **kwargs (zero_copy, lazy) on to the format's class",
}

# -- signatures --------------------------------------------------------------------------------
def split_top_level(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets ``()[]{}<>`` and quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and depth:
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def param_names(signature: str) -> list[str] | None:
    """Parameter names of a signature string ``"(self, a: int = 1, *, b=2) -> None"``.

    ``self`` (first) and the ``*`` / ``/`` markers are dropped; ``*args``/``**kwargs`` keep their
    stars. Returns None for ``?`` (unknown signature).
    """
    s = signature.strip()
    if s == "?" or not s.startswith("("):
        return None
    depth, quote, end = 0, None, None
    for i, ch in enumerate(s):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                end = i
                break
    inner = s[1:end]
    names = []
    for p in split_top_level(inner):
        if p in ("*", "/"):
            continue
        name = p
        for stop in (":", "="):
            name = name.split(stop, 1)[0]
        names.append(name.strip())
    if names and names[0] == "self":
        names = names[1:]
    if names in (["*args", "**kwargs"], ["*args", "**kwds"]) and s.startswith("(self"):
        return None  # object's / Enum's / a native class's generic signature: nothing to compare
    return [n for n in names if not n.startswith("_") or n.startswith("*")]


def maxjax_param_names(obj: object) -> list[str] | None:
    """maxjax's parameter names of ``obj`` in the inventory's form (None when it has none)."""
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return None  # calling an Enum looks a member up: its signature is Enum's own
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            out.append("*" + p.name)
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            out.append("**" + p.name)
        elif not p.name.startswith("_"):
            out.append(p.name)
    if out and out[0] == "self":
        out = out[1:]
    return out


# -- the table ---------------------------------------------------------------------------------
@dataclass
class Row:
    module: str
    name: str
    status: str  # "present" | "differs" | "absent"
    note: str
    has_reason: bool


def _diff(max_names: list[str], ours: list[str]) -> str:
    missing = [n for n in max_names if n not in ours]
    extra = [n for n in ours if n not in max_names]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(f"`{n}`" for n in missing))
    if extra:
        parts.append("extra " + ", ".join(f"`{n}`" for n in extra))
    if not parts:
        parts.append("order " + ", ".join(f"`{n}`" for n in ours) + " (MAX: " + ", ".join(f"`{n}`" for n in max_names) + ")")
    return "; ".join(parts)


def reason_for(module: str, name: str) -> str | None:
    """The reason in :data:`REASONS` for ``module.name`` (its own key, else ``*.name``)."""
    return REASONS.get(f"{module}.{name}") or REASONS.get(f"*.{name}")


def rows_for(module: str, names: dict[str, str]) -> list[Row]:
    try:
        mod = importlib.import_module(f"maxjax.{module}")
    except ImportError:
        mod = None
    rows = []
    for name, sig in sorted(names.items(), key=lambda kv: kv[0].lower()):
        key = f"{module}.{name}"
        reason = reason_for(module, name)
        obj = getattr(mod, name, None) if mod is not None else None
        if obj is None:
            rows.append(Row(module, name, "absent", reason or "", reason is not None))
            continue
        want = param_names(sig)
        if want is None:
            rows.append(Row(module, name, "present", "presence only (MAX's signature is unknown or generic)", True))
            continue
        ours = maxjax_param_names(obj)
        if ours is None or ours == want:
            rows.append(Row(module, name, "present", "", True))
            continue
        note = _diff(want, ours)
        if reason:
            note += f" ({reason})"
        rows.append(Row(module, name, "differs", note, reason is not None))
    return rows


def _checkout_dirs() -> list[Path]:
    """Where ``shared/`` may sit: beside the repo, in it, and beside the main checkout when this
    is a git worktree (its ``.git`` file points into ``<main>/.git/worktrees/<name>``)."""
    out = [ROOT.parent, ROOT]
    git = ROOT / ".git"
    if git.is_file() and git.read_text().startswith("gitdir:"):
        main = Path(git.read_text().split(":", 1)[1].strip()).parent.parent.parent
        out.append(main.parent)
    return out


def stale_reasons(rows: list[Row]) -> list[str]:
    """REASONS keys (exact ``module.Name`` ones) for names now present with MAX's parameters."""
    return [f"{r.module}.{r.name}" for r in rows if r.status == "present" and f"{r.module}.{r.name}" in REASONS]


def load_inventory(path: Path | None = None) -> dict[str, dict[str, str]]:
    """The inventory dict; default path ``../shared/`` beside the repo, then ``shared/`` in it.

    Raises:
        FileNotFoundError: no inventory at any of those paths (names them).
    """
    candidates = [path] if path else [d / "shared" / "max-26.7-inventory.json" for d in _checkout_dirs()]
    for p in candidates:
        if p.exists():
            return json.loads(p.read_text())
    raise FileNotFoundError(f"MAX 26.7 inventory not found at {[str(p) for p in candidates]}")


def all_rows(inventory: dict[str, dict[str, str]]) -> list[Row]:
    out = []
    for module in sorted(inventory, key=lambda m: (m.split(".")[0] != "nn", m)):
        out.extend(rows_for(module, inventory[module]))
    return out


def counts(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """``{module: (present incl. differing, total)}`` in table order."""
    out: dict[str, list[int]] = {}
    for r in rows:
        c = out.setdefault(r.module, [0, 0])
        c[1] += 1
        c[0] += r.status != "absent"
    return {m: (a, b) for m, (a, b) in out.items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[Row]) -> str:
    """The README section (between the markers): summary counts, then one table per module."""
    lines = [
        "Generated by `python scripts/max_api_table.py --write` from MAX 26.7's inventory of public names",
        "(`shared/max-26.7-inventory.json`). *present*: in the same maxjax module with MAX's parameter names;",
        "*differs*: present with other parameters (listed, with the reason); *absent*: with the reason.",
        "",
    ]
    for module, (have, total) in counts(rows).items():
        differ = sum(1 for r in rows if r.module == module and r.status == "differs")
        lines.append(f"- `max.{module}`: {have} of {total} present" + (f" ({differ} with other parameters)" if differ else ""))
    for module in counts(rows):
        lines += ["", f"### `max.{module}`", "", "| name | status | notes |", "| --- | --- | --- |"]
        for r in rows:
            if r.module == module:
                lines.append(f"| `{r.name}` | {r.status} | {_cell(r.note)} |")
    return "\n".join(lines) + "\n"


def readme_section(text: str) -> str | None:
    """The text between the markers in ``text`` (None when the markers are missing)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_readme(section: str) -> None:
    """Replaces README.md's text between the markers with ``section``.

    Raises:
        SystemExit: README.md has no markers.
    """
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(f"{head}{BEGIN}\n{section}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=None)
    parser.add_argument("--write", action="store_true", help="rewrite README.md's section")
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's section is stale")
    args = parser.parse_args(argv)
    rows = all_rows(load_inventory(args.inventory))
    section = markdown(rows)
    for module, (have, total) in counts(rows).items():
        print(f"max.{module}: {have} of {total} present", file=sys.stderr)
    unexplained = [f"{r.module}.{r.name} ({r.status})" for r in rows if not r.has_reason]
    for key in stale_reasons(rows):
        print(f"stale reason in REASONS: {key} is present with MAX's parameter names", file=sys.stderr)
    if unexplained:
        print("no reason in REASONS for: " + ", ".join(unexplained), file=sys.stderr)
    if args.write:
        write_readme(section)
    elif args.check:
        if readme_section(README.read_text()) != section:
            print("README.md's API table is stale: run python scripts/max_api_table.py --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
