"""The ``strict_layers`` import contract (tools/import_contracts.py), checked on small packages written for each test."""

from __future__ import annotations

import textwrap

import pytest
from importlinter import api  # noqa: F401  (importing it configures import-linter)
from importlinter.application.use_cases import create_report, read_user_options

CONFIG = """
[importlinter]
root_packages =
    shop
    stock
contract_types =
    strict_layers: tools.import_contracts.StrictLayersContract

[importlinter:contract:layers]
name = layers
type = strict_layers
{options}
layers =
    shop.views
    shop.orders | stock.counts
    shop.models | stock.models
"""


def write_packages(root, modules: dict[str, str]) -> None:
    """Write each dotted module name's source under ``root``; packages get an empty ``__init__.py``."""
    for name, source in modules.items():
        parts = name.split(".")
        for depth in range(1, len(parts)):
            package = root.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            package.joinpath("__init__.py").touch()
        root.joinpath(*parts[:-1], parts[-1] + ".py").write_text(textwrap.dedent(source))


LAYERED = {
    "shop.views": "import shop.orders\nimport stock.counts\n",
    "shop.orders": "import shop.models\n",
    "shop.models": "",
    "stock.counts": "import stock.models\nimport shop.models\n",
    "stock.models": "",
}


@pytest.fixture
def check(tmp_path, monkeypatch):
    """Write the packages and the contract into ``tmp_path`` and return the contract's check."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(modules: dict[str, str], options: str):
        write_packages(tmp_path, modules)
        config = tmp_path / ".importlinter"
        config.write_text(CONFIG.format(options=options))
        report = create_report(read_user_options(str(config)), cache_dir=None)
        [(_, result)] = report.get_contracts_and_checks()
        return result

    return run


def test_layered_packages_without_cycles_keep_the_contract(check):
    result = check(LAYERED, "exhaustive = true\nacyclic = true")
    assert result.kept
    assert result.metadata["outside_layers"] == [] and result.metadata["import_cycles"] == []


def test_a_module_in_no_layer_breaks_an_exhaustive_contract(check):
    result = check({**LAYERED, "stock.audit": "import stock.models\n", "shop.extra.notes": ""}, "exhaustive = true")
    assert not result.kept
    # shop.extra (a package holding no layer) and its module are in no layer; shop and stock only hold layers.
    assert result.metadata["outside_layers"] == ["shop.extra", "shop.extra.notes", "stock.audit"]


def test_a_package_that_holds_layers_but_imports_something_must_be_in_a_layer(check):
    result = check({**LAYERED, "stock.__init__": "import stock.models\n"}, "exhaustive = true")
    assert result.metadata["outside_layers"] == ["stock"]


def test_exhaustive_ignores_leave_a_module_and_what_is_inside_it_out(check):
    result = check({**LAYERED, "shop.extra.notes": ""}, "exhaustive = true\nexhaustive_ignores =\n    shop.extra")
    assert result.kept


def test_without_exhaustive_a_module_in_no_layer_is_not_reported(check):
    result = check({**LAYERED, "stock.audit": ""}, "acyclic = true")
    assert result.kept and result.metadata["outside_layers"] == []


def test_a_cycle_inside_one_layer_breaks_an_acyclic_contract(check):
    # stock.counts becomes a package whose modules import each other: one layer entry, so the layers allow it.
    modules = {name: source for name, source in LAYERED.items() if name != "stock.counts"}
    cyclic = {**modules, "stock.counts.__init__": "import stock.models\n", "stock.counts.daily": "import stock.counts.weekly\n",
              "stock.counts.weekly": "import stock.counts.monthly\n", "stock.counts.monthly": "import stock.counts.daily\n"}
    result = check(cyclic, "exhaustive = true\nacyclic = true")
    assert not result.kept
    assert result.metadata["outside_layers"] == [] and not result.metadata["invalid_dependencies"]
    assert result.metadata["import_cycles"] == [["stock.counts.daily", "stock.counts.weekly", "stock.counts.monthly"]]


def test_a_cycle_is_allowed_without_acyclic(check):
    cyclic = {**LAYERED, "shop.models": "import shop.models_base\n", "shop.models_base": "import shop.models\n"}
    result = check(cyclic, "")
    assert result.kept and result.metadata["import_cycles"] == []


def test_an_import_upwards_still_breaks_the_contract(check):
    result = check({**LAYERED, "shop.models": "import shop.views\n"}, "exhaustive = true\nacyclic = true")
    assert not result.kept
    assert result.metadata["invalid_dependencies"]
