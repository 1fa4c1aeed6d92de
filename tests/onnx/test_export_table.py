"""Every op's forward and gradient, exported and run in onnxruntime, against the NumPy executor.

The cases are the gradient table's (tests/ops/test_gradients_table.py): for
each, the program computes the case's outputs and the gradients of a scalar
mixing them with every float input, in float64 (and in float32 where the
case builds with float32 inputs); onnxruntime must give the NumPy executor's
values within 1e-10 (float64) and 1e-5 (float32).
"""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.core.lowering import LOWERINGS

_spec = importlib.util.spec_from_file_location(
    "gradients_table", pathlib.Path(__file__).parents[1] / "ops" / "test_gradients_table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)

# Ops with no ONNX form, each refused with a BackendError naming it (tested below).
NOT_EXPORTED = {
    "AllReduce": "a collective across MPI ranks",
    "Broadcast": "a collective across MPI ranks",
}


def _objective(outs, dtype):
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    r = np.random.default_rng(7)
    terms = [rg.sum(out * rg.constant(r.standard_normal([max(d, 1) for d in out.shape]), dtype=dtype))
             for out in outs if out.dtype == dtype]
    return terms[0] if len(terms) == 1 else rg.add_n(terms)


def _build(fn, inputs: dict, dtype: str):
    main, startup = rg.Program(), rg.Program()
    feed = {}
    with rg.program_guard(main, startup):
        vars_ = []
        for name, value in inputs.items():
            value = np.asarray(value)
            if value.dtype.kind == "f":
                value = value.astype(dtype)
            feed[name] = value
            vars_.append(rg.data(name, value.shape, value.dtype.name, stop_gradient=False))
        outs = fn(*vars_)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        wrt = [v for v in vars_ if v.dtype == dtype]
        grads = []
        if any(o.dtype == dtype for o in outs) and wrt:
            grads = [g for g in rg.gradients(_objective(outs, dtype), wrt) if g is not None]
    return main, startup, feed, outs + grads


def _case_ids():
    return table._case_ids(sorted(table.CASES))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("op_type,index", _case_ids())
def test_forward_and_gradient_match_numpy(op_type, index, dtype, ort_check):
    fn, inputs, _ = list(table._cases(op_type))[index]
    try:
        main, startup, feed, fetch = _build(table._builds(op_type, fn), inputs, dtype)
    except rg.RetrogradError as exc:
        if dtype == "float64":
            raise
        pytest.skip(f"the case does not build with float32 inputs: {exc}")
    exe = rg.Executor()
    exe.run(startup)
    if op_type in NOT_EXPORTED:
        with pytest.raises(rg.BackendError, match=f"{op_type} in block 0 cannot be exported"):
            ort_check(main, exe, feed, fetch)
        return
    ort_check(main, exe, feed, fetch)


def test_every_registered_op_lowers_or_is_refused_by_name():
    table._import_every_module()
    missing = set(rg.OPS) - set(LOWERINGS) - set(NOT_EXPORTED)
    assert not missing, f"ops with no ONNX lowering (add @lowers next to their defop): {sorted(missing)}"
    assert not set(NOT_EXPORTED) & set(LOWERINGS)


def test_unexportable_op_raises_backend_error_naming_op_and_block():
    from retrograd.ops.core.registry import append_op
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3])
        y, = append_op("AllReduce", [x], {"reduce": "mean"})
        z = rg.tanh(x)
    with pytest.raises(rg.BackendError, match=r"AllReduce in block 0.*cannot be exported"):
        rg.onnx.export(main, None, [y])
    # A fetch that does not depend on it exports.
    model = rg.onnx.export(main, None, [z])
    assert [o.name for o in model.graph.output] == [z.name]
