"""The verifier: each fault raises ProgramError naming block, op (index and type) and variable."""
from __future__ import annotations

import re

import pytest

import retrograd as rg
from retrograd.errors import ProgramError, ShapeError
from retrograd.ir import block_guard
from retrograd.ir.program import Op, Program
from retrograd.ir.verify import verify_program


def _base() -> Program:
    """x (data) and w (parameter) in block 0, and nothing else."""
    program = Program()
    g = program.global_block()
    g.create_var("x", [-1, 4], is_data=True)
    g.create_var("w", [4, 3], persistable=True, trainable=True, is_parameter=True)
    return program


def _fails(program: Program, *fragments: str, cls=ProgramError) -> str:
    with pytest.raises(cls) as info:
        verify_program(program)
    message = str(info.value)
    for fragment in fragments:
        assert re.search(fragment, message), f"{fragment!r} not in:\n{message}"
    return message


def test_well_formed_programs_pass(call_block):
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("fc.w", [4, 3])
        h = rg.tanh(rg.matmul(x, w) + 1.0)
        loss = rg.mean(rg.sum(h * h, axis=1))
        rg.append_backward(loss)
    verify_program(main)
    verify_program(startup)


def test_unregistered_op_type():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, 4])
    g.append_op(Op("Tanh", ["x"], ["y"]))
    g.append_op(Op("Frobnicate", ["y"], ["y"]))
    _fails(program, r"block 0, op #1 Frobnicate", r"'Frobnicate' is not registered",
           r"y: float32\[\?, 4\] = Frobnicate\(y\)")


def test_undeclared_input_and_output():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, 3])
    g.append_op(Op("MatMul", ["x", "v"], ["y"]))
    _fails(program, r"block 0, op #0 MatMul", r"input 'v' is not declared in block 0")

    program = _base()
    program.global_block().append_op(Op("MatMul", ["x", "w"], ["nowhere"]))
    _fails(program, r"block 0, op #0 MatMul", r"output 'nowhere' is not declared")


def test_variable_of_a_child_block_is_not_visible_in_the_parent():
    program = _base()
    sub = program.create_block(program.global_block())
    sub.create_var("inner", [-1, 4])
    g = program.global_block()
    g.create_var("y", [-1, 4])
    g.append_op(Op("Tanh", ["inner"], ["y"]))
    _fails(program, r"block 0, op #0 Tanh", r"input 'inner' is not declared")


def test_sub_block_parent_mismatch(call_block):
    program = _base()
    g = program.global_block()
    b1 = program.create_block(g)
    b2 = program.create_block(g)          # a sibling of b1, not its child
    b1.create_var("a", [-1, 4])
    b1.create_var("b", [-1, 4])
    b1.append_op(Op("CallBlock", ["a"], ["b"], {"body": b2, "binds": [], "results": []}))
    g.create_var("out", [-1, 4])
    g.append_op(Op("Tanh", ["x"], ["out"], {"body": b1}))
    _fails(program, r"block 1, op #0 CallBlock", r"sub-block 2 has parent 0", r"block 1")


def test_block_parent_must_be_an_earlier_block():
    program = _base()
    sub = program.create_block(program.global_block())
    sub.parent_idx = 1
    _fails(program, r"block 1 has parent 1")


def test_read_before_any_write_in_the_global_block():
    program = _base()
    g = program.global_block()
    g.create_var("t", [-1, 4])
    g.create_var("u", [-1, 4])
    g.append_op(Op("Tanh", ["t"], ["u"]))      # t is written only by the next op
    g.append_op(Op("Exp", ["x"], ["t"]))
    _fails(program, r"block 0, op #0 Tanh", r"'t' \(an input\) is read before any op writes it")


def test_never_written_intermediate_is_a_fault_but_data_and_persistables_are_not():
    program = _base()
    g = program.global_block()
    g.create_var("ghost", [-1, 3])
    g.create_var("y", [-1, 3])
    g.create_var("state", [-1, 3], persistable=True)
    g.create_var("z", [-1, 3])
    g.append_op(Op("MatMul", ["x", "w"], ["y"]))   # x: data, w: parameter
    g.append_op(Op("Add", ["y", "state"], ["z"]))  # state: persistable
    verify_program(program)
    g.append_op(Op("Add", ["z", "ghost"], ["z"]))
    _fails(program, r"block 0, op #2 Add", r"'ghost' \(an input\) is read before any op writes it")


