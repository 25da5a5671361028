"""Run MAX 26.7's own Python tests against MAX and against maxjax (imports rewritten only).

The measure of issues 21 and 22: MAX's test files (modular/modular ``max/tests/``, kept OUTSIDE
this repository, e.g. ``/work/maxsuite/tests``) are copied to a scratch directory twice:

* as they are, and run with MAX 26.7's Python (``--max-python``);
* with the ``max`` package replaced by ``maxjax`` in import statements, and run with maxjax's
  Python (``--maxjax-python``) with ``PYTHONPATH`` at the tree being measured (``--tree``).

Each test file runs in its own pytest process (``--junitxml``; per-test timeout through
pytest-timeout when installed, and a per-file subprocess timeout), at most ``--jobs`` at a time,
inside a total time budget. MAX's per-file results are cached (``--max-cache``, keyed by the
file's content hash) so the maxjax side can be re-run alone (``--reuse-max``).

Import rewriting (``rewrite_imports``), line by line, only statements that import the ``max``
package: ``from max import ...`` / ``from max.x import ...`` become ``from maxjax... import``;
``import max.x [as y]`` becomes ``import maxjax.x [as y]`` (without ``as``, the name ``max`` is
then bound to ``maxjax``, as ``import max.x`` binds ``max``). Nothing else changes (``max(``,
strings naming ``max.*`` modules, attribute uses). Two tolerances, both only on import lines:

* in ``conftest.py`` files every ``max`` import is made tolerant: a name maxjax lacks becomes a
  placeholder that raises when used (``mlir`` becomes a stub module whose ``Context`` /
  ``Location.unknown()`` are no-ops and ``default_mlir_context()`` returns None), so MAX's shared
  fixtures (hypothesis strategies, the MLIR-context fixture, sessions) do not sink a whole
  directory. A test that then needs a missing name fails on its own.
* in test files, imports of private names (a ``max._x`` module, a ``_Name``) and of ``max.mlir``
  get the same placeholders; the tests that use them are excluded (below), the others run.

Classification of each test (by node id) -- the rules, in this order:

1. ``gpu``: the file lies under an ``accelerator_tests`` folder or its name ends in ``_gpu``; or
   MAX skipped the test; or MAX failed it with a message naming a GPU/accelerator
   (``GPU_RE``).
2. ``mlir``: the test's source (its function, plus module-level helper functions it calls in
   the same file, one level) matches an MLIR-text marker (``MLIR_MARKERS``: MLIR op names such
   as ``"mo.``, ``mlir``/``_mlir`` uses, ``str(graph)``, ``.verify()``, the op-lookup helpers of
   MAX's tests); requesting the ``mlir_context`` fixture (``mlir_context: mlir.Context``) alone
   does not count.
3. ``private``: that source uses a private MAX name (a name imported from ``max._x`` or a
   ``_Name`` imported from ``max``), or ``max._`` appears in it.
4. ``max_fail``: MAX 26.7 did not pass it (failed, errored, timed out, file not collected --
   e.g. a package MAX's tests need is not installed, or a MAX name the test file imports is
   not in 26.7).
5. otherwise it is counted: ``pass`` when maxjax passes it, else ``fail`` (with its cause:
   exception type and first message line, from the junit XML).

Output: a table per test directory (MAX-passing count, maxjax-passing count, %), the issue
figures (``GROUPS``), the ranked maxjax failure causes (exception type + first line, grouped,
most frequent first), ``benchmarks/results/max_suite.json`` and ``max_suite.md``.

Usage::

    python scripts/max_suite.py --tests /work/maxsuite/tests \\
        --max-python ~/max267/bin/python --maxjax-python /work/main/.venv/bin/python \\
        --tree /work/main [--reuse-max] [--only tests/nn] [--budget 3000]
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Issue groups: a test file belongs to a group when its path (relative to --tests) matches.
GROUPS: dict[str, re.Pattern[str]] = {
    # issue 21: MAX's layer tests.
    "issue21_layers": re.compile(
        r"(^|/)nn/(test_attention|test_stacked_linear|test_layer_norm|"
        r"test_forward_sequential_layers|test_print_hook|test_state_dict)\.py$"
    ),
    # issue 22: graph / ops / driver / engine tests.
    "issue22_graph_ops_driver_engine": re.compile(
        r"(^|/)(graph|driver|engine)/|(^|/)test_engine[^/]*\.py$"
    ),
}

GPU_RE = re.compile(
    r"\bGPU\b|[Aa]ccelerator|CUDA|\bHIP\b|\bgpu\b|No (?:supported )?(?:GPU|accelerator)"
)

# MLIR-text markers, searched in the test's source with the fixture ``mlir_context: mlir.Context`` removed
# (that fixture only sets up MAX's MLIR context; maxjax's side gets a no-op stand-in).
MLIR_MARKERS = re.compile(
    r"""["'](?:mo|rmo|mgp|kgen|mef|mosh)\.\w|\b(?:mo|rmo|mlir|builtin)\.\w|_mlir|\bmlir\b"""
    r"|str\(\s*(?:\w*graph\w*|g)\s*\)|\._module\b|\.verify\(\)|assert_single_op|assert_op_output_shape"
    r"|FileCheck|filecheck|\bir\b\s*=|print\((?:graph|g)\)"
)

