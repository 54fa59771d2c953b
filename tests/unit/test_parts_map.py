"""The map at the top of docs/DESIGN.md stays true: its arrows are the code's imports between parts.

docs/parts_map.py draws docs/parts-map.svg from its own list of arrows; this test computes which part imports
which from the code with ast (as test_structure.py does) and compares. When it fails: fix the import, or the
arrows in docs/parts_map.py, then ``python docs/parts_map.py`` and look at the picture.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from unit.test_structure import ROOT, module_level_imports, modules


def _load_map():
    spec = importlib.util.spec_from_file_location("parts_map", ROOT / "docs" / "parts_map.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


parts_map = _load_map()


def imports_anywhere(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, in functions too; imports for type checking only are left out."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for inner in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def part_imports() -> dict[tuple[str, str], str]:
    """(importer's box, imported's box) -> "imports" when some module imports it at import time, else "deferred"."""
    known = modules()
    pairs: dict[tuple[str, str], str] = {}
    for name, path in known.items():
        now = {m for m in module_level_imports(name, path) if m in known}
        later = {m for m in imports_anywhere(name, path) if m in known} - now
        for kind, targets in (("deferred", later), ("imports", now)):  # "imports" wins over "deferred"
            for target in targets:
                pair = (parts_map.box_of(name), parts_map.box_of(target))
                if pair[0] != pair[1]:
                    pairs[pair] = kind if pairs.get(pair) != "imports" else "imports"
    return pairs


def test_every_module_is_in_a_box_of_the_map():
    boxes = {box.key for box in parts_map.BOXES}
    drawn = {parts_map.box_of(name) for name in modules()}  # box_of raises for a module of no box
    assert drawn <= boxes
    assert boxes - drawn == {"helm"}, "a box that holds no module"


def test_the_arrows_are_the_imports_between_parts():
    code = {(a, b): kind for (a, b), kind in part_imports().items() if b != parts_map.FLOOR}
    drawn = {(a, b): kind for a, b, kind in parts_map.ARROWS}
    missing = sorted(f"{a} -> {b} ({kind})" for (a, b), kind in code.items() if drawn.get((a, b)) != kind)
    extra = sorted(f"{a} -> {b} ({kind})" for (a, b), kind in drawn.items() if code.get((a, b)) != kind)
    assert (missing, extra) == ([], []), (
        f"the map's arrows are not the code's imports: in the code, not drawn so: {missing}; drawn, not in the "
        f"code: {extra}. Fix the import, or ARROWS and ROUTES in docs/parts_map.py, then run it.")
    assert len(drawn) == len(parts_map.ARROWS), "an arrow listed twice"


def test_the_floor_is_imported_by_every_part_and_imports_none():
    pairs = part_imports()
    floor = parts_map.FLOOR
    python_boxes = {parts_map.box_of(name) for name in modules()} - {floor}
    assert {a for (a, b), kind in pairs.items() if b == floor and kind == "imports"} == python_boxes
    assert [pair for pair in pairs if pair[0] == floor] == []


def test_each_contract_named_on_the_map_has_its_home():
    homes = [path for box in parts_map.BOXES for path, _ in box.homes]
    assert len(homes) >= 10
    assert [path for path in homes if not (ROOT / path).is_file()] == []


def test_the_committed_picture_is_what_the_generator_draws():
    svg = parts_map.SVG.read_text()
    assert svg == parts_map.render(), "docs/parts-map.svg is stale: run python docs/parts_map.py"
    tree = ElementTree.fromstring(svg)
    arrows = {element.get("id") for element in tree.iter("{http://www.w3.org/2000/svg}path")
              if element.get("class") in ("imports", "deferred")}
    assert arrows == {f"{kind}:{a}->{b}" for a, b, kind in parts_map.ARROWS}
