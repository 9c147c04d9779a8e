"""The package's imports point down the layers of docs/architecture.md, no module imports the
package it is part of, and nothing imports itself round in a cycle: read from the source, every
import, lazy ones included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "seedbed"


def layers() -> dict[str, int]:
    """Part -> layer, from the table under '## Layers' in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, int] = {}
    for layer, parts in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M):
        for part in re.findall(r"`([\w_]+)`", parts):
            table[part] = int(layer)
    return table


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The seedbed modules ``path`` imports anywhere in it, absolute or relative (``from
    package import module`` counts as the module: a package's own submodules may import it)."""
    module, found = module_name(path), set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = {f"{base}.{alias.name}" for alias in node.names}
            found |= (names & known) or {base}
    return found & known


def own_package_imports(path: Path) -> list[str]:
    """The imports in ``path`` of a package it is part of (below ``seedbed`` itself): ``from
    seedbed.envs import atari`` in ``envs/registry.py`` runs ``envs/__init__.py``, which is
    importing the registry; ``from seedbed.envs.atari import FAMILY`` says what it needs."""
    module = module_name(path).split(".")
    package = module if path.name == "__init__.py" else module[:-1]
    own = {".".join(package[:i]) for i in range(2, len(package) + 1)}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [base]
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if name in own]
    return found


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def package_modules() -> dict[str, set[str]]:
    sources = [p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts]
    known = {module_name(p) for p in sources}
    return {module_name(p): imports(p, known) for p in sources}


def test_every_part_of_the_package_has_a_layer():
    missing = {part(m) for m in package_modules()} - set(layers())
    assert not missing, f"add these parts to the layers table in docs/architecture.md: {missing}"


def test_imports_point_down_the_layers():
    table, wrong = layers(), []
    for module, imported in package_modules().items():
        for target in imported:
            a, b = part(module), part(target)
            if a != b and table[b] >= table[a]:
                wrong.append(f"{module} imports {target} (layer {table[a]} -> {table[b]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_its_own_package():
    sources = [p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts]
    wrong = [f"{module_name(p)}, {hit}" for p in sources for hit in own_package_imports(p)]
    assert not wrong, "import the submodule itself:\n" + "\n".join(sorted(wrong))


def test_no_module_imports_itself_round_a_cycle():
    graph = package_modules()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_transport_imports_nothing_of_settings_agents_or_the_runtime():
    """Pinned here as well as in the table: settings check transport names and addresses by
    asking the transport, never the other way round."""
    wrong = [
        f"{module} imports {target}"
        for module, imported in package_modules().items()
        if part(module) == "transport"
        for target in imported
        if part(target) not in ("transport", "errors", "types")
    ]
    assert not wrong, "\n".join(sorted(wrong))