GPU_PATH_RE = re.compile(r"(^|/)accelerator_tests/|_gpu\.py$")

_FROM_RE = re.compile(r"^(?P<ind>[ \t]*)from[ \t]+max(?P<mod>(?:\.[\w.]+)?)[ \t]+import\b")
_IMPORT_RE = re.compile(
    r"^(?P<ind>[ \t]*)import[ \t]+max(?P<mod>(?:\.[\w.]+)?)(?P<alias>[ \t]+as[ \t]+\w+)?"
    r"[ \t]*(?P<rest>(?:#.*)?)$"
)


# --------------------------------------------------------------------------- rewriting


def _is_private_module(mod: str) -> bool:
    """``mod`` is the part after ``max`` (``""``, ``".graph"``, ``"._core.x"``)."""
    parts = [p for p in mod.split(".") if p]
    return any(p.startswith("_") for p in parts) or (parts[:1] == ["mlir"])


def _import_nodes(src: str) -> list[ast.ImportFrom]:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    return [
        n for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
        and (n.module == "max" or n.module.startswith("max."))
    ]


def _tolerant(stmt_lines: list[str], module: str, names: list[tuple[str, str]], ind: str) -> list[str]:
    """Wrap one ``from maxjax... import`` statement so a missing name becomes a placeholder."""
    body = [ind + "    " + ln.lstrip() if i == 0 else "    " + ln for i, ln in enumerate(stmt_lines)]
    targets = ", ".join(asname for _, asname in names)
    pairs = ", ".join(f"({name!r}, {asname!r})" for name, asname in names)
    fallback = (
        f"{ind}    import _max_suite_shim as _mss\n"
        f"{ind}    ({targets},) = _mss.tolerant_import({module!r}, [{pairs}])\n"
    )
    return [f"{ind}try:\n"] + body + [f"{ind}except ImportError:\n", fallback]


def rewrite_imports(src: str, *, conftest: bool = False) -> str:
    """Replace the ``max`` package by ``maxjax`` in import statements of ``src`` (see module doc).

    ``conftest``: every ``from max... import`` becomes tolerant (placeholders for missing names);
    otherwise only imports of private names or of ``max.mlir`` do.
    """
    lines = src.splitlines(keepends=True)
    nodes = {n.lineno: n for n in _import_nodes(src)}
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        lineno = i + 1
        m = _FROM_RE.match(line)
        if m:
            node = nodes.get(lineno)
            end = node.end_lineno if node is not None and node.end_lineno else lineno
            stmt = lines[i:end]
            stmt[0] = _FROM_RE.sub(
                lambda mm: f"{mm.group('ind')}from maxjax{mm.group('mod')} import", stmt[0], count=1
            )
            mod = m.group("mod")
            names = [(a.name, a.asname or a.name) for a in node.names] if node else []
            private = _is_private_module(mod) or any(n.startswith("_") or n == "mlir" for n, _ in names)
            star = any(n == "*" for n, _ in names)
            if node is not None and not star and (conftest or private):
                if not conftest and not _is_private_module(mod):
                    # Split: public names imported plainly, private ones tolerantly.
                    pub = [(n, a) for n, a in names if not (n.startswith("_") or n == "mlir")]
                    prv = [(n, a) for n, a in names if (n.startswith("_") or n == "mlir")]
                    ind = m.group("ind")
                    if pub:
                        out.append(ind + f"from maxjax{mod} import "
                                   + ", ".join(n if n == a else f"{n} as {a}" for n, a in pub) + "\n")
                    stmt = [ind + f"from maxjax{mod} import "
                            + ", ".join(n if n == a else f"{n} as {a}" for n, a in prv) + "\n"]
                    out.extend(_tolerant(stmt, "maxjax" + mod, prv, ind))
                else:
                    out.extend(_tolerant(stmt, "maxjax" + mod, names, m.group("ind")))
            else:
                out.extend(stmt)
            i = end
            continue
        m = _IMPORT_RE.match(line.rstrip("\n"))
        if m:
            ind, mod, alias, rest = m.group("ind"), m.group("mod"), m.group("alias"), m.group("rest")
            nl = "\n" if line.endswith("\n") else ""
            if alias:
                new = f"{ind}import maxjax{mod}{alias}"
            elif mod:
                new = f"{ind}import maxjax{mod}; import maxjax as max"
            else:
                new = f"{ind}import maxjax as max"
            if _is_private_module(mod) and alias:
                name = alias.split()[-1]
                new = (f"{ind}try:\n{ind}    import maxjax{mod}{alias}\n{ind}except ImportError:\n"
                       f"{ind}    import _max_suite_shim as _mss; {name} = _mss.placeholder('maxjax{mod}')")
            out.append(new + (("  " + rest) if rest else "") + nl)
            i += 1
            continue
        out.append(line)
        i += 1
    return "".join(out)


