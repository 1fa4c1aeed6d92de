"""switch_case: the branch taken, defaults, gradients (first and second order) against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

X0 = np.array([0.3, -1.2, 2.0])
W0 = np.array([[0.5, -0.2, 0.1], [0.3, 0.8, -0.6], [-0.4, 0.2, 0.9]])

TORCH_BRANCHES = {1: lambda x, w: torch.sin(x @ w), 4: lambda x, w: x * x * 3.0, 7: lambda x, w: torch.tanh(x) @ w}


def _ours(form):
    fns = {1: lambda x, w: rg.sin(x @ w), 4: lambda x, w: x * x * 3.0, 7: lambda x, w: rg.tanh(x) @ w}
    return {"dict": fns, "pairs": list(fns.items())}[form], lambda x, w: -x


def _program(form, with_default):
    def model():
        i = rg.data("i", [], dtype="int64")
        x = rg.data("x", [1, 3], dtype="float64", stop_gradient=False)
        w = rg.create_parameter("w", [3, 3], dtype="float64", init=W0)
        fns, default = _ours(form)
        y = rg.switch_case(i, {k: (lambda f=f: f(x, w)) for k, f in (fns.items() if isinstance(fns, dict) else fns)},
                           default=(lambda: default(x, w)) if with_default else None)
        loss = rg.sum(y * y)
        dx, dw = rg.gradients(loss, [x, w])
        ddx, = rg.gradients(rg.sum(dx * dx), x)
        return [y, dx, dw, ddx]
    return build(model)


def _torch(index, with_default):
    x = torch.tensor(X0[None], requires_grad=True)
    w = torch.tensor(W0, requires_grad=True)
    fn = TORCH_BRANCHES.get(index, (lambda x, w: -x) if with_default else TORCH_BRANCHES[7])
    y = fn(x, w)
    loss = (y * y).sum()
    dx, dw = torch.autograd.grad(loss, [x, w], create_graph=True, allow_unused=True, materialize_grads=True)
    ddx, = torch.autograd.grad((dx * dx).sum(), x, allow_unused=True, materialize_grads=True)
    return [y, dx, dw, ddx]


@pytest.mark.parametrize("form", ["dict", "pairs"])
@pytest.mark.parametrize("with_default", [True, False])
def test_switch_case_runs_the_matching_branch_with_gradients(form, with_default):
    main, startup, outs = _program(form, with_default)
    exe = executor(startup)
    for index in (1, 4, 7, 0, 9):
        got = exe.run(main, feed={"i": np.array(index), "x": X0[None]}, fetch_list=outs)
        for ours, want in zip(got, _torch(index, with_default)):
            np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_switch_case_list_of_functions_uses_positions_as_keys():
    def model():
        i = rg.data("i", [1], dtype="int32")
        x = rg.data("x", [2], dtype="float64")
        return rg.switch_case(i, [lambda: x + 1.0, lambda: x * 10.0, lambda: rg.cos(x)])
    main, startup, y = build(model)
    exe = executor(startup)
    x0 = np.array([0.5, 2.0])
    for index, want in [(0, x0 + 1.0), (1, x0 * 10.0), (2, np.cos(x0)), (5, np.cos(x0)), (-1, np.cos(x0))]:
        got, = exe.run(main, feed={"i": np.array([index], dtype=np.int32), "x": x0}, fetch_list=[y])
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("index, fns, default, match", [
    ("float", [lambda: None], None, "int32/int64 scalar"),
    ("int", [], None, "at least one branch"),
    ("int", {0: lambda: None, "a": lambda: None}, None, "distinct int keys"),
    ("int", [(1, lambda: None), (1, lambda: None)], None, "distinct int keys"),
    ("int", 3, None, "list of functions"),
    ("int", [lambda: None], 5, "default must be a function"),
])
def test_switch_case_bad_arguments_are_program_errors(index, fns, default, match):
    def model():
        i = rg.data("i", [], dtype="int64" if index == "int" else "float64")
        rg.switch_case(i, fns, default)
    with pytest.raises(rg.ProgramError, match=match):
        build(model)


def test_switch_case_branches_must_agree():
    def model():
        i = rg.data("i", [], dtype="int64")
        x = rg.data("x", [2], dtype="float64")
        rg.switch_case(i, [lambda: x, lambda: rg.concat([x, x], 0)])
    with pytest.raises(rg.ProgramError, match="branches must agree"):
        build(model)
