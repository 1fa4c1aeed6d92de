"""Ops remember the user's line that built them; errors, the printer and JSON carry it."""
import json
import sys

import numpy as np
import pytest

import retrograd as rg
from retrograd.ir.program import Op

HERE = "test_location.py"


def _line() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def _build():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        fc_line = _line() + 1
        h = rg.layers.fc(x, 2, name="fc")
        loss_line = _line() + 1
        loss = rg.mean(h * h)
        backward_line = _line() + 1
        rg.append_backward(loss)
    return main, startup, loss, fc_line, loss_line, backward_line


def test_ops_record_the_user_line_not_retrograd_internals():
    main, _, _, fc_line, loss_line, _ = _build()
    ops = main.global_block().ops
    assert ops[0].type == "MatMul" and ops[0].location.endswith(f"{HERE}:{fc_line}")
    mean = next(op for op in ops if op.type == "Mean")
    assert mean.location.endswith(f"{HERE}:{loss_line}")
    assert all(HERE in op.location for op in ops)     # never a line inside retrograd


def test_gradient_ops_point_at_their_forward_op_line():
    main, _, _, fc_line, _, backward_line = _build()
    grad_matmul = [op for op in main.global_block().ops if op.type == "MatMul"][-1]
    assert grad_matmul.attrs.get("transpose_x"), "expected the weight gradient's MatMul"
    assert grad_matmul.location.endswith(f"{HERE}:{fc_line}")
    seed = next(op for op in main.global_block().ops if op.type == "FillLike")
    assert seed.location.endswith(f"{HERE}:{backward_line}")


def test_where_names_the_line_first():
    main, *_, fc_line, _, _ = _build()
    where = main.global_block().ops[0].where()
    assert where.endswith("op #0 MatMul in block 0")
    assert f"{HERE}:{fc_line}: op #0" in where


def test_printer_shows_locations_only_when_asked():
    main, *_, fc_line, _, _ = _build()
    assert HERE not in str(main)
    text = main.to_string(locations=True)
    first_op = next(line for line in text.splitlines() if "MatMul(x, fc.w)" in line)
    assert first_op.endswith(f"# {first_op.split('# ')[-1]}")
    assert first_op.split("# ")[-1].endswith(f"{HERE}:{fc_line}")
    assert main.to_string() == str(main)


def test_json_keeps_locations_and_old_json_without_them_loads():
    main, *_ = _build()
    again = rg.Program.from_json(main.to_json())
    assert [op.location for op in again.global_block().ops] == \
        [op.location for op in main.global_block().ops]
    doc = json.loads(main.to_json())
    for block in doc["blocks"]:
        for op in block["ops"]:
            del op["location"]
    old = rg.Program.from_json(json.dumps(doc))
    assert all(op.location is None for op in old.global_block().ops)
    assert old.global_block().ops[0].where() == "op #0 MatMul in block 0"
    assert "#" not in old.to_string(locations=True).replace("op #", "")


def test_json_location_of_the_wrong_type_is_a_program_error():
    main, *_ = _build()
    doc = json.loads(main.to_json())
    doc["blocks"][0]["ops"][0]["location"] = 42
    with pytest.raises(rg.ProgramError, match=r"op #0 MatMul.*'location' must be a string"):
        rg.Program.from_json(json.dumps(doc))


def test_shape_error_at_build_names_the_user_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        y = rg.data("y", [4, 5])
        with pytest.raises(rg.ShapeError) as caught:
            line = _line() + 1
            rg.matmul(x, y)
    assert f"{HERE}:{line}: MatMul in block 0" in str(caught.value)


def test_execution_error_names_the_user_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1])
        w = rg.data("w", [-1, -1])
        line = _line() + 1
        out = rg.matmul(x, w)
    exe = rg.Executor()
    with pytest.raises(rg.ExecutionError, match=rf"{HERE}:{line}: op #0 MatMul in block 0 failed"):
        exe.run(main, feed={"x": np.ones((2, 3), np.float32), "w": np.ones((4, 2), np.float32)},
                fetch_list=[out])


def test_feed_error_about_an_unfed_input_names_the_reading_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        line = _line() + 1
        out = rg.tanh(x)
    with pytest.raises(rg.FeedError, match=rf"'x' is read by .*{HERE}:{line}: op #0 Tanh"):
        rg.Executor().run(main, feed={}, fetch_list=[out])


def test_verifier_fault_names_the_line_that_built_the_op():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        line = _line() + 1
        rg.tanh(x)
    main.global_block().ops[0].inputs = ["nowhere"]
    from retrograd.ir.verify import verify_program
    with pytest.raises(rg.ProgramError, match=rf"{HERE}:{line}: block 0, op #0 Tanh"):
        verify_program(main)


def test_ops_built_inside_control_flow_functions_point_into_them():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3])
        lines = {}

        def true_fn():
            lines["true"] = _line() + 1
            return rg.tanh(x)

        out = rg.cond(rg.sum(x) > 0.0, true_fn, lambda: x * 2.0)
    branch = next(op for op in main.global_block().ops if op.sub_blocks()).sub_blocks()[0]
    assert branch.ops[0].type == "Tanh"
    assert branch.ops[0].location.endswith(f"{HERE}:{lines['true']}")
    assert out is not None


def test_explicit_location_wins_and_none_means_unknown():
    assert Op("Tanh", ["x"], ["y"], location="model.py:7").location == "model.py:7"
    assert Op("Tanh", ["x"], ["y"], location=None).location is None


def test_feed_error_about_a_wrong_shape_names_the_reading_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        line = _line() + 1
        out = rg.tanh(x)
    with pytest.raises(rg.FeedError, match=rf"shape \[2, 4\].*read by .*{HERE}:{line}: op #0 Tanh"):
        rg.Executor().run(main, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[out])
