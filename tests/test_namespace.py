"""The public namespace: ``dir(rg)`` lists the API and the public subpackages, never internal modules
(issue 23: it listed 38, rg.loop_grad, rg.rounding_division, rg.streams, ...); every public function
has a docstring with an example; the API reference builds from them (pdoc, when installed)."""
from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

import retrograd as rg
import retrograd.ops

PUBLIC_SUBPACKAGES = {"backends", "distributed", "layers", "memory", "onnx", "optim", "passes", "testing"}


def test_dir_lists_no_internal_modules():
    modules = {name for name in dir(rg) if isinstance(getattr(rg, name), types.ModuleType)}
    assert modules == PUBLIC_SUBPACKAGES
    for internal in ("loop_grad", "rounding_division", "streams", "math", "nn", "registry", "trig"):
        assert internal not in dir(rg) and not hasattr(rg, internal), internal
    import retrograd.ops.control.loop_grad as loop_grad            # still importable under its own name
    assert loop_grad.__name__ == "retrograd.ops.control.loop_grad"


def test_all_holds_every_op_builder_and_the_api():
    builders = {name for name, value in vars(retrograd.ops).items()
                if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert builders <= set(rg.__all__)
    assert {"relu", "tanh", "Program", "Executor", "append_backward", "gradients", "save_params",
            "program_guard", "RetrogradError"} <= set(rg.__all__)
    assert set(dir(rg)) == set(rg.__all__) | {"__version__"}
    namespace: dict = {}
    exec("from retrograd import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(rg.__all__)


def test_layers_rnn_is_not_a_module_attribute():
    assert not hasattr(rg.layers, "rnn") and not hasattr(rg.layers, "common")
    assert {"fc", "embedding", "lstm", "gru", "milstm"} <= set(rg.layers.__all__)
    assert not any(isinstance(getattr(rg.layers, n), types.ModuleType) for n in dir(rg.layers)
                   if not n.startswith("_"))


def _public_functions():
    places = [("rg", rg)] + [(f"rg.{name}", getattr(rg, name)) for name in sorted(PUBLIC_SUBPACKAGES)]
    for where, module in places:
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value):
                yield f"{where}.{name}", value


def test_every_public_function_has_a_docstring_with_an_example():
    missing = [name for name, fn in _public_functions() if "Example" not in (inspect.getdoc(fn) or "")]
    assert not missing, f"public functions without an example in their docstring: {missing}"


def test_api_reference_builds_from_the_docstrings_without_warnings(tmp_path):
    """The README's docs command (pdoc, the [docs] extra), with warnings as errors."""
    pytest.importorskip("pdoc", reason='the API reference needs pdoc: pip install -e ".[docs]"')
    done = subprocess.run([sys.executable, "-W", "error", "-m", "pdoc", "retrograd", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warn" not in done.stderr.lower(), done.stderr[-3000:]
    assert (tmp_path / "retrograd.html").is_file() and (tmp_path / "retrograd" / "layers.html").is_file()
