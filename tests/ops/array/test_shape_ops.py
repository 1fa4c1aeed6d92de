"""stack, broadcast_to, tile, pad and arange against PyTorch float64 and NumPy, values and two orders
of gradients, on every backend (NumPy, torch-CPU, the onnxruntime engine); shapes with -1; errors."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")
F = torch.nn.functional

pytestmark = pytest.mark.engine

R = np.random.default_rng(7)
A, B = R.standard_normal((2, 3)), R.standard_normal((2, 3))
V, COL = R.standard_normal(3), R.standard_normal((3, 1))

# name: (builder over Vars a, b, v, col; the same over torch tensors; NumPy's result shape)
CASES = {
    "stack axis 1": (lambda a, b, v, c: rg.stack([a, b], 1), lambda a, b, v, c: torch.stack([a, b], 1)),
    "stack axis -1 of three": (lambda a, b, v, c: rg.stack([a, b, a], -1),
                               lambda a, b, v, c: torch.stack([a, b, a], -1)),
    "broadcast_to new axes": (lambda a, b, v, c: rg.broadcast_to(v, [4, 2, 3]),
                              lambda a, b, v, c: v.broadcast_to(4, 2, 3)),
    "broadcast_to -1 keeps": (lambda a, b, v, c: rg.broadcast_to(c, [2, -1, 5]),
                              lambda a, b, v, c: c.broadcast_to(2, 3, 5)),
    "tile as many reps": (lambda a, b, v, c: rg.tile(a, [2, 3]), lambda a, b, v, c: a.tile(2, 3)),
    "tile more reps than axes": (lambda a, b, v, c: rg.tile(v, [2, 1, 2]), lambda a, b, v, c: v.tile(2, 1, 2)),
    "tile fewer reps than axes": (lambda a, b, v, c: rg.tile(a, 2), lambda a, b, v, c: a.tile(2)),
    "pad per axis with a value": (lambda a, b, v, c: rg.pad(a, [(1, 2), (0, 3)], 1.5),
                                  lambda a, b, v, c: F.pad(a, (0, 3, 1, 2), value=1.5)),
    "pad one int": (lambda a, b, v, c: rg.pad(v, 2), lambda a, b, v, c: F.pad(v, (2, 2))),
    "pad one pair for all axes": (lambda a, b, v, c: rg.pad(a, (1, 0)), lambda a, b, v, c: F.pad(a, (1, 0, 1, 0))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_two_orders_of_gradients_match_torch(backend, name):
    build, reference = CASES[name]
    arrays = [A, B, V, COL]
    weights = R.standard_normal(reference(*map(torch.tensor, arrays)).shape)

    def model():
        vars_ = [rg.data("a", [-1, 3], "float64", stop_gradient=False), rg.data("b", [2, -1], "float64", stop_gradient=False),
                 rg.data("v", [3], "float64", stop_gradient=False), rg.data("c", [-1, 1], "float64", stop_gradient=False)]
        y = build(*vars_)
        grads = rg.gradients(rg.sum(y * y * y * weights), vars_)
        used = [i for i, g in enumerate(grads) if g is not None]
        second = rg.gradients(rg.add_n([rg.sum(grads[i] * grads[i]) for i in used]), [vars_[i] for i in used])
        return used, [y] + [grads[i] for i in used] + second
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        used, fetch = model()
    got = backend.executor().run(main, feed=dict(zip("abvc", arrays)), fetch_list=fetch)
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = reference(*tensors)
    grads = torch.autograd.grad((y * y * y * torch.tensor(weights)).sum(), [tensors[i] for i in used],
                                create_graph=True)
    second = torch.autograd.grad(sum((g * g).sum() for g in grads), [tensors[i] for i in used])
    for i, (ours, want) in enumerate(zip(got, [y, *grads, *second])):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-11, atol=1e-12, err_msg=f"fetch {i}")


def test_declared_shapes_hold_minus_one_where_unknown():
    with rg.program_guard(rg.Program(), rg.Program()):
        a = rg.data("a", [-1, 3])
        assert rg.stack([a, a], 1).shape == (-1, 2, 3)
        assert rg.broadcast_to(a, [4, -1, 3]).shape == (4, -1, 3)
        assert rg.tile(a, [2, 2]).shape == (-1, 6)
        assert rg.pad(a, [(1, 1), (2, 0)]).shape == (-1, 5)
        assert rg.arange(rg.data("n", [], "int64")).shape == (-1,)
        assert rg.arange(2, 11, 3).shape == (3,)


@pytest.mark.parametrize("args, dtype", [((5,), "int64"), ((2, 9, 3), "int64"), ((9, -3, -2), "int64"),
                                         ((0.5, 3.0, 0.5), "float64"), ((1.0, 0.0, -0.25), "float32"),
                                         ((4, 1), "int64")])
def test_arange_matches_numpy_with_static_and_var_bounds(backend, args, dtype):
    want = np.arange(*args, dtype=dtype)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        static = rg.arange(*args, dtype=dtype)
        if dtype == "int64":     # the same range with start and stop fed at run time
            start, stop = (0, args[0]) if len(args) == 1 else args[:2]
            s, e = rg.data("s", [], "int64"), rg.data("e", [], "int64")
            fed = rg.arange(s, e, *args[2:])
    fetch = [static] + ([fed] if dtype == "int64" else [])
    feed = {"s": np.array(start), "e": np.array(stop)} if dtype == "int64" else {}
    for got in backend.executor().run(main, feed=feed, fetch_list=fetch):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert got.shape == want.shape


@pytest.mark.parametrize("build, match", [
    (lambda a: rg.stack([a, rg.data("b", [2, 4])]), r"Stack .*sizes of axis 1 differ: 3, 4"),
    (lambda a: rg.stack([a, rg.data("b", [2, 3], "float64")]), r"Stack .*share one dtype"),
    (lambda a: rg.stack([a, a], 3), r"axis 3 is out of range for rank 3"),
    (lambda a: rg.broadcast_to(a, [2, 4]), r"BroadcastTo .*size 3 to 4"),
    (lambda a: rg.broadcast_to(a, [3]), r"fewer axes"),
    (lambda a: rg.tile(a, [-1, 2]), r"reps .* must be >= 0"),
    (lambda a: rg.pad(a, [(1, 1)] * 3), r"one \(before, after\) pair per axis"),
    (lambda a: rg.pad(a, [(1, -1), (0, 0)]), r"pad sizes must be >= 0"),
    (lambda a: rg.arange(rg.data("f", [], "float32")), r"Arange .*int64 or int32 0-d Var"),
])
def test_bad_arguments_are_shape_errors_naming_the_op(build, match):
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ShapeError, match=match):
            build(rg.data("a", [2, 3]))


def test_arange_with_a_zero_step_is_refused():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ProgramError, match="step must not be 0"):
            rg.arange(0, 5, 0)


def test_broadcast_to_a_size_known_only_at_run_time_that_does_not_fit_is_an_execution_error(backend):
    """ONNX Expand broadcasts both ways (a [4, 3] "broadcast" to [1, 3] stays [4, 3]): the engine
    checks it as the kernels do."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.broadcast_to(rg.data("x", [-1, 3]), [2, 1, 3])
    exe = backend.executor()
    got, = exe.run(main, feed={"x": np.ones((1, 3), "float32")}, fetch_list=[y])
    assert got.shape == (2, 1, 3)
    with pytest.raises(rg.ExecutionError, match=r"BroadcastTo in block 0 failed: ValueError: cannot broadcast "
                                                r"\[4, 3\] to \[2, 1, 3\]"):
        exe.run(main, feed={"x": np.ones((4, 3), "float32")}, fetch_list=[y])
