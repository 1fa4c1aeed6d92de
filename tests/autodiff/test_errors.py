"""Bad input to append_backward / gradients: a ProgramError that names what is wrong."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.core.registry import OPS, append_op, defop
from retrograd.ops.core.shapes import same_as_first


def _net():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 2], dtype="float64")
        h = rg.tanh(x @ w)
        loss = rg.mean(h)
    return main, startup, x, w, h, loss


def test_non_scalar_loss_is_rejected_by_append_backward():
    main, startup, x, w, h, loss = _net()
    with rg.program_guard(main, startup), pytest.raises(rg.ProgramError, match=rf"'{h.name}'.*\[\?, 2\]"):
        rg.append_backward(h)


def test_loss_must_be_a_var_of_the_program():
    main, startup, x, w, h, loss = _net()
    ghost = rg.Var(main.global_block(), "ghost", [])           # never declared in the block
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ProgramError, match="ghost"):
            rg.append_backward(ghost)
        with pytest.raises(rg.ProgramError, match="ghost"):
            rg.gradients(ghost, [w])
        with pytest.raises(rg.ProgramError, match="Var"):
            rg.append_backward("loss")


def test_targets_and_inputs_from_another_program_are_rejected():
    main, startup, x, w, h, loss = _net()
    other_main, _, other_x, other_w, _, other_loss = _net()     # same names, other program
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ProgramError, match="w"):
            rg.gradients(loss, [other_w])
        with pytest.raises(rg.ProgramError, match=other_loss.name):
            rg.gradients([loss, other_loss], [w])
        with pytest.raises(rg.ProgramError, match="nope"):
            rg.gradients(loss, ["nope"])
        with pytest.raises(rg.ProgramError, match="w"):
            rg.append_backward(loss, parameter_list=[other_w])


@pytest.mark.parametrize("entry", ["x", "tanh", "missing"])
def test_parameter_list_naming_a_non_parameter(entry):
    main, startup, x, w, h, loss = _net()
    name = {"x": "x", "tanh": h.name, "missing": "missing"}[entry]
    with rg.program_guard(main, startup), pytest.raises(rg.ProgramError, match=f"'{name}'.*not a parameter"):
        rg.append_backward(loss, parameter_list=["w", name])


def test_no_grad_set_naming_an_unknown_variable():
    main, startup, x, w, h, loss = _net()
    with rg.program_guard(main, startup), pytest.raises(rg.ProgramError, match="missing"):
        rg.append_backward(loss, no_grad_set={"missing"})


def test_target_gradients_must_match_targets():
    main, startup, x, w, h, loss = _net()
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ProgramError, match="2 targets but 1"):
            rg.gradients([h, loss], [w], target_gradients=[h])
        with pytest.raises(rg.ProgramError, match=f"'{h.name}'.*must be a Var or an array"):
            rg.gradients([h], [w], target_gradients=["ones"])


@pytest.fixture
def no_grad_op():
    """A throwaway float op registered without a gradient maker; removed afterwards."""
    @defop("TestNoGradient", infer=same_as_first)
    def _kernel(k, x):
        return x * 2.0
    try:
        yield lambda x: append_op("TestNoGradient", [x])[0]
    finally:
        del OPS["TestNoGradient"]


def test_op_without_gradient_maker_on_the_path_is_named(no_grad_op):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 2], dtype="float64")
        h = x @ w
        doubled = no_grad_op(h)
        loss = rg.mean(doubled)
        with pytest.raises(rg.ProgramError) as info:
            rg.append_backward(loss)
        message = str(info.value)
        assert "TestNoGradient" in message and doubled.name in message and h.name in message
        assert "stop_gradient" in message              # says what to do instead
        with pytest.raises(rg.ProgramError, match="TestNoGradient"):
            rg.gradients(loss, [x])


def test_op_without_gradient_maker_off_the_path_is_fine(no_grad_op):
    xv = np.arange(6.0).reshape(2, 3)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 2], dtype="float64", init=np.ones((3, 2)))
        side = no_grad_op(x @ w)                        # depends on w but does not reach the loss
        frozen = no_grad_op(x)                          # on the path, but nothing before it needs a gradient
        loss = rg.sum(frozen @ w)
        (_, grad), = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    got, _ = exe.run(main, feed={"x": xv}, fetch_list=[grad, side])
    np.testing.assert_allclose(got, np.repeat((2 * xv).sum(0)[:, None], 2, axis=1))


def test_unreachable_and_integer_inputs_get_none():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        unused = rg.data("unused", [-1, 3], dtype="float64")
        ids = rg.data("ids", [2], dtype="int64")
        w = rg.create_parameter("w", [3, 2], dtype="float64")
        blocked = rg.stop_gradient(x * 2.0)
        loss = rg.sum(rg.gather(blocked @ w, ids))
        gx, gu, gids, gw, gb = rg.gradients(loss, [x, unused, ids, w, blocked])
    assert gx is None and gu is None and gids is None
    assert gw is not None and gb is not None          # asked about directly, a stop_gradient var answers
    with rg.program_guard(main, startup):
        params_grads = rg.append_backward(loss, no_grad_set={"w"})
    assert params_grads == []


def test_overwritten_forward_value_is_an_error_not_wrong_numbers():
    """Regression: y = 2x; y <- y*y (written in place); the gradient of y*y read the new y."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3], dtype="float64")
        y = x * 2.0
        rg.assign(y * y, output=y)
        loss = rg.sum(y)
        with pytest.raises(rg.ProgramError, match=rf"Mul.*'{y.name}'.*Assign.*overwrites"):
            rg.gradients(loss, x)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):                 # the same computation into a fresh variable
        x = rg.data("x", [3], dtype="float64")
        y = x * 2.0
        loss = rg.sum(rg.assign(y * y))
        gx, = rg.gradients(loss, x)
    value, = rg.Executor().run(main, feed={"x": np.array([1.0, 2.0, 3.0])}, fetch_list=[gx])
    np.testing.assert_allclose(value, 8.0 * np.array([1.0, 2.0, 3.0]))       # d/dx 4x^2


def test_gradient_after_optimizer_update_is_an_error():
    """The update rewrites w; a later backward through x @ w would read the new w."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 2], dtype="float64")
        loss = rg.mean(rg.tanh(x @ w))
        rg.optim.SGD(0.1).minimize(loss)
        with pytest.raises(rg.ProgramError, match=r"MatMul.*'w'.*before optimizer updates"):
            rg.gradients(loss, x)


def test_append_backward_of_a_loss_without_trainable_parameters_names_the_loss():
    """Issue 23: append_backward silently returned [] for a loss no trainable parameter
    reaches; it names the loss (and its line) unless parameter_list=[] asked for nothing."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        loss = rg.mean(x * x)
        with pytest.raises(rg.ProgramError, match=rf"test_errors.py:\d+: append_backward: loss "
                                                  rf"'{loss.name}' depends on no trainable parameter"):
            rg.append_backward(loss)
        assert rg.append_backward(loss, parameter_list=[]) == []
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 2], dtype="float64")
        frozen = rg.create_parameter("frozen", [3], dtype="float64")
        other = rg.mean(x @ w)
        loss = rg.mean(x * frozen)
        with pytest.raises(rg.ProgramError, match="none of the 1 parameter"):
            rg.append_backward(loss, parameter_list=[w])
        assert [p.name for p, _ in rg.append_backward(other)] == ["w"]
