"""scripts/max_suite.py: import rewriting, junit parsing and classification, on synthetic tests.

No MAX needed: a tiny fake ``maxjax`` package and a tiny test directory are made in tmp_path;
the rewritten copy is run with this Python's pytest, MAX's side is a hand-written junit file.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "max_suite", Path(__file__).resolve().parent.parent / "scripts" / "max_suite.py"
)
ms = importlib.util.module_from_spec(_SPEC)
sys.modules["max_suite"] = ms
_SPEC.loader.exec_module(ms)


def test_rewrite_imports_only_the_max_package() -> None:
    src = (
        "from max.graph import (\n    Graph,\n    TensorType,\n)\n"
        "from max import nn\n"
        "import max.driver as md\n"
        "import max.engine\n"
        "import maximal\n"
        "from maxjax.x import y\n"
        "x = max(1, 2)  # from max import nothing\n"
        "s = 'import max.graph'\n"
        "def f():\n    from max.dtype import DType\n    return DType\n"
    )
    out = ms.rewrite_imports(src)
    assert "from maxjax.graph import (\n    Graph,\n    TensorType,\n)\n" in out
    assert "from maxjax import nn\n" in out
    assert "import maxjax.driver as md\n" in out
    # `import max.engine` binds the name `max` to the package: so does the rewrite.
    assert "import maxjax.engine; import maxjax as max\n" in out
    assert "import maximal\n" in out and "from maxjax.x import y\n" in out
    assert "x = max(1, 2)  # from max import nothing\n" in out
    assert "s = 'import max.graph'\n" in out
    assert "    from maxjax.dtype import DType\n" in out
    compile(out, "<rewritten>", "exec")


def test_rewrite_private_names_become_tolerant() -> None:
    src = "from max.graph import Graph, _OpaqueType\nfrom max._core import thing\n"
    out = ms.rewrite_imports(src)
    assert "from maxjax.graph import Graph\n" in out  # public names stay plain
    assert "try:\n    from maxjax.graph import _OpaqueType\nexcept ImportError:\n" in out
    assert "tolerant_import('maxjax._core', [('thing', 'thing')])" in out
    compile(out, "<rewritten>", "exec")
    # In conftest files every max import is tolerant.
    conf = ms.rewrite_imports("from max.graph import Graph\n", conftest=True)
    assert conf.startswith("try:\n    from maxjax.graph import Graph\nexcept ImportError:\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture()
def synthetic(tmp_path: Path) -> dict[str, Path]:
    tests = tmp_path / "tests"
    _write(tests / "graph" / "conftest.py",
           "import pytest\nfrom max import mlir\nfrom max._mlir_context import default_mlir_context\n"
           "@pytest.fixture\ndef mlir_context():\n"
           "    ctx = default_mlir_context()\n    with mlir.Location.unknown():\n        yield ctx\n")
    _write(tests / "graph" / "test_a.py",
           "from __future__ import annotations\nfrom max.graph import Graph, _Private\n"
           "def helper(g):\n    return str(g)\n"
           "def test_pass(mlir_context: mlir.Context):\n    assert Graph(2).double() == 4\n"
           "def test_fail():\n    assert Graph(2).double() == 5, 'wrong double'\n"
           "def test_private():\n    assert _Private is not None\n"
           "def test_mlir_text():\n    assert '\"mo.add\"' in helper(Graph(1))\n"
           "def test_gpu_on_max():\n    pass\n"
           "def test_max_fails():\n    pass\n")
    _write(tests / "nn" / "test_layer_norm.py",
           "from max.nn import Missing\ndef test_x():\n    pass\n")
    fake = tmp_path / "fake_tree" / "maxjax"
    _write(fake / "__init__.py", "")
    _write(fake / "graph.py",
           "class Graph:\n    def __init__(self, v):\n        self.v = v\n"
           "    def double(self):\n        return 2 * self.v\n")
    _write(fake / "nn.py", "")
    max_xml = tmp_path / "max_results"
    max_xml.mkdir()
    cases = "".join(
        f'<testcase classname="graph.test_a" name="{n}" file="graph/test_a.py">{body}</testcase>'
        for n, body in [
            ("test_pass", ""), ("test_fail", ""), ("test_private", ""), ("test_mlir_text", ""),
            ("test_gpu_on_max", '<failure message="RuntimeError: No GPU available">x</failure>'),
            ("test_max_fails", '<failure message="AssertionError: boom">x</failure>'),
        ]
    )
    (max_xml / ms._xml_name("graph/test_a.py")).write_text(
        f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    (max_xml / ms._xml_name("nn/test_layer_norm.py")).write_text(
        '<testsuites><testsuite><testcase classname="nn.test_layer_norm" name="test_x" '
        'file="nn/test_layer_norm.py"/></testsuite></testsuites>')
    return {"tests": tests, "tree": fake.parent, "max_xml": max_xml, "tmp": tmp_path}


def test_end_to_end_classification(synthetic: dict[str, Path]) -> None:
    tmp = synthetic["tmp"]
    root = tmp / "scratch"
    ms.prepare(synthetic["tests"], root, rewrite=True)
    assert "from maxjax.graph import Graph\n" in (root / "graph" / "test_a.py").read_text()
    assert "\nfrom max.graph import" in (synthetic["tests"] / "graph" / "test_a.py").read_text()
    out = tmp / "mj"
    out.mkdir()
    env = {"PYTHONPATH": f"{synthetic['tree']}:{root}", "PATH": "/usr/bin:/bin"}
    for rel in ("graph/test_a.py", "nn/test_layer_norm.py"):
        ms._run_file(sys.executable, root, rel, out / ms._xml_name(rel), env, 30, 60, False)
    rep = ms.build_report(synthetic["tests"], ["graph/test_a.py", "nn/test_layer_norm.py"],
                          synthetic["max_xml"], out, {}, {})
    by = {t["test"].split("::")[-1]: t for t in rep["tests"]}
    assert by["test_pass"]["excluded"] is None and by["test_pass"]["maxjax"] == "passed"
    assert by["test_fail"]["excluded"] is None and by["test_fail"]["maxjax"] == "failed"
    assert by["test_private"]["excluded"] == "private"
    assert by["test_mlir_text"]["excluded"] == "mlir"
    assert by["test_gpu_on_max"]["excluded"] == "gpu"
    assert by["test_max_fails"]["excluded"] == "max_fail"
    # maxjax cannot import a public name: the file's test fails with that cause.
    assert by["test_x"]["maxjax"] == "missing"
    assert "ImportError: cannot import name 'Missing'" in by["test_x"]["cause"]
    assert rep["groups"]["issue21_layers"] == {"max_pass": 1, "maxjax_pass": 0, "pct": 0.0}
    assert rep["groups"]["issue22_graph_ops_driver_engine"]["max_pass"] == 2
    assert rep["groups"]["issue22_graph_ops_driver_engine"]["maxjax_pass"] == 1
    causes = [c["cause"] for c in rep["causes"]]
    assert len(causes) == 2 and any("wrong double" in c for c in causes)
    md = ms.render_markdown(rep)
    assert "| graph | 2 | 1 | 50.0 |" in md


def test_cause_of_takes_the_exception_line() -> None:
    msg = "collection failure\nTraceback:\n  x\nE   ImportError: cannot import name 'Foo' from 'maxjax.nn'\n"
    assert ms.cause_of(msg) == "ImportError: cannot import name 'Foo' from 'maxjax.nn'"
    assert ms.cause_of("AssertionError: wrong\nassert 4 == 5") == "AssertionError: wrong"
