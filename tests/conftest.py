"""Fixtures shared across the test tree."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import retrograd as rg
from retrograd.ops.core.registry import OPS, OpDef


@dataclass(frozen=True)
class BackendParam:
    """A backend and device the tests run on: ``rg.Executor(**backend.kwargs)``."""

    name: str
    device: str | None

    @property
    def kwargs(self) -> dict:
        return {"backend": self.name, "device": self.device}

    def executor(self, scope=None) -> "rg.Executor":
        return rg.Executor(scope, backend=self.name, device=self.device)

    def __str__(self) -> str:
        return self.name if self.device is None else f"{self.name}-{self.device}"


def _unavailable(name: str, device: str | None) -> str | None:
    """Why ``name`` on ``device`` cannot run here (None when it can)."""
    try:
        rg.Executor(backend=name, device=device)
    except rg.BackendError as exc:
        return str(exc)
    return None


BACKEND_PARAMS = [
    pytest.param(BackendParam("numpy", None), id="numpy"),
    pytest.param(BackendParam("torch", "cpu"), id="torch-cpu"),
    pytest.param(BackendParam("torch", "cuda"), id="torch-cuda"),
    pytest.param(BackendParam("cupy", "cuda"), id="cupy"),
    pytest.param(BackendParam("onnxruntime", None), id="onnxruntime"),
]


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: the module's tests also run on the onnxruntime engine "
                            '(backend="onnxruntime"); without it the engine\'s case is skipped')
    config.addinivalue_line("markers", "engine_skip(reason): the test checks what only array backends "
                            "have (buffer views, the executor's memory plan, a kernel's message)")
    config.addinivalue_line("markers", "engine_gap(reason): not yet supported by the ONNX export: "
                            "expected to fail on the engine (strict, so a fix shows)")


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> BackendParam:
    """Every backend the test should pass on: numpy and torch-cpu always (CI), torch-cuda and
    cupy where a GPU and the library are present (skipped with the reason elsewhere), and the
    onnxruntime engine in modules marked ``pytest.mark.engine``."""
    param = request.param
    reason = _unavailable(param.name, param.device)
    if reason is not None:
        pytest.skip(f"{param} unavailable: {reason}")
    if param.name == "onnxruntime":
        _engine_marks(request.node)
    return param


def _engine_marks(node) -> None:
    """Skip or expect failure on the onnxruntime engine as the test's marks say."""
    if node.get_closest_marker("engine") is None:
        pytest.skip("this module is not run on the onnxruntime engine (no pytest.mark.engine)")
    skip = node.get_closest_marker("engine_skip")
    if skip is not None:
        pytest.skip(f"not on the onnxruntime engine: {skip.args[0]}")
    gap = node.get_closest_marker("engine_gap")
    if gap is not None:
        node.add_marker(pytest.mark.xfail(reason=f"onnxruntime engine: {gap.args[0]}", strict=True))


def _call_block_rule(ins, attrs):
    body = attrs["body"]
    return [(body.var(name).shape, body.var(name).dtype) for name in attrs["results"]]


def _call_block_kernel(k, *arrays):
    results = k.run.run_block(k.attrs["body"], dict(zip(k.attrs["binds"], arrays)), k.attrs["results"])
    return results[0] if len(results) == 1 else tuple(results)


@pytest.fixture
def call_block():
    """Register, for one test, ``CallBlock``: the smallest op that runs a sub-block.

    ``CallBlock(*xs; body=<block>, binds=[inner names], results=[inner names])``
    binds its inputs to the body's declared vars and returns the body's
    ``results``. Tests of the IR and runtime use it to build sub-blocks by hand
    without depending on the control-flow ops. It is removed afterwards, so
    tests that walk the whole registry never meet it.
    """
    assert "CallBlock" not in OPS
    OPS["CallBlock"] = OpDef("CallBlock", _call_block_kernel, _call_block_rule,
                             inputs=("xs*",), outputs=("outs*",))
    yield "CallBlock"
    del OPS["CallBlock"]
