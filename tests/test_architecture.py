"""The rule of the house, checked on the import graph: a layer imports only layers below it.

The layers of `prep`, bottom up (ARCHITECTURE.md): the base (`prep.errors`, `prep.processes`), the tar
format (`prep.tar`), the index (`prep.index`, with the part codecs `prep.codecs`), the command line's
kit (`prep.cli`, which names the commands as strings and imports none of them), then the commands, each
a package that imports no other command. `cookers` may use the layers below the commands, never a
command, and `prep` never imports `cookers`, torch or energon. Every import counts, including those
made inside functions to start faster.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: (unit, rank): a module may import its own unit and units of lower rank.
UNITS = {
    "prep": 0,  # prep/__init__.py: the version only
    "prep.errors": 0,
    "prep.processes": 1,
    "prep.engines": 1,  # Ray as an engine beside prep.processes, imported only with --engine ray
    "prep.tar": 1,
    "prep.alignment": 1,  # the pharaoh alignment format of parallel text, for write and the cookers
    "prep.media": 1,  # media headers (image size, format, mode): bytes and names, below the index
    "prep.index": 2,
    "prep.storage": 2.5,  # object storage (s3://, msc://): the bucket client, ranged reads, uploads in index order
    "prep.codecs": 2,
    "prep.cli": 3,
    "prep.prepare": 4,
    "prep.write": 4,
    "prep.mount": 4,
    "prep.inspect": 4,
    "prep.__main__": 5,
    "cookers": 4,
}
COMMANDS = ("prepare", "write", "mount", "inspect")
#: Where click may be used: the command line's kit, each command's shell, and the prepare wizard, which
#: talks on the terminal. Everything else takes and returns plain data.
CLICK_MODULES = {
    "prep.cli",
    "prep.__main__",
    "prep.prepare.wizard",
    *(f"prep.{command}.cli" for command in COMMANDS),
}


def modules() -> dict[str, Path]:
    found = {}
    for package in ("prep", "cookers"):
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def unit_of(module: str) -> str | None:
    """The unit a module belongs to: the longest name in UNITS it is, or is inside of."""
    candidates = [unit for unit in UNITS if module == unit or module.startswith(unit + ".")]
    return max(candidates, key=len) if candidates else None


ALL = modules()


@pytest.mark.parametrize("module", sorted(ALL))
def test_a_module_imports_only_its_own_layer_and_those_below(module: str) -> None:
    own = unit_of(module)
    assert own is not None, f"{module} belongs to no layer; add it to ARCHITECTURE.md and UNITS"
    for imported in sorted(imports_of(ALL[module])):
        target = unit_of(imported)
        if target is None or imported not in ALL and imported.rpartition(".")[0] not in ALL:
            continue  # outside the project (or a name imported from a project module, checked as that module)
        assert target == own or UNITS[target] < UNITS[own], (
            f"{module} imports {imported}, a layer not below it"
        )


@pytest.mark.parametrize("module", sorted(name for name in ALL if name.startswith("prep")))
def test_prep_imports_no_cookers_torch_or_energon(module: str) -> None:
    heavy = {
        name for name in imports_of(ALL[module]) if name.split(".")[0] in ("cookers", "torch", "megatron")
    }
    assert not heavy, f"{module} imports {sorted(heavy)}; prep must start fast and stay usable without them"


@pytest.mark.parametrize("module", sorted(ALL))
def test_click_is_only_at_the_edges(module: str) -> None:
    uses_click = any(name.split(".")[0] == "click" or name == "prep.cli" for name in imports_of(ALL[module]))
    assert not uses_click or module in CLICK_MODULES, f"{module} uses click; keep it a pure core"


@pytest.mark.parametrize("module", sorted(name for name in ALL if name.startswith("cookers")))
def test_cookers_keep_energon_in_their_energon_modules(module: str) -> None:
    energon = {name for name in imports_of(ALL[module]) if name.split(".")[0] in ("megatron", "torch")}
    leaf = module.rpartition(".")[2]
    assert not energon or leaf.startswith("energon_"), (
        f"{module} imports {sorted(energon)} but is not energon_*"
    )


def test_tests_mirror_the_packages() -> None:
    packages = {path.parent.name for path in (REPO / "prep").glob("*/__init__.py")} | {"cookers"}
    test_folders = {path.parent.name for path in (REPO / "tests").glob("*/__init__.py")} - {"support"}
    assert packages == test_folders