SHIM = '''"""Placeholders for MAX names maxjax lacks, used only by max_suite's tolerant imports."""
import contextlib
import importlib
import types


class _MissingMeta(type):
    """A placeholder is a class (hypothesis and isinstance checks need types) whose use raises."""

    def __call__(cls, *a, **k):
        raise ImportError(f"max_suite placeholder: {cls._qualname} is not in maxjax")

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls._qualname}.{name}")

    def __iter__(cls):
        raise ImportError(f"max_suite placeholder: {cls._qualname} is not in maxjax")


def placeholder(qualname):
    return _MissingMeta(qualname.rsplit(".", 1)[-1], (), {"_qualname": qualname})


def _mlir_stub():
    m = types.ModuleType("maxjax_mlir_stub")

    class Context:
        pass

    class Location:
        @staticmethod
        def unknown():
            return contextlib.nullcontext()

    m.Context = Context
    m.Location = Location
    return m


def tolerant_import(module, pairs):
    try:
        mod = importlib.import_module(module)
    except ImportError:
        mod = None
    out = []
    for name, _ in pairs:
        if name == "mlir" and not hasattr(mod, "mlir"):
            out.append(_mlir_stub())
        elif name == "default_mlir_context" and mod is None or (
                name == "default_mlir_context" and not hasattr(mod, name)):
            out.append(lambda: None)
        elif mod is not None and hasattr(mod, name):
            out.append(getattr(mod, name))
        else:
            try:
                out.append(importlib.import_module(f"{module}.{name}"))
            except ImportError:
                out.append(placeholder(f"{module}.{name}"))
    return tuple(out)
'''


PLUGIN = '''"""max_suite's pytest plugin (both sides): caps hypothesis examples when asked, for time."""
import os

_N = int(os.environ.get("MAX_SUITE_HYPOTHESIS_EXAMPLES", "0") or 0)


def pytest_pycollect_makemodule(module_path, parent):
    """Before each test module is imported (its conftests have loaded their profile; @given
    binds the current profile at import): the same profile with examples capped."""
    if not _N:
        return
    try:
        from hypothesis import settings
    except ImportError:
        return
    current = settings.default
    if current.max_examples > _N:
        settings.register_profile("max_suite", parent=current, max_examples=_N)
        settings.load_profile("max_suite")
'''


# --------------------------------------------------------------------------- classification


def _test_sources(path: Path) -> dict[str, str]:
    """Map test function name (also ``Class::name``) to its source plus same-file helpers it calls."""
    try:
        src = path.read_text()
        tree = ast.parse(src)
    except (OSError, SyntaxError):
        return {}
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def seg(node: ast.AST) -> str:
        return ast.get_source_segment(src, node) or ""

    def with_helpers(node: ast.AST) -> str:
        text = seg(node)
        called = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name in sorted((called | used) & set(funcs)):
            if funcs[name] is not node and not name.startswith("test"):
                text += "\n" + seg(funcs[name])
        return text

    out: dict[str, str] = {}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test"):
            out[n.name] = with_helpers(n)
        elif isinstance(n, ast.ClassDef):
            for m in n.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test"):
                    out[f"{n.name}::{m.name}"] = with_helpers(m)
    return out


