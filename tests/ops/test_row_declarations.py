"""What ops declare with ``defop(row_wise=..., batch_rows=...)`` (read by the memory passes that split
work over time steps and micro-batches) holds: the op on the first rows of its row inputs gives the
first rows of its outputs, against the op on the whole input (NumPy executor)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.core.registry import OPS, ROW_WISE_ELEMENTWISE, append_op

R = np.random.default_rng(21)
N = 6         # rows on axis 0; the test keeps the first K of them
K = 2


def _positive(*shape):
    return R.uniform(0.5, 2.0, shape)


# op type -> (inputs, attrs); rows on axis 0 of the inputs the op declares
CASES = {
    **{t: ([R.standard_normal((N, 3, 4)), _positive(N, 3, 4)], {})
       for t in ("Add", "Sub", "Mul", "Div")},
    **{t: ([_positive(N, 3, 4)], {}) for t in ("Tanh", "Sigmoid", "Relu", "Exp", "Log", "Square", "Neg")},
    "Gelu": ([R.standard_normal((N, 4))], {"approximate": "none"}),
    "ReluGrad": ([np.maximum(R.standard_normal((N, 4)), 0.0), R.standard_normal((N, 4))], {}),
    "SoftmaxCrossEntropy": ([R.standard_normal((N, 5)), R.integers(0, 5, N)], {}),
    "LinearCrossEntropy": ([R.standard_normal((N, 4)), R.standard_normal((4, 5)), R.integers(0, 5, N)],
                           {"chunk_rows": 4}),
    "SeqLinear": ([R.standard_normal((N, 3, 4)), R.standard_normal((4, 2))], {"transpose_w": False}),
    "Gather": ([R.standard_normal((7, 3)), R.integers(0, 7, (N, 2))], {}),
    "LayerNorm": ([R.standard_normal((N, 3, 4))], {"eps": 1e-5, "has_weight": False, "has_bias": False}),
    "SplitHeads": ([R.standard_normal((N, 3, 4))], {"heads": 2}),
    "MergeHeads": ([R.standard_normal((N, 2, 3, 2))], {}),
    "ScaledDotProductAttention": ([R.standard_normal((N, 2, 3, 4)) for _ in range(3)]
                                  + [R.standard_normal((3, 3))], {"causal": False, "scale": None}),
    "MatMul": ([R.standard_normal((N, 3, 4)), R.standard_normal((4, 2))], {}),
}


def _declared() -> dict:
    return {t: d.extra.get("batch_rows", d.extra.get("row_wise")) for t, d in OPS.items()
            if "row_wise" in d.extra or "batch_rows" in d.extra}


def test_every_declared_op_has_a_case():
    assert set(_declared()) == set(CASES)


def _run(op_type, arrays, attrs):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ins = [rg.data(f"in{i}", list(a.shape), str(a.dtype)) for i, a in enumerate(arrays)]
        outs = append_op(op_type, ins, dict(attrs))
    return rg.Executor().run(main, feed={f"in{i}": a for i, a in enumerate(arrays)}, fetch_list=list(outs))


@pytest.mark.parametrize("op_type", sorted(CASES))
def test_the_first_rows_of_the_row_inputs_give_the_first_rows_of_the_outputs(op_type):
    arrays, attrs = CASES[op_type]
    rule = _declared()[op_type]
    rows = (range(len(arrays)) if rule == ROW_WISE_ELEMENTWISE else {p % len(arrays) for p in rule})
    whole = _run(op_type, arrays, attrs)
    part = _run(op_type, [a[:K] if i in rows and a.shape[0] == N else a for i, a in enumerate(arrays)], attrs)
    for got, want in zip(part, whole):
        if np.ndim(want) and np.shape(want)[0] == N:           # a per-row output (not a workspace)
            np.testing.assert_allclose(got, np.asarray(want)[:K], rtol=1e-12, atol=1e-12)
