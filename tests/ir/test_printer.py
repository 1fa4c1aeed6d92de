"""The printed program is the debugging interface: golden texts keep it stable."""
from __future__ import annotations

import numpy as np

import retrograd as rg
from retrograd.ir.printer import format_block, format_op
from retrograd.ir.program import Op, Program


def _golden_program() -> Program:
    """Every kind of line the printer makes, built by hand so names are fixed."""
    program = Program()
    g = program.global_block()
    g.create_var("x", [-1, 4], is_data=True)
    g.create_var("fc.w", [4, 3], persistable=True, trainable=True, is_parameter=True)
    g.create_var("step", [], "int64", persistable=True)
    g.create_var("h", [-1, 3])
    g.create_var("out", [-1, 1])
    g.create_var("table", [3, 4])
    g.create_var("mask", [-1, 3], "bool")
    g.append_op(Op("MatMul", ["x", "fc.w"], ["h"], {"transpose_y": False}))
    body = program.create_block(g)
    body.create_var("h_in", [-1, 3])
    body.create_var("t", [-1, 3])
    body.create_var("s", [-1, 1], "float64")
    body.append_op(Op("Tanh", ["h_in"], ["t"]))
    body.append_op(Op("Sum", ["t"], ["s"], {"axis": [1], "keepdims": True}))
    g.append_op(Op("CallBlock", ["h"], ["out"], {"body": body, "binds": ["h_in"], "results": ["s"]}))
    g.append_op(Op("Constant", [], ["table"], {"value": np.arange(12.0).reshape(3, 4).tolist(),
                                                "shape": [3, 4], "dtype": "float32"}))
    g.append_op(Op("Greater", ["h", "h"], ["mask"]))
    g.append_op(Op("Print", ["mask"], [], {"message": "it's", "scale": 0.5, "pair": (1, None)}))
    return program


GOLDEN = """\
block 0:
  data x: float32[?, 4]
  param fc.w: float32[4, 3]
  state step: int64[]
  h: float32[?, 3] = MatMul(x, fc.w; transpose_y=False)
  out: float32[?, 1] = CallBlock(h; body=block 1, binds=['h_in'], results=['s'])
    block 1 (parent 0):
      bound h_in: float32[?, 3]
      t: float32[?, 3] = Tanh(h_in)
      s: float64[?, 1] = Sum(t; axis=[1], keepdims=True)
  table: float32[3, 4] = Constant(value=[12 values], shape=[3, 4], dtype='float32')
  mask: bool[?, 3] = Greater(h, h)
  Print(mask; message="it's", scale=0.5, pair=(1, None))"""


def test_program_prints_as_golden_text():
    assert str(_golden_program()) == GOLDEN


def test_nested_sub_blocks_indent_under_their_op():
    program = Program()
    g = program.global_block()
    g.create_var("a", [2], is_data=True)
    g.create_var("b", [2])
    outer = program.create_block(g)
    outer.create_var("a_in", [2])
    outer.create_var("c", [2])
    inner = program.create_block(outer)
    inner.create_var("c_in", [2])
    inner.create_var("d", [2])
    inner.append_op(Op("Exp", ["c_in"], ["d"]))
    outer.append_op(Op("CallBlock", ["a_in"], ["c"], {"body": inner}))
    g.append_op(Op("CallBlock", ["a"], ["b"], {"body": outer}))
    assert str(program) == """\
block 0:
  data a: float32[2]
  b: float32[2] = CallBlock(a; body=block 1)
    block 1 (parent 0):
      bound a_in: float32[2]
      c: float32[2] = CallBlock(a_in; body=block 2)
        block 2 (parent 1):
          bound c_in: float32[2]
          d: float32[2] = Exp(c_in)"""


def test_unreferenced_blocks_are_printed_after_the_global_block():
    program = Program()
    orphan = program.create_block(program.global_block())
    orphan.create_var("v", [1])
    orphan.append_op(Op("Neg", ["v"], ["v"]))
    assert str(program) == "block 0:\nblock 1 (parent 0):\n  v: float32[1] = Neg(v)"


def test_block_referenced_twice_prints_once():
    program = Program()
    g = program.global_block()
    body = program.create_block(g)
    g.append_op(Op("Loop", [], [], {"body": body}))
    g.append_op(Op("LoopGrad", [], [], {"fwd": body}))
    assert str(program) == ("block 0:\n  Loop(body=block 1)\n    block 1 (parent 0):\n"
                            "  LoopGrad(fwd=block 1)")


def test_printing_never_needs_a_valid_program():
    program = Program()
    program.global_block().append_op(Op("NoSuchOp", ["ghost"], ["phantom"], {"blocks": []}))
    assert str(program) == "block 0:\n  phantom: <undeclared> = NoSuchOp(ghost; blocks=[])"


def test_format_op_and_block_of_a_built_program():
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        w = rg.create_parameter("fc1.w", [8, 16])
        h = rg.matmul(x, w)
    block = main.global_block()
    assert format_op(block.ops[0], block) == f"{h.name}: float32[?, 16] = MatMul(x, fc1.w)"
    assert format_block(block).splitlines()[:3] == [
        "block 0:", "  data x: float32[?, 8]", "  param fc1.w: float32[8, 16]"]


def test_deeply_nested_blocks_print_without_recursion_error():
    """Printing is how faults are shown: it must work on programs the verifier rejects."""
    program = Program()
    outer = program.global_block()
    for _ in range(3000):
        inner = program.create_block(outer)
        outer.append_op(Op("If", [], [], {"blocks": [inner]}))
        outer = inner
    text = str(program)
    headers = [line.strip() for line in text.splitlines() if line.strip().startswith("block ")]
    assert len(headers) == 3001                              # every block, once
    assert "(block 33 is printed below)" in text
    assert max(len(line) - len(line.lstrip()) for line in text.splitlines()) <= 2 * 2 * 33 + 6
