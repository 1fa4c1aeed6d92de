"""AllReduce and Broadcast: values and gradients on 2 ranks (NumPy and torch), one-process behaviour."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import retrograd as rg

BACKENDS = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


def test_all_reduce_mean_sum_and_gradient_on_two_ranks(mpiexec):
    # The script checks every value against NumPy on each rank; a failed check aborts the launch.
    done = mpiexec("collectives", *BACKENDS)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:-1]) == sorted(f"rank {r} {b} ok" for r in (0, 1) for b in BACKENDS)


def test_one_process_all_reduce_is_the_identity_and_so_is_its_gradient():
    x = np.random.default_rng(1).standard_normal((3, 4))
    rg.testing.check_gradients(lambda x: rg.sum(rg.tanh(rg.distributed.all_reduce([x * x])[0])), [x])
    main, startup, (mean, total) = rg.testing.build_program(
        lambda: (rg.distributed.all_reduce([rg.data("x", [2])])[0],
                 rg.distributed.all_reduce([rg.data("n", [2], dtype="int64")], "sum")[0]))
    got = rg.Executor().run(main, feed={"x": np.array([1.5, -2.0]), "n": np.array([3, 4])},
                            fetch_list=[mean, total])
    np.testing.assert_array_equal(got[0], np.array([1.5, -2.0], "float32"))
    np.testing.assert_array_equal(got[1], [3, 4])


def test_broadcast_is_one_op_over_every_dtype_writing_its_inputs():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [2, 3])
        step = rg.optim.create_state("step", [1], "int64")
    inits = startup.global_block().vars                     # the startup program's own Vars
    with rg.program_guard(startup, startup):
        outs = rg.distributed.broadcast([inits[w.name], inits[step.name]])
    op = startup.global_block().ops[-1]
    assert (op.type, op.inputs, op.outputs, op.attrs) == ("Broadcast", ["w", "step"], ["w", "step"], {"root": 0})
    assert [v.name for v in outs] == ["w", "step"]
    exe = rg.Executor()
    exe.run(startup)
    assert exe.scope.get("w").shape == (2, 3) and exe.scope.get("step").dtype == np.int64


def test_bad_input_is_a_shape_error_naming_the_op():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ShapeError, match="AllReduce .*'ids' must be float32 or float64"):
            rg.distributed.all_reduce([rg.data("ids", [3], dtype="int64")], "mean")
        with pytest.raises(rg.ShapeError, match="reduce must be one of mean, sum, got 'max'"):
            rg.distributed.all_reduce([rg.data("v", [3])], "max")
        with pytest.raises(rg.ProgramError, match="needs at least one Var"):
            rg.distributed.all_reduce([])