def test_sub_block_may_read_bound_vars_and_outer_vars(call_block):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1, 3])
        scale = rg.create_parameter("scale", [3])
        g = main.global_block()
        h = rg.tanh(x)
        body = main.create_block(g)
        h_in = body.create_var("h_in", [-1, 3])   # bound by CallBlock, written by no op
        with block_guard(body):
            y = h_in * scale + h                  # reads a parameter and an earlier outer value
        out = g.create_var("out", [-1, 3])
        # The executor runs a sub-block on what its op binds, outer values included.
        g.append_op(Op("CallBlock", [h.name, scale.name, h.name], ["out"],
                       {"body": body, "binds": ["h_in", scale.name, h.name], "results": [y.name]}))
    verify_program(main)
    exe = rg.Executor()
    exe.scope.set("scale", [1.0, 2.0, 3.0])
    out_v, = exe.run(main, feed={"x": [[0.0, 1.0, -1.0]]}, fetch_list=[out])
    t = __import__("numpy").tanh([0.0, 1.0, -1.0])
    assert abs(out_v - (t * [1.0, 2.0, 3.0] + t)).max() < 1e-6


def test_sub_block_reading_an_outer_value_before_it_is_written(call_block):
    program = _base()
    g = program.global_block()
    g.create_var("late", [-1, 4])
    g.create_var("out", [-1, 4])
    body = program.create_block(g)
    body.create_var("r", [-1, 4])
    body.append_op(Op("Add", ["x", "late"], ["r"]))
    g.append_op(Op("CallBlock", [], ["out"], {"body": body, "binds": [], "results": ["r"]}))
    g.append_op(Op("Exp", ["x"], ["late"]))
    _fails(program, r"block 0, op #0 CallBlock", r"'late' \(read by a sub-block\) is read before")


def test_sub_block_var_read_before_its_own_block_writes_it(call_block):
    program = _base()
    g = program.global_block()
    body = program.create_block(g)
    body.create_var("p", [-1, 4])
    body.create_var("q", [-1, 4])
    body.append_op(Op("Exp", ["q"], ["p"]))    # q is written below: not bound, just out of order
    body.append_op(Op("Exp", ["x"], ["q"]))
    g.create_var("out", [-1, 4])
    g.append_op(Op("CallBlock", [], ["out"], {"body": body, "binds": [], "results": ["p"]}))
    _fails(program, r"block 1, op #0 Exp", r"'q' \(an input\) is read before")


def test_declared_output_shape_must_match_the_rule():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, 5])
    g.append_op(Op("MatMul", ["x", "w"], ["y"]))
    _fails(program, r"block 0, op #0 MatMul", r"output 'y' is declared float32\[\?, 5\]",
           r"gives float32\[\?, 3\]", cls=ShapeError)


def test_unknown_dims_match_anything_but_rank_must_agree():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, -1])
    g.append_op(Op("MatMul", ["x", "w"], ["y"]))
    verify_program(program)
    g.vars["y"].shape = (-1, 3, 1)
    _fails(program, r"output 'y' is declared float32\[\?, 3, 1\]", cls=ShapeError)


def test_declared_output_dtype_must_match_the_rule():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, 4], "float64")
    g.append_op(Op("Tanh", ["x"], ["y"]))
    _fails(program, r"block 0, op #0 Tanh", r"output 'y' is declared float64", r"gives float32",
           cls=ShapeError)


def test_shape_rule_rejecting_the_inputs():
    program = _base()
    g = program.global_block()
    g.create_var("m", [5, 2], is_data=True)
    g.create_var("z", [-1, 2])
    g.append_op(Op("MatMul", ["x", "m"], ["z"]))   # inner dimensions 4 and 5
    _fails(program, r"block 0, op #0 MatMul", r"inner dimensions differ", r"x: float32\[\?, 4\]",
           cls=ShapeError)


