"""rg.einsum against torch.einsum (float64): values, gradients and second derivatives, on every
backend (NumPy, torch-CPU, the onnxruntime engine); NumPy's implicit output; equations that do not
match their operands are ShapeErrors naming the op and the line."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from torch.einsum")

pytestmark = pytest.mark.engine

R = np.random.default_rng(3)

# equation, operand shapes
EQUATIONS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),                         # implicit output: "ik"
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("ij,ij->", [(2, 3), (2, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii", [(3, 3)]),                                    # trace (implicit: no letter used once)
    ("ii->i", [(3, 3)]),                                 # diagonal
    ("ij->i", [(2, 3)]),                                 # j summed in one operand only
    ("...j,jk->...k", [(2, 2, 3), (3, 4)]),
    ("nhld,nhsd->nhls", [(2, 2, 3, 4), (2, 2, 5, 4)]),   # attention scores
]


@pytest.mark.parametrize("equation, shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_values_and_two_orders_of_gradients_match_torch(backend, equation, shapes):
    arrays = [R.standard_normal(s) for s in shapes]
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(f"x{i}", [-1] + list(s[1:]), "float64", stop_gradient=False) for i, s in enumerate(shapes)]
        y = rg.einsum(equation, *xs)
        grads = rg.gradients(rg.sum(rg.sin(y)), xs)
        second = rg.gradients(rg.add_n([rg.sum(g * g) for g in grads]), xs)
    got = backend.executor().run(main, feed={f"x{i}": a for i, a in enumerate(arrays)},
                                 fetch_list=[y, *grads, *second])
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    ty = torch.einsum(equation, *tensors)
    tgrads = torch.autograd.grad(torch.sin(ty).sum(), tensors, create_graph=True)
    tsecond = torch.autograd.grad(sum((g * g).sum() for g in tgrads), tensors)
    for i, (ours, want) in enumerate(zip(got, [ty, *tgrads, *tsecond])):
        assert ours.shape == tuple(want.shape), f"fetch {i}"
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"fetch {i}")


def test_implicit_output_and_ellipsis_give_numpys_shapes():
    with rg.program_guard(rg.Program(), rg.Program()):
        a, b = rg.data("a", [2, 3]), rg.data("b", [3, 4])
        assert rg.einsum("ij,jk", a, b).shape == (2, 4)
        assert rg.einsum("ba,bc", a, rg.data("c", [2, 5])).shape == (3, 5)       # alphabetical
        assert rg.einsum("...j,jk", rg.data("d", [-1, 2, 3]), b).shape == (-1, 2, 4)
        assert rg.einsum("ii", rg.data("m", [3, 3])).shape == ()


def test_numpy_arrays_are_constant_operands(backend):
    w = R.standard_normal((3, 2))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], "float64")
        y = rg.einsum("ij,jk->ik", x, w)
    a = R.standard_normal((4, 3))
    got, = backend.executor().run(main, feed={"x": a}, fetch_list=[y])
    np.testing.assert_allclose(got, a @ w, rtol=1e-12)


@pytest.mark.parametrize("equation, shapes, match", [
    ("ij,jk->ik", [[2, 3], [4, 5]], r"letter 'j' has size 3 and 4"),
    ("ij,jk->ik", [[2, 3]], r"names 2 operands, got 1"),
    ("ijk,jk", [[2, 3], [3, 4]], r"operand 0 has 2 axes but subscripts 'ijk'"),
    ("ij->ik", [[2, 3]], r"output 'ik' must name distinct letters of the inputs"),
    ("ij->ii", [[2, 3]], r"output 'ii' must name distinct letters"),
    ("i1,1->i", [[2, 3], [3]], r"may hold letters and one '...'"),
    ("ij->i->j", [[2, 3]], r"more than one '->'"),
])
def test_equation_not_matching_its_operands_is_a_shape_error_at_the_users_line(equation, shapes, match):
    with rg.program_guard(rg.Program(), rg.Program()):
        xs = [rg.data(f"x{i}", s) for i, s in enumerate(shapes)]
        with pytest.raises(rg.ShapeError, match=r"test_einsum\.py:\d+: Einsum in block 0: .*" + match):
            rg.einsum(equation, *xs)


def test_operands_of_different_dtypes_are_refused():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ShapeError, match="share one dtype"):
            rg.einsum("ij,jk", rg.data("a", [2, 3]), rg.data("b", [3, 4], "float64"))


def test_integer_einsum_has_no_gradient_but_runs(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.einsum("ij,j->i", rg.data("a", [2, 3], "int64"), rg.data("b", [3], "int64"))
    a, b = np.arange(6).reshape(2, 3), np.array([1, -1, 2])
    got, = backend.executor().run(main, feed={"a": a, "b": b}, fetch_list=[y])
    np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("equation, shapes", [
    ("ij,j->i", [(2, 3), (3,)]), ("bij,bjk->bki", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]),
    ("iij,j->", [(3, 3, 2), (2,)]), ("ij,ij,j->j", [(2, 3), (2, 3), (3,)]), ("ij,kl->ijkl", [(2, 2), (3, 1)])])
def test_integer_einsum_failed_on_cuda_baddbmm_so_torch_uses_a_broadcast_product(equation, shapes):
    """CUDA has no integer GEMM ("baddbmm_cuda" not implemented for 'Long'): the torch backend
    contracts integers there as one broadcast product and sum, checked here on the CPU."""
    torch = pytest.importorskip("torch")
    from retrograd.backends import torch_backend
    r = np.random.default_rng(5)
    arrays = [r.integers(-50, 50, s) for s in shapes]
    got = torch_backend._broadcast_einsum(torch, equation, [torch.tensor(a) for a in arrays])
    np.testing.assert_array_equal(got.numpy(), np.einsum(equation, *arrays))


_EMPTY_EINSUM_CHILD = """
import numpy as np, onnxruntime as ort, retrograd as rg
main, startup = rg.Program(), rg.Program()
with rg.program_guard(main, startup):
    x = rg.create_parameter("x", [0, 3, 4], "float64", init=np.zeros((0, 3, 4)))
    y = rg.create_parameter("y", [0, 4, 5], "float64", init=np.zeros((0, 4, 5)))
    out = rg.einsum("bij,bjk->bik", x, y)
    dx, dy = rg.gradients(rg.sum(out), [x, y])
