"""Layers point down only (docs/concepts/architecture.md, DESIGN's Architecture section).

Every module's imports are read, function-level ones and ``import_module("...")`` included, and
so is the package ``__init__`` an import runs on the way (importing ``retrograd.ops.core.registry``
runs ``retrograd/ops/__init__.py``, which imports every op). The test fails on an import that
reaches a higher layer, and on any import circle, naming both files."""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "retrograd"

# Lowest first. A module may import its own layer (without a circle) and any layer below.
LAYERS = [
    ["errors"],
    ["ir"],
    ["backends"],
    ["ops"],
    ["autodiff"],
    ["passes"],
    ["memory"],
    ["runtime"],
    ["io", "options", "testing", "optim", "layers"],
    ["distributed", "amp"],
    ["onnx"],
    ["models"],
    ["cli", "__main__"],
]
# Entry points: scripts that live at a contract's path but belong to the command.
ENTRY_POINTS = {"retrograd.onnx.sampler": "cli"}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def named_targets(path: pathlib.Path, module: str):
    """Every retrograd module the file names in an import."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = absolute(node, module, is_package)
            for alias in node.names:
                yield f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            yield str(node.args[0].value)


def imports_of(module: str) -> set[str]:
    """The modules importing `module` runs: each named one and the packages above it."""
    found = set()
    for target in named_targets(MODULES[module], module):
        parts = target.split(".")
        if parts[0] != "retrograd":
            continue
        for depth in range(2, len(parts) + 1):   # not the top-level facade, `retrograd` itself
            name = ".".join(parts[:depth])
            if name in MODULES and name != module and not module.startswith(name + "."):
                found.add(name)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def layer_of(module: str) -> int:
    top = ENTRY_POINTS.get(module) or (module.split(".") + [""])[1]
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{MODULES[module]}: no layer for {top!r}; add it to LAYERS")


def test_every_module_has_a_layer():
    for module in MODULES:
        if module != "retrograd":
            layer_of(module)


def test_no_module_imports_a_higher_layer():
    upward = [f"{MODULES[m].relative_to(PACKAGE.parent)} imports {MODULES[d].relative_to(PACKAGE.parent)}"
              for m in sorted(GRAPH) if m != "retrograd"
              for d in sorted(GRAPH[m]) if layer_of(d) > layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(GRAPH[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circle():
    report = []
    for component in circles():
        members = set(component)
        edges = [f"  {MODULES[m].relative_to(PACKAGE.parent)} -> {MODULES[d].relative_to(PACKAGE.parent)}"
                 for m in component for d in sorted(GRAPH[m] & members)]
        report.append(f"circle of {len(component)} modules:\n" + "\n".join(edges))
    assert not report, "\n".join(report)


def test_the_checker_sees_a_function_level_upward_import(tmp_path):
    """The reading itself: a lazy import inside a function counts."""
    source = "def f():\n    from ..runtime import executor\n"
    node = ast.parse(source).body[0].body[0]
    assert absolute(node, "retrograd.ops.core.registry", False) == "retrograd.ops.runtime"
    assert absolute(node, "retrograd.backends.base", False) == "retrograd.runtime"


def test_no_directory_holds_more_than_fifteen_modules():
    crowded = {str(d.relative_to(PACKAGE.parent)): n for d in [PACKAGE, *PACKAGE.rglob("*/")]
               if d.is_dir() and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > 15}
    assert not crowded, crowded
