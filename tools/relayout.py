"""Milestone 4's package layout (issue 31): move modules, rewrite every import that names them.

Deterministic and re-runnable on any branch based on the old layout (the lead runs it on each
helper branch before merging, so both sides make the same moves). Usage:
    python tools/relayout.py [ROOT]          # the package (then add the family __init__ files)
    python tools/relayout.py tests [ROOT]    # the tests, mirroring it
    python tools/relayout.py optim-ops [ROOT]      # the optimizers' update ops into ops/optim
    python tools/relayout.py memory-loops [ROOT]   # the loop budgets into memory/loops
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import textwrap
import sys

OPS_FAMILIES = {
    "core": {"registry": "registry", "lowering": "lowering", "shapes": "shapes", "calls": "calls",
             "subblocks": "subblocks", "subblock_grad": "subblock_grad", "streams": "streams"},
    "math": {"math": "elementwise", "activation": "activation", "special": "special",
             "logic": "logic", "trig": "trig", "rounding_division": "rounding_division"},
    "reduce": {"reduce": "reductions", "extrema": "extrema", "cumulative": "cumulative"},
    "array": {"creation": "creation", "tensor": "tensor", "shape_ops": "shape_ops",
              "indexing": "indexing", "einsum": "einsum", "random_ops": "random_ops"},
    "nn": {"nn": "softmax_dropout", "conv": "conv", "pool": "pool", "windows_onnx": "windows_onnx",
           "norm": "norm", "batch_norm": "batch_norm", "attention": "attention", "heads": "heads",
           "losses": "losses", "linear_cross_entropy": "linear_cross_entropy"},
    "control": {"cond": "cond", "do": "do", "while_loop": "while_loop", "loop_grad": "loop_grad",
                "loop_stacks": "loop_stacks", "scan": "scan", "tensor_array": "tensor_array",
                "custom_gradient": "custom_gradient"},
    "recurrent": {"recurrent": "network", "recurrent_grad": "network_grad",
                  "recurrent_grad_scan": "network_grad_scan", "recurrent_onnx": "network_onnx",
                  "recurrent_outputs": "outputs", "recurrent_steps": "steps", "rnn_cells": "cells",
                  "lstm_sequence": "lstm_sequence", "gru_sequence": "gru_sequence",
                  "sequence": "reverse_sequence", "sequence_onnx": "sequence_onnx"},
}
TOP = {  # the command and the models leave the library's top level
    "charlm": "models.charlm", "transformer_lm": "models.transformer_lm",
    "generation": "models.generation", "cli": "cli.main", "train": "cli.train",
    "sample": "cli.sample", "termplot": "cli.termplot", "plot": "cli.plot",
    "onnx.sampler": "cli.onnx_sampler",
}
TEST_FAMILIES = {  # tests mirror the package
    "ops/math": ["activation", "special", "trig", "rounding_division"],
    "ops/reduce": ["reduce", "extrema", "cumulative"],
    "ops/array": ["indexing", "einsum", "shape_ops", "random_ops"],
    "ops/nn": ["attention", "conv", "norm", "losses", "linear_cross_entropy"],
    "ops/control": ["cond", "control_flow", "custom_gradient", "scan", "tensor_array", "while_loop",
                    "random_in_loops", "readme_loops_complete"],
    "ops/recurrent": ["recurrent", "recurrent_grad", "recurrent_onnx", "recurrent_outputs",
                      "rnn_cells", "lstm_sequence", "gru_sequence", "readme_control_flow_recurrent"],
}
TEST_TOP = {"cli": ["cli", "train_cli"],
            "models": ["charlm", "charlm_fused", "transformer_lm", "generation"]}
NEW_PACKAGES = [f"ops/{f}" for f in OPS_FAMILIES] + ["models", "cli"]
# Phase 3: the optimizers' update ops are ops (a pass fuses them; passes sit below optim).
OPTIM_OPS = {"optim.ops": "ops.optim.updates", "optim.fused": "ops.optim.fused_adam"}
# Phase 4: the memory planner's loop budgets in their own subpackage (memory/ held 16 modules).
MEMORY_LOOPS = {f"memory.{name}": f"memory.loops.{name}" for name in
                ("rnn_budget", "schedules", "step_rows", "time_steps", "unhoist", "while_budget")}
PHASES = {"optim-ops": (OPTIM_OPS, "ops/optim"), "memory-loops": (MEMORY_LOOPS, "memory/loops")}


def module_map(phase: str = "package") -> dict[str, str]:
    if phase in PHASES:
        return {f"retrograd.{old}": f"retrograd.{new}" for old, new in PHASES[phase][0].items()}
    moves = {f"retrograd.{old}": f"retrograd.{new}" for old, new in TOP.items()}
    for family, mods in OPS_FAMILIES.items():
        for old, new in mods.items():
            moves[f"retrograd.ops.{old}"] = f"retrograd.ops.{family}.{new}"
    return moves


def module_of(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_of(module: str, root: pathlib.Path, is_package: bool) -> pathlib.Path:
    base = root.joinpath(*module.split("."))
    return base / "__init__.py" if is_package else base.with_suffix(".py")


def resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def relative(target: str, new_module: str, is_package: bool) -> str:
    """`target` written relative to the module `new_module`."""
    here = new_module.split(".") if is_package else new_module.split(".")[:-1]
    there = target.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    dots = "." * (len(here) - common + 1)
    return dots + ".".join(there[common:])


def remap(name: str, moves: dict[str, str]) -> str:
    for old in sorted(moves, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return moves[old] + name[len(old):]
    return name


def rewrite_source(text: str, module: str, new_module: str, is_package: bool,
                   moves: dict[str, str], known: set[str], inside: bool) -> str:
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("retrograd")):
            edits.append((node, from_import(node, module, new_module, is_package, moves, known, inside)))
        elif isinstance(node, ast.Import) and any(a.name.startswith("retrograd.") for a in node.names):
            names = ", ".join(remap(a.name, moves) + (f" as {a.asname}" if a.asname else "")
                              for a in node.names)
            edits.append((node, f"import {names}"))
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        if new is None:
            continue
        start = sum(len(l) for l in lines[:node.lineno - 1]) + node.col_offset
        end = sum(len(l) for l in lines[:node.end_lineno - 1]) + node.end_col_offset
        flat = "".join(lines)
        flat = flat[:start] + new + flat[end:]
        lines = flat.splitlines(keepends=True)
    return "".join(lines)


def from_import(node, module, new_module, is_package, moves, known, inside):
    target = resolve(node, module, is_package)
    groups: dict[str, list[str]] = {}
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
        if sub in known and remap(sub, moves) != sub:   # `from pkg import module`, moved
            parent, _, leaf = remap(sub, moves).rpartition(".")
            spelled = leaf + (f" as {alias.asname}" if alias.asname else f" as {alias.name}"
                              if leaf != alias.name else "")
            groups.setdefault(parent, []).append(spelled)
        else:
            groups.setdefault(remap(target, moves), []).append(spelled)
    if list(groups) == [target] and module == new_module:
        return None
    out = []
    for new_target, names in groups.items():
        spelled = relative(new_target, new_module, is_package) if inside else new_target
        out.append(wrapped(f"from {spelled} import ", names, node.col_offset))
    indent = "\n" + " " * node.col_offset
    return indent.join(out)


def wrapped(head: str, names: list[str], indent: int) -> str:
    """`head` + names, in parentheses over several lines when one would pass 100 columns."""
    flat = head + ", ".join(names)
    if indent + len(flat) <= 88:   # leaves room for a trailing `# noqa` comment
        return flat
    lines = textwrap.wrap(", ".join(names), width=99 - indent - len(head) - 1,
                          break_on_hyphens=False)
    pad = "\n" + " " * (indent + len(head) + 1)
    return head + "(" + pad.join(lines) + ")"


KEEP_SPELLING = {"retrograd.onnx.sampler"}   # `python -m retrograd.onnx.sampler`: a contract command


def rewrite_strings(text: str, moves: dict[str, str]) -> str:
    """Dotted module names in text outside import statements (those are rewritten already,
    and a new package's name can be an old module's: retrograd.cli)."""
    table = {old: new for old, new in moves.items() if old not in KEEP_SPELLING}
    pattern = "|".join(re.escape(name) for name in sorted(table, key=len, reverse=True))
    imports = import_lines(text)
    lines = text.splitlines(keepends=True)
    return "".join(line if number in imports else
                   re.sub(f"(?:{pattern})(?![\\w])", lambda m: table[m.group(0)], line)
                   for number, line in enumerate(lines, 1))


def import_lines(text: str) -> set[int]:
    try:
        tree = ast.parse(text)
    except SyntaxError:      # Markdown, TOML, shell: no imports to keep
        return set()
    return {n for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for n in range(node.lineno, node.end_lineno + 1)}


def main(root: pathlib.Path, phase: str = "package") -> None:
    moves = module_map(phase)
    pkg_root = root
    files = {}
    for path in sorted((root / "retrograd").rglob("*.py")):
        files[module_of(path, pkg_root)] = path
    known = set(files)
    # 1. rewrite imports inside the package as they will read from the new locations
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        new_module = remap(module, moves)
        text = path.read_text()
        new = rewrite_source(text, module, new_module, is_package, moves, known, inside=True)
        new = rewrite_strings(new, moves)
        if new != text:
            path.write_text(new)
    # 2. files outside the package: absolute imports and dotted strings
    for sub in ("tests", "benchmarks", "examples", "docs", "tools"):
        for path in sorted((root / sub).rglob("*")) if (root / sub).exists() else []:
            if path.suffix not in (".py", ".md") or path.name == "relayout.py":
                continue
            text = path.read_text()
            new = text
            if path.suffix == ".py":
                try:
                    new = rewrite_source(text, "", "", False, moves, known, inside=False)
                except SyntaxError:
                    pass
            new = rewrite_strings(new, moves)
            if new != text:
                path.write_text(new)
    for extra in ("pyproject.toml", ".ci/run"):
        p = root / extra
        if p.exists():
            p.write_text(rewrite_strings(p.read_text(), moves).replace(
                '"retrograd.cli.main:main"', '"retrograd.cli:main"'))
    # 3. move the files
    for package in NEW_PACKAGES if phase == "package" else [PHASES[phase][1]]:
        (root / "retrograd" / package).mkdir(parents=True, exist_ok=True)
    for old, new in moves.items():
        src = path_of(old, root, False)
        if src.exists():
            subprocess.run(["git", "mv", str(src), str(path_of(new, root, False))],
                           cwd=root, check=True)


def test_moves() -> dict[str, str]:
    moves = {}
    for family, names in TEST_FAMILIES.items():
        for name in names:
            moves[f"tests/ops/test_{name}.py"] = f"tests/{family}/test_{name}.py"
    for folder, names in TEST_TOP.items():
        for name in names:
            moves[f"tests/test_{name}.py"] = f"tests/{folder}/test_{name}.py"
    return moves


def deeper(text: str) -> str:
    """Paths a test builds from its own file, one folder deeper."""
    text = re.sub(r"parents\[(\d)\]", lambda m: f"parents[{int(m.group(1)) + 1}]", text)
    return text.replace(".parent.parent", ".parents[2]")


def move_tests(root: pathlib.Path) -> None:
    moves = test_moves()
    for old, new in moves.items():
        src, dst = root / old, root / new
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(deeper(src.read_text()))
        subprocess.run(["git", "mv", old, new], cwd=root, check=True)
    for listing in (root / ".ci/run", ):
        text = listing.read_text()
        for old, new in moves.items():
            text = re.sub(re.escape(old) + r"(?![\w])", new, text)
        listing.write_text(text)


if __name__ == "__main__":
    ROOT = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else ".").resolve()
    if sys.argv[1:2] == ["tests"]:
        move_tests(ROOT)
    elif sys.argv[1] in PHASES:
        main(ROOT, sys.argv[1])
    else:
        main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