exe = rg.Executor()
exe.run(startup)
fetch = [out, dx, dy]
for backend in ("numpy", "torch", "onnxruntime"):
    engine = rg.Executor(backend=backend)
    engine.run(startup)
    got = engine.run(main, fetch_list=fetch)
    assert [g.shape for g in got] == [(0, 3, 5), (0, 3, 4), (0, 4, 5)], (backend, [g.shape for g in got])
model = rg.onnx.export(main, None, [v.name for v in fetch], scope=exe.scope)
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
got = sess.run([v.name for v in fetch], {})
assert [g.shape for g in got] == [(0, 3, 5), (0, 3, 4), (0, 4, 5)], [g.shape for g in got]
print("ok")
"""


def test_einsum_of_parameters_empty_when_built_exports_without_killing_onnxruntime():
    """Regression (fuzzer, issue 32 item 15): an einsum whose operands are parameters with a 0 axis
    (initializers of the exported model, parameter inputs of the engine) killed the process with
    SIGFPE: onnxruntime folds an Einsum of initializers when the session is made, even in the
    branch of the If that guards an empty operand. An operand empty when built now lowers to the
    zeros alone. The check runs in a child process, so a regression fails this test instead of
    ending the run."""
    pytest.importorskip("onnxruntime", reason="the engine and the exported model run in onnxruntime")
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _EMPTY_EINSUM_CHILD], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), \
        f"exit status {done.returncode}\n{done.stderr[-2000:]}"
