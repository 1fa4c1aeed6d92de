"""The memory package sits above autodiff and ops: nothing below imports it (the circles
autodiff/backward <-> memory/recompute <-> memory/auto and ops/recurrent* <-> memory/rnn_budget are
gone), and no module imports another's private names."""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "retrograd"


def _imports(path: pathlib.Path):
    """(module imported, names) of every import in the file, functions included."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or ""), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_autodiff_ops_ir_and_runtime_never_import_memory():
    offenders = []
    for sub in ("autodiff", "ops", "ir", "runtime"):
        for path in (PACKAGE / sub).rglob("*.py"):
            for module, _ in _imports(path):
                if module.lstrip(".").startswith("memory") or module.startswith("retrograd.memory"):
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not offenders, offenders


def test_memory_and_recurrent_modules_import_no_private_names():
    paths = list((PACKAGE / "memory").rglob("*.py")) + list((PACKAGE / "ops" / "recurrent").glob("*.py"))
    offenders = [f"{p.relative_to(PACKAGE)}: {module} {name}" for p in paths
                 for module, names in _imports(p) for name in names
                 if name.startswith("_") and module != "__future__"]
    assert not offenders, offenders


def test_recurrent_grad_does_not_import_recurrent():
    modules = [m for m, _ in _imports(PACKAGE / "ops" / "recurrent" / "network_grad.py")]
    assert ".network" not in modules
