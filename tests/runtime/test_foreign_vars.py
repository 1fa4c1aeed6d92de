"""Fetch and feed with Vars of another program (issue #10, FUZZ_FINDINGS item 2).

``exe.run(p2, fetch_list=[var_of_p1])`` used to bind by name: with automatic
names (``sum_0`` in both programs) it returned p2's variable, a different value,
silently. Vars of an unrelated program are refused; Vars of a program the run
program was cloned from (``exe.run(main.clone(), fetch_list=[loss])``, as
PaddlePaddle users write) keep working.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

ONES = np.ones((1, 2), "float32")


def _scaled_sum(scale: float):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2])
        y = rg.sum(x * scale)
    return main, x, y


pytestmark = pytest.mark.engine     # the onnxruntime engine binds fetches and feeds the same way


@pytest.mark.parametrize("kind", ["fetch", "feed"])
def test_var_of_another_program_bound_by_name_silently(backend, kind):
    p1, x1, y1 = _scaled_sum(2.0)
    p2, x2, y2 = _scaled_sum(3.0)
    assert (x1.name, y1.name) == (x2.name, y2.name)   # the same names: the old binding's trap
    exe = backend.executor()
    foreign = {"fetch": ({"x": ONES}, [y1], "fetch Var 'sum_0'"),
               "feed": ({x1: ONES}, [y2], "feed Var 'x'")}
    feed, fetch, what = foreign[kind]
    with pytest.raises(rg.FeedError, match=rf"{what} belongs to another program"):
        exe.run(p2, feed=feed, fetch_list=fetch)
    for feed, fetch in (({x2: ONES}, [y2]), ({"x": ONES}, ["sum_0"])):   # its own Vars, or names
        got, = exe.run(p2, feed=feed, fetch_list=fetch)
        assert float(got) == 6.0                    # 3 * (1 + 1), the run program's variable


def test_vars_of_the_program_a_clone_came_from_still_fetch_and_feed():
    main, x, y = _scaled_sum(2.0)
    exe = rg.Executor()
    clone = main.clone()
    got, = exe.run(clone, feed={x: ONES}, fetch_list=[y])
    assert float(got) == 4.0
    clone_of_clone, sibling = clone.clone(), main.clone()
    got, = exe.run(clone_of_clone, feed={x: ONES}, fetch_list=[y])
    assert float(got) == 4.0
    cy = clone.global_block().var(y.name)         # and a clone's Var on its source or a sibling
    assert float(exe.run(main, feed={"x": ONES}, fetch_list=[cy])[0]) == 4.0
    assert float(exe.run(sibling, feed={"x": ONES}, fetch_list=[cy])[0]) == 4.0


def test_onnx_export_of_another_programs_var_bound_by_name_silently():
    pytest.importorskip("onnx")
    p1, _, y1 = _scaled_sum(2.0)
    p2, _, y2 = _scaled_sum(3.0)
    with pytest.raises(rg.ProgramError, match=r"fetch Var 'sum_0' belongs to another program"):
        rg.onnx.export(p2, None, fetch_list=[y1])
    model = rg.onnx.export(p2.clone(), None, fetch_list=[y2])
    assert [o.name for o in model.graph.output] == ["sum_0"]
