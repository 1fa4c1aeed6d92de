"""global_norm / clip_by_global_norm: the norm of every gradient as one GlobalNorm op (issue 22)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

pytestmark = pytest.mark.engine


def _norm_program(dtypes):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(f"x{i}", shape, dtype) for i, (shape, dtype) in enumerate(zip(([3, 4], [5], []), dtypes))]
        norm = rg.optim.global_norm(xs)
    return main, startup, norm


def test_global_norm_is_one_op_and_matches_numpy(backend):
    main, startup, norm = _norm_program(["float32"] * 3)
    assert [op.type for op in main.global_block().ops] == ["GlobalNorm"]
    rng = np.random.default_rng(0)
    feed = {"x0": rng.standard_normal((3, 4)).astype("float32"),
            "x1": rng.standard_normal(5).astype("float32"), "x2": np.float32(-2.5)}
    want = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in feed.values()))
    exe = backend.executor()
    exe.run(startup)
    got, = exe.run(main, feed=feed, fetch_list=[norm])
    assert np.shape(got) == () and np.asarray(got).dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_global_norm_of_mixed_dtypes_fails_as_the_op_by_op_form_did():
    with pytest.raises(rg.ShapeError, match="add_n inputs must share a dtype"):
        _norm_program(["float32", "float64", "float64"])


def test_global_norm_op_refuses_mixed_dtypes_naming_them():
    from retrograd.ops.core.registry import append_op
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a, b = rg.data("a", [2], "float32"), rg.data("b", [2], "float64")
        with pytest.raises(rg.ShapeError, match="GlobalNorm needs one or more tensors of one float dtype"):
            append_op("GlobalNorm", [a, b])