def _private_names(path: Path) -> set[str]:
    """Names a test file imports that are MAX-private (from ``max._x`` or ``_Name``)."""
    try:
        src = path.read_text()
    except OSError:
        return set()
    names: set[str] = set()
    for node in _import_nodes(src):
        mod = node.module[len("max"):]
        for a in node.names:
            if _is_private_module(mod) and not mod.startswith(".mlir") or a.name.startswith("_"):
                names.add(a.asname or a.name)
    return names


def classify(test_file: Path, func: str, max_outcome: str, max_msg: str) -> str | None:
    """Exclusion category of one test (``gpu``/``mlir``/``private``/``max_fail``) or None (counted).

    ``func``: the test's name in the file (``test_x`` or ``Class::test_x``), parameters stripped.
    ``max_outcome``: ``passed``/``failed``/``error``/``skipped``/``missing``.
    """
    rel = test_file.as_posix()
    if GPU_PATH_RE.search(rel) or max_outcome == "skipped":
        return "gpu"
    if max_outcome in ("failed", "error") and GPU_RE.search(max_msg or ""):
        return "gpu"
    source = _test_sources(test_file).get(func, "")
    if MLIR_MARKERS.search(source.replace("mlir.Context", "").replace("mlir_context", "")):
        return "mlir"
    private = _private_names(test_file)
    if "max._" in source or (private and re.search(
            r"\b(" + "|".join(map(re.escape, sorted(private))) + r")\b", source)):
        return "private"
    if max_outcome != "passed":
        return "max_fail"
    return None


# --------------------------------------------------------------------------- running


def _has_timeout_plugin(python: str) -> bool:
    r = subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True)
    return r.returncode == 0


