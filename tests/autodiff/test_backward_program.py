"""The backward pass as a program: its printed form and the ops it is made of."""
from __future__ import annotations

import textwrap

import numpy as np

import retrograd as rg

GOLDEN_MLP = textwrap.dedent("""\
    block 0:
      data x: float32[?, 4]
      param fc.w: float32[4, 2]
      param fc.b: float32[2]
      matmul_0: float32[?, 2] = MatMul(x, fc.w)
      add_0: float32[?, 2] = Add(matmul_0, fc.b)
      tanh_0: float32[?, 2] = Tanh(add_0)
      mul_0: float32[?, 2] = Mul(tanh_0, tanh_0)
      mul_0.shape: float32[?, 2] = ShapeStandIn(mul_0)
      mean_0: float32[] = Mean(mul_0; axis=None, keepdims=False)
      mean_1: float32[] = Mean(tanh_0; axis=None, keepdims=False)
      add_1: float32[] = Add(mean_0, mean_1)
      add_1.grad: float32[] = FillLike(add_1; value=1.0, dtype=None)
      tanh_0.grad.part_0: float32[?, 2] = ExpandAs(add_1.grad, tanh_0; axes=[0, 1], mean_axes=[0, 1])
      mul_0.grad: float32[?, 2] = ExpandAs(add_1.grad, mul_0.shape; axes=[0, 1], mean_axes=[0, 1])
      tanh_0.grad.part_1: float32[?, 2] = Mul(mul_0.grad, tanh_0)
      tanh_0.grad.part_2: float32[?, 2] = Mul(mul_0.grad, tanh_0)
      tanh_0.grad: float32[?, 2] = AddN(tanh_0.grad.part_0, tanh_0.grad.part_1, tanh_0.grad.part_2)
      mul_3: float32[?, 2] = Mul(tanh_0, tanh_0)
      const_0: float32[] = Constant(value=1.0, shape=[], dtype='float32')
      sub_0: float32[?, 2] = Sub(const_0, mul_3)
      add_0.grad: float32[?, 2] = Mul(tanh_0.grad, sub_0)
      fc.b.grad: float32[2] = SumTo(add_0.grad, fc.b)
      fc.w.grad: float32[4, 2] = MatMul(x, add_0.grad; transpose_x=True)""")


def test_printed_backward_of_a_small_mlp_is_golden():
    """Gradient names follow the forward ones: the seed is '<loss>.grad', a summed
    gradient '<x>.grad' with its contributions '<x>.grad.part_N'. A gradient reading a forward
    value only for its shape reads a stand-in written right after it ('mul_0.shape'), so the
    value itself can be freed after the forward's last use (memory/shape_reads.py)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("fc.w", [4, 2])
        b = rg.create_parameter("fc.b", [2])
        h = rg.tanh(x @ w + b)
        loss = rg.mean(h * h) + rg.mean(h)
        rg.append_backward(loss)
    assert str(main) == GOLDEN_MLP


def test_mul_of_a_var_by_itself_needs_no_sum_to():
    """Regression: x * x with an unknown batch size reduced each half of its gradient
    with a SumTo, as if x could have been broadcast against itself."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        gx, = rg.gradients(rg.sum(x * x), x)
    assert "SumTo" not in {op.type for op in main.global_block().ops}
    xv = np.arange(6.0).reshape(2, 3)
    value, = rg.Executor().run(main, feed={"x": xv}, fetch_list=[gx])
    np.testing.assert_allclose(value, 2.0 * xv)


def test_second_backward_names_do_not_clash_and_read_well():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2], dtype="float64")
        w = rg.create_parameter("w", [2], dtype="float64")
        loss = rg.sum(rg.tanh(x * w))
        (_, g1), = rg.append_backward(loss)
        g2, = rg.gradients(loss, w)
        g3, = rg.gradients(rg.sum(g1), w)
    assert (g1.name, g2.name) == ("w.grad", "w.grad_0")
    assert g3.name.startswith("w.grad")
    assert len({g1.name, g2.name, g3.name}) == 3


def test_sub_block_gradients_leave_the_plain_name_to_the_outer_backward():
    """The gradient of a parameter read inside cond branches is 'w.grad' in block 0;
    the branches' own backward blocks name theirs 'w.grad.b<block>'."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2], dtype="float64")
        w = rg.create_parameter("w", [2, 2], dtype="float64")
        h = rg.cond(rg.sum(x) > 0.0, lambda: rg.tanh(x @ w), lambda: x @ w * 2.0)
        (_, grad), = rg.append_backward(rg.mean(h * h))
    assert grad.name == "w.grad" and grad.block.idx == 0
    inner = [(b.idx, name) for b in main.blocks[1:] for name in b.vars if name.startswith("w.grad")]
    assert len(inner) == 2 and all(name == f"w.grad.b{idx}" for idx, name in inner), inner
