"""The README's MAX 26.7 API coverage table (``scripts/max_api_table.py``) is current and honest."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("max_api_table", ROOT / "scripts" / "max_api_table.py")
table = importlib.util.module_from_spec(_spec)
sys.modules["max_api_table"] = table
_spec.loader.exec_module(table)


@pytest.fixture(scope="module")
def inventory():
    return table.load_inventory()


@pytest.fixture(scope="module")
def rows(inventory):
    out = table.all_rows(inventory)
    for module, (have, total) in table.counts(out).items():  # the goal counts are not asserted
        print(f"max.{module}: {have} of {total} present")
    return out


def test_signature_parsing():
    sig = (
        "(self, *, rope: 'RotaryEmbedding', kv: 'dict[str, int]' = {'a': 1, 'b': 2}, linear_cls: "
        "'Callable[..., Linear]' = <class 'max.nn.linear.Linear'>, mask: 'M' = <M.CAUSAL: '0'>, "
        "mode: \"Literal['a', 'b']\" = 'a', /, _private: bool = True, *args, **kwargs) -> 'tuple[int, int]'"
    )
    assert table.param_names(sig) == ["rope", "kv", "linear_cls", "mask", "mode", "*args", "**kwargs"]
    assert table.param_names("(p_avg: float, n: int, tol: float = 1e-09) -> float") == ["p_avg", "n", "tol"]
    assert table.param_names("(self) -> 'None'") == []
    assert table.param_names("(a: 'int' = (1, 2), b=<f at 0x1>, c: 'Callable[[int], int]' = None) -> 'Iterator[int]'") == ["a", "b", "c"]
    assert table.param_names("?") is None
    assert table.param_names("(self, /, *args, **kwargs)") is None  # generic: presence only


def test_readme_table_is_current(rows):
    section = table.readme_section((ROOT / "README.md").read_text())
    assert section is not None, f"README.md lacks {table.BEGIN} / {table.END}"
    assert section == table.markdown(rows), "README.md's MAX API table is stale: run python scripts/max_api_table.py --write"


def test_nn_table_lists_all_71_names(rows, inventory):
    nn_rows = [r for r in rows if r.module == "nn"]
    assert len(inventory["nn"]) == 71 and sorted(r.name for r in nn_rows) == sorted(inventory["nn"])
    section = table.readme_section((ROOT / "README.md").read_text())
    nn_table = section.split("### `max.nn`\n", 1)[1].split("\n### ", 1)[0]
    assert all(f"| `{name}` |" in nn_table for name in inventory["nn"])


def test_every_absent_name_has_a_reason(rows):
    missing = [f"max.{r.module}.{r.name}" for r in rows if r.status == "absent" and not r.has_reason]
    assert not missing, f"absent without a reason in scripts/max_api_table.py REASONS: {missing}"


def test_present_names_have_max_parameter_names(rows):
    bad = [f"max.{r.module}.{r.name}: {r.note}" for r in rows if r.status == "differs" and not r.has_reason]
    assert not bad, f"parameters differ from MAX's with no reason in REASONS: {bad}"


def test_reasons_name_real_inventory_entries(inventory):
    names = {f"{m}.{n}" for m, d in inventory.items() for n in d}
    bare = {n for d in inventory.values() for n in d}
    unknown = [k for k in table.REASONS if (k[2:] not in bare if k.startswith("*.") else k not in names)]
    assert not unknown, f"REASONS keys that name nothing in the inventory: {unknown}"


def test_no_stale_reasons(rows):
    stale = table.stale_reasons(rows)
    assert not stale, f"names present with MAX's parameters still have a reason in REASONS (delete it): {stale}"


def test_layer_package_matches_max(rows):
    layer = {r.name: r.status for r in rows if r.module == "nn.layer"}
    assert layer == {n: "present" for n in ("Layer", "LayerList", "MissingLayer", "Module", "Shardable", "add_layer_hook", "clear_hooks")}