def _run_file(python: str, root: Path, rel: str, xml: Path, env: dict[str, str],
              per_test: int, per_file: int, timeout_plugin: bool) -> dict:
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_max_suite_plugin",
           "--rootdir", str(root),
           f"--junitxml={xml}", "-o", "junit_family=xunit1", rel]
    if timeout_plugin:
        cmd[4:4] = [f"--timeout={per_test}"]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=per_file)
        status, tail = r.returncode, (r.stdout + r.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        status, tail = "timeout", str(e)[-500:]
    return {"file": rel, "rc": status, "seconds": round(time.time() - t0, 1), "tail": tail}


def _parse_junit(xml: Path) -> dict[str, dict]:
    """node key ``relpath::func[params]`` -> {outcome, message}."""
    out: dict[str, dict] = {}
    if not xml.exists():
        return out
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError:
        return out
    for tc in root.iter("testcase"):
        file = tc.get("file") or ""
        classname = tc.get("classname") or ""
        name = tc.get("name") or ""
        outcome, msg = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                msg = (child.get("message") or "") + "\n" + (child.text or "")
                break
        if not file:
            file = classname.replace(".", "/") + ".py"
        if not classname and outcome == "error" and msg.startswith("collection failure"):
            out[f"{file}::<collection>"] = {"outcome": "error", "message": msg.strip()}
            continue
        cls = ""
        # classname is dotted module path, possibly followed by a class name.
        mod_path = file[:-3].replace("/", ".")
        if classname.startswith(mod_path + "."):
            cls = classname[len(mod_path) + 1:]
        key = f"{file}::{cls + '::' if cls else ''}{name}"
        out[key] = {"outcome": outcome, "message": msg.strip()}
    return out


def cause_of(message: str) -> str:
    """Failure cause: exception type + first line of its message (numbers kept)."""
    msg = message.strip()
    if not msg:
        return "(no message)"
    first = msg.splitlines()[0].strip()
    # junit 'message' is often 'ExcType: text' or 'Failed: Timeout'; strip pytest's prefix.
    first = re.sub(r"^(E\s+)", "", first)
    for ln in msg.splitlines():
        s = ln.strip()
        if s.startswith("E ") and ("Error" in s or "Exception" in s):
            first = s[1:].strip()
            break
    lines = msg.splitlines()
    if first.endswith("did not match.") and len(lines) > 1:  # pytest.raises(match=...)
        first += " " + lines[1].strip()
    return first[:200]


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def prepare(tests: Path, dest: Path, *, rewrite: bool) -> None:
    """Copy ``tests`` to ``dest``; with ``rewrite``, rewrite imports and add the shim."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tests, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    (dest / "_max_suite_plugin.py").write_text(PLUGIN)
    if not rewrite:
        return
    (dest / "_max_suite_shim.py").write_text(SHIM)
    # the shim is importable from every test (pytest puts rootdir-relative dirs on sys.path).
    for py in dest.rglob("*.py"):
        if py.name == "_max_suite_shim.py":
            continue
        src = py.read_text()
        new = rewrite_imports(src, conftest=py.name == "conftest.py")
        if new != src:
            py.write_text(new)


def run_side(python: str, root: Path, files: list[str], results_dir: Path, env: dict[str, str],
             per_test: int, per_file: int, jobs: int, deadline: float, label: str) -> list[dict]:
    results_dir.mkdir(parents=True, exist_ok=True)
    plugin = _has_timeout_plugin(python)
    runs: list[dict] = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = {}
        for rel in files:
            futs[rel] = ex.submit(_run_guarded, python, root, rel, results_dir, env, per_test,
                                  per_file, plugin, deadline)
        for rel, fut in futs.items():
            r = fut.result()
            runs.append(r)
            print(f"[{label}] {rel}: rc={r['rc']} {r['seconds']}s", flush=True)
    return runs


def _xml_name(rel: str) -> str:
    return rel.replace("/", "__") + ".xml"


def _run_guarded(python, root, rel, results_dir, env, per_test, per_file, plugin, deadline):
    left = deadline - time.time()
    if left < 10:
        return {"file": rel, "rc": "not_run", "seconds": 0, "tail": "total budget spent"}
    xml = results_dir / _xml_name(rel)
    if xml.exists():
        xml.unlink()
    return _run_file(python, root, rel, xml, env, per_test, int(min(per_file, left)), plugin)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=Path, required=True, help="directory of MAX's test files")
    ap.add_argument("--max-python", default=str(Path.home() / "max267/bin/python"))
    ap.add_argument("--maxjax-python", default="/work/main/.venv/bin/python")
    ap.add_argument("--tree", type=Path, default=REPO, help="maxjax tree put on PYTHONPATH")
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "max_suite")
    ap.add_argument("--max-cache", type=Path, default=Path("/work/maxsuite/max_results"))
    ap.add_argument("--reuse-max", action="store_true", help="use cached MAX results where present")
    ap.add_argument("--only", action="append", default=[], help="path prefix of files to run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--per-test-timeout", type=int, default=240)
    ap.add_argument("--per-file-timeout", type=int, default=900)
    ap.add_argument("--budget", type=int, default=3600, help="total seconds for both sides")
    ap.add_argument("--hypothesis-examples", type=int, default=0,
                    help="cap hypothesis examples per test (both sides; 0: the tests' own settings)")
    ap.add_argument("--maxjax-results", type=Path, default=None,
                    help="where maxjax's junit files go (default: under --scratch)")
    ap.add_argument("--reuse-maxjax", action="store_true",
                    help="keep maxjax junit files already in --maxjax-results (same tree only)")
    ap.add_argument("--max-cached-only", action="store_true",
                    help="do not run MAX; files without cached MAX results are 'max_fail' (not run)")
    ap.add_argument("--max-only", action="store_true", help="run (and cache) MAX's side only")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/max_suite.json")
    args = ap.parse_args(argv)

    tests = args.tests.resolve()
    files = sorted(p.relative_to(tests).as_posix() for p in tests.rglob("test_*.py"))
    # issue groups first (in GROUPS order), so a spent budget cuts the rest.
    # Within a group, files that compile graphs (MAX: 20-300 s a compile here) come last.
    files.sort(key=lambda f: (next((i for i, rx in enumerate(GROUPS.values()) if rx.search(f)),
                                   len(GROUPS)),
                              bool(re.search(r"\.load\(|\.execute\(", (tests / f).read_text()))))
    if args.only:
        files = [f for f in files if any(f.startswith(o) for o in args.only)]
    if args.hypothesis_examples:
        os.environ["MAX_SUITE_HYPOTHESIS_EXAMPLES"] = str(args.hypothesis_examples)
    t_start = time.time()
    deadline = t_start + args.budget

    # MAX side (cached per file by content hash).
    max_root = args.scratch / "max"
    prepare(tests, max_root, rewrite=False)
    cache = args.max_cache
    cache.mkdir(parents=True, exist_ok=True)
    index_path = cache / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    def cached(f: str) -> bool:  # a cached junit file whose test file is unchanged
        h = index.get(f, {}).get("hash")
        return (cache / _xml_name(f)).exists() and h in (None, _hash(tests / f))

    todo = [f for f in files if not (args.reuse_max and cached(f))]
    if args.max_cached_only:  # MAX's side not run now: files without a cached result count as not run
        todo = []
    # GPU-path files are excluded by rule: MAX is not run on them.
    todo = [f for f in todo if not GPU_PATH_RE.search(f)]
    env_max = dict(os.environ)
    env_max["PYTHONPATH"] = str(max_root)
    env_max["MODULAR_TEST_DEVICE"] = "cpu"
    if todo:
        runs = run_side(args.max_python, max_root, todo, cache, env_max, args.per_test_timeout,
                        args.per_file_timeout, args.jobs, t_start + args.budget * 0.7, "max")
        for r in runs:
            if r["rc"] != "not_run":
                index[r["file"]] = {"hash": _hash(tests / r["file"]), "rc": r["rc"],
                                    "hypothesis_examples": args.hypothesis_examples,
                                    "seconds": r["seconds"], "tail": r["tail"][-1500:]}
        index_path.write_text(json.dumps(index, indent=1))
    if args.max_only:
        return 0

    # maxjax side.
    mj_root = args.scratch / "maxjax"
    prepare(tests, mj_root, rewrite=True)
    mj_xml = args.maxjax_results or args.scratch / "maxjax_results"
    env_mj = dict(os.environ)
    env_mj["PYTHONPATH"] = os.pathsep.join([str(args.tree.resolve()), str(mj_root)])
    mj_files = [f for f in files if not GPU_PATH_RE.search(f)]
    if args.reuse_maxjax:  # same tree, same tests: keep the junit files already there
        mj_files = [f for f in mj_files if not (mj_xml / _xml_name(f)).exists()]
    mj_runs = run_side(args.maxjax_python, mj_root, mj_files, mj_xml, env_mj,
                       min(args.per_test_timeout, 120), min(args.per_file_timeout, 600), args.jobs,
                       deadline, "maxjax")

    report = build_report(tests, files, cache, mj_xml, index, {r["file"]: r for r in mj_runs})
    report["meta"] = {
        "tests_dir": str(tests),
        "source": (tests.parent / "SOURCE.txt").read_text().strip()
        if (tests.parent / "SOURCE.txt").exists() else "",
        "tree": str(args.tree.resolve()),
        "tree_commit": subprocess.run(["git", "-C", str(args.tree), "rev-parse", "HEAD"],
                                      capture_output=True, text=True).stdout.strip(),
        "max_python": args.max_python,
        "maxjax_python": args.maxjax_python,
        "seconds": round(time.time() - t_start, 1),
        "hypothesis_examples": args.hypothesis_examples or "tests' own",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    md = render_markdown(report)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


def build_report(tests: Path, files: list[str], max_dir: Path, mj_dir: Path, index: dict,
                 mj_runs: dict) -> dict:
    per_test: list[dict] = []
    for rel in files:
        max_res = _parse_junit(max_dir / _xml_name(rel)) if not GPU_PATH_RE.search(rel) else {}
        mj_res = _parse_junit(mj_dir / _xml_name(rel))
        keys = list(max_res) or list(mj_res)
        if not keys and not GPU_PATH_RE.search(rel):
            keys = [f"{rel}::<collection>"]
        for key in keys:
            m = max_res.get(key, {"outcome": "missing", "message": index.get(rel, {}).get("tail", "")})
            j = mj_res.get(key)
            if j is None:
                run = mj_runs.get(rel, {})
                j = {"outcome": "missing",
                     "message": ("not run: " + str(run.get("rc"))) if run.get("rc") in ("not_run", "timeout")
                     else (_collection_error(mj_res) or "not collected under maxjax: "
                           + _first_error(run.get("tail", "")))}
            name = key.split("::", 1)[1] if "::" in key else key
            func = re.sub(r"\[.*$", "", name)
            cat = classify(tests / rel, func, m["outcome"], m["message"])
            per_test.append({
                "test": key, "dir": str(Path(rel).parent), "file": rel,
                "max": m["outcome"], "maxjax": j["outcome"], "excluded": cat,
                "cause": None if cat or j["outcome"] == "passed" else cause_of(j["message"]),
            })
    rep = summarize(per_test)
    rep["max_not_run"] = [f for f in files if not GPU_PATH_RE.search(f)
                          and not (max_dir / _xml_name(f)).exists()]
    return rep


def _collection_error(res: dict) -> str:
    for k, v in res.items():
        if v["outcome"] == "error" and k.endswith("::<collection>"):
            return v["message"]
    return ""


def _first_error(tail: str) -> str:
    for ln in tail.splitlines():
        if ln.startswith("E ") and ("Error" in ln or "Exception" in ln):
            return ln[1:].strip()
    return tail.strip().splitlines()[-1] if tail.strip() else "(no output)"


def summarize(per_test: list[dict]) -> dict:
    dirs: dict[str, dict] = defaultdict(lambda: {"max_pass": 0, "maxjax_pass": 0, "excluded": Counter()})
    groups = {g: {"max_pass": 0, "maxjax_pass": 0} for g in GROUPS}
    causes: dict[str, list[str]] = defaultdict(list)
    for t in per_test:
        d = dirs[t["dir"]]
        if t["excluded"]:
            d["excluded"][t["excluded"]] += 1
            continue
        d["max_pass"] += 1
        ok = t["maxjax"] == "passed"
        d["maxjax_pass"] += ok
        for g, rx in GROUPS.items():
            if rx.search(t["file"]):
                groups[g]["max_pass"] += 1
                groups[g]["maxjax_pass"] += ok
        if not ok:
            causes[t["cause"] or "(unknown)"].append(t["test"])

    def pct(a: int, b: int) -> float:
        return round(100.0 * a / b, 1) if b else 0.0

    table = [{"dir": k, "max_pass": v["max_pass"], "maxjax_pass": v["maxjax_pass"],
              "pct": pct(v["maxjax_pass"], v["max_pass"]), "excluded": dict(v["excluded"])}
             for k, v in sorted(dirs.items())]
    for g in groups.values():
        g["pct"] = pct(g["maxjax_pass"], g["max_pass"])
    total_max = sum(r["max_pass"] for r in table)
    total_mj = sum(r["maxjax_pass"] for r in table)
    ranked = sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return {
        "groups": groups,
        "total": {"max_pass": total_max, "maxjax_pass": total_mj, "pct": pct(total_mj, total_max)},
        "excluded": dict(Counter(t["excluded"] for t in per_test if t["excluded"])),
        "dirs": table,
        "causes": [{"cause": c, "count": len(ts), "examples": ts[:3]} for c, ts in ranked],
        "tests": per_test,
    }


def render_markdown(rep: dict) -> str:
    out = ["# MAX 26.7's own tests under maxjax (imports rewritten only)", ""]
    meta = rep.get("meta", {})
    if meta:
        out += [f"- tests: {meta.get('source', meta.get('tests_dir'))}",
                f"- maxjax tree: {meta.get('tree')} @ {meta.get('tree_commit', '')[:10]}",
                f"- excluded (rules in scripts/max_suite.py): {rep['excluded']}", ""]
    if rep.get("max_not_run"):
        out += [f"- not run under MAX (time budget; their tests are not counted): "
                f"{', '.join(rep['max_not_run'])}", ""]
    out += ["| group | MAX passes | maxjax passes | % |", "|---|---:|---:|---:|"]
    for g, v in rep["groups"].items():
        out.append(f"| {g} | {v['max_pass']} | {v['maxjax_pass']} | {v['pct']} |")
    t = rep["total"]
    out.append(f"| all | {t['max_pass']} | {t['maxjax_pass']} | {t['pct']} |")
    out += ["", "| directory | MAX passes | maxjax passes | % | excluded |", "|---|---:|---:|---:|---|"]
    for r in rep["dirs"]:
        out.append(f"| {r['dir']} | {r['max_pass']} | {r['maxjax_pass']} | {r['pct']} | {r['excluded']} |")
    out += ["", "## maxjax failure causes (most frequent first)", ""]
    for i, c in enumerate(rep["causes"][:40], 1):
        cause = c["cause"].replace("|", "\\|")
        out.append(f"{i}. ({c['count']}) `{cause}` e.g. {', '.join(c['examples'][:2])}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