def test_wrong_number_of_outputs():
    program = _base()
    g = program.global_block()
    g.create_var("a", [-1, 4])
    g.create_var("b", [-1, 4])
    g.append_op(Op("Tanh", ["x"], ["a", "b"]))
    _fails(program, r"block 0, op #0 Tanh", r"produces 1 outputs, the op lists 2")


def test_missing_attribute_is_a_program_error_not_a_key_error():
    program = _base()
    g = program.global_block()
    g.create_var("s", [])
    g.append_op(Op("Sum", ["x"], ["s"]))           # no axis / keepdims
    _fails(program, r"block 0, op #0 Sum", r"shape rule failed \(KeyError")


def test_executor_verifies_before_running():
    program = _base()
    g = program.global_block()
    g.create_var("y", [-1, 4])
    g.append_op(Op("Softsign", ["x"], ["y"]))
    with pytest.raises(ProgramError, match=r"block 0, op #0 Softsign"):
        rg.Executor().run(program, feed={"x": [[1.0, 2.0, 3.0, 4.0]]}, fetch_list=["y"])


def test_ir_package_imports_nothing_but_itself_and_errors():
    """The IR depends on nothing: the verifier reaches op schemas through a hook the ops register."""
    import ast
    from pathlib import Path
    ir_dir = Path(rg.__file__).parent / "ir"
    foreign = []
    for path in sorted(ir_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                target = (node.module or "").split(".")[0]
                if node.level > 1 and target != "errors":
                    foreign.append(f"{path.name}: from {'.' * node.level}{node.module}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                foreign += [f"{path.name}: import {n}" for n in names if n and n.startswith("retrograd")]
    assert foreign == []


def test_unregistered_op_type_through_the_registry_hook():
    program = _base()
    program.global_block().append_op(Op("NoSuchOp", ["x"], ["x"], {}))
    _fails(program, r"op #0 NoSuchOp", r"'NoSuchOp' is not registered")


def _nested(depth: int) -> Program:
    """Blocks nested ``depth`` deep, each called by an If op in its parent (built by hand)."""
    program = _base()
    outer = program.global_block()
    for _ in range(depth):
        inner = program.create_block(outer)
        outer.append_op(Op("If", [], [], {"blocks": [inner]}))
        outer = inner
    return program


def test_nesting_beyond_the_limit_is_a_program_error_not_recursion_error():
    from retrograd.ir.program import MAX_BLOCK_DEPTH
    _fails(_nested(3000), f"nested {MAX_BLOCK_DEPTH + 1} blocks deep; at most {MAX_BLOCK_DEPTH}")


def test_shape_rule_results_that_are_not_int_shapes_are_reported(call_block):
    """A loaded op's attributes feed its shape rule; a string dimension used to crash the
    verifier's own message formatting with a TypeError."""
    program = _base()
    g = program.global_block()
    body = program.create_block(g)
    body.create_var("h_in", [-1, 4])
    body.create_var("weird", [-1, 4])
    g.create_var("out", [-1, 4])
    g.append_op(Op(call_block, ["x"], ["out"], {"body": body, "binds": ["h_in"], "results": ["weird"]}))
    body.vars["weird"].shape = ("a", 4)         # what a bad document or pass could leave
    _fails(program, r"block 1: variable 'weird' has shape \['a', 4\]")
    body.vars["weird"].shape = (-1, 4)
    # The rule (CallBlock's) returns the body's declared shape; a float there is the rule's fault.
    body.vars["weird"].shape = (1.5, 4)
    body.vars["weird"].block = body
    with pytest.raises(ProgramError, match=r"variable 'weird' has shape \[1.5, 4\]"):
        verify_program(program)


def test_shape_rule_crashing_on_attributes_of_the_wrong_type_is_a_program_error():
    program = _base()
    g = program.global_block()
    g.create_var("s", [4])
    g.append_op(Op("Reshape", ["x"], ["s"], {"shape": None}))
    _fails(program, r"block 0, op #0 Reshape: shape rule failed \(TypeError")
