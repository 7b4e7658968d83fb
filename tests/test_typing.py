"""The type hints reach a user's type checker: the package says it is typed (PEP 561), and the
names `nlptrain` and `nlptrain.data` hand out lazily are imported for the checker too."""

from __future__ import annotations

import ast
import configparser
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_package_is_marked_typed_and_ships_the_marker():
    assert (REPO / "nlptrain" / "py.typed").is_file()
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert "py.typed" in setup["options.package_data"]["nlptrain"]


@pytest.mark.parametrize("package", ["nlptrain", "nlptrain.data"])
def test_every_lazy_export_is_imported_for_type_checkers(package):
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text())
    checked = {alias.name: node.module for block in tree.body if isinstance(block, ast.If)
               and getattr(block.test, "id", "") == "TYPE_CHECKING"
               for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert sorted(checked) == sorted(module._EXPORTS) == sorted(module.__all__)
    for name, source in checked.items():  # the checker's name is the one handed out at run time
        assert getattr(module, name) is getattr(importlib.import_module(source), name)
