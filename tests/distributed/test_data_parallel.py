"""DataParallel: 2 ranks on half batches train as 1 process on whole batches; failures stop all ranks.

The multi-rank tests launch ``mpiexec -n 2`` (the ``mpiexec`` fixture, with a
timeout) on the scripts in ``scripts/``; the one-process tests run here.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg


def test_two_ranks_on_half_batches_match_one_process_on_whole_batches(mpiexec, load_script, tmp_path):
    prefix = str(tmp_path / "dp")
    done = mpiexec("adam_shards", prefix)
    assert done.returncode == 0, done.stderr

    script = load_script("adam_shards")
    main, startup, loss, grad_norm = script.build(lambda opt: opt, seed=1)   # rank 0's seed
    exe = rg.Executor()
    exe.run(startup)
    norms = [exe.run(main, feed=feed, fetch_list=[grad_norm])[0] for feed in script.batches()]
    assert max(norms) > 0.5            # clipping acts, so it must see the averaged gradients
    expected = dict(grad_norms=np.array(norms), **script.persistables(exe, main))
    assert int(expected["fc1.w.step"][0]) == script.STEPS
    for rank in range(2):
        got = dict(np.load(f"{prefix}.rank{rank}.npz"))
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank}: {name}")


@pytest.mark.parametrize("via_mpi4py", [True, False], ids=["python-m-mpi4py", "plain-python"])
def test_a_failing_rank_stops_every_rank_with_its_message(mpiexec, via_mpi4py):
    done = mpiexec("one_rank_fails", via_mpi4py=via_mpi4py)
    assert done.returncode != 0
    assert "FeedError" in done.stderr and "feed 'x' has shape [4, 5]" in done.stderr
    assert "should not have" not in done.stdout


def test_a_rank_failing_before_its_first_collective_stops_every_rank(mpiexec):
    done = mpiexec("fails_before_mpi", via_mpi4py=False)
    assert done.returncode != 0
    assert "RuntimeError: rank 1 fails before its first collective" in done.stderr
    assert "without rank 1" not in done.stdout


def test_mismatched_programs_fail_on_every_rank_naming_the_parameter_before_a_step(mpiexec):
    done = mpiexec("mismatched_ranks")
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if "refused" in line)
    assert [line.split()[1] for line in lines] == ["0", "1"], done.stdout
    for line in lines:
        assert "ProgramError" in line
        assert "'hidden.w' is float32[6, 8] on rank 0 but float32[6, 9] on rank 1" in line
    assert "trained" not in done.stdout


# --- one process: the same code runs unchanged ---------------------------------------------

def build_small(wrap, seed: int = 3):
    """A small regression model for the one-process tests."""
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 5])
        y = rg.data("y", [-1, 1])
        h = rg.layers.fc(x, 7, act="tanh", name="fc1")
        loss = rg.mean(rg.square(rg.layers.fc(h, 1, name="fc2") - y))
        params_grads = wrap(rg.optim.Adam(0.02, clip_norm=1.0)).minimize(loss)
    return main, startup, loss, params_grads


def feeds(steps: int = 3):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((6, 5)).astype("float32"),
             "y": rng.standard_normal((6, 1)).astype("float32")} for _ in range(steps)]


def train(main, startup, loss):
    exe = rg.Executor()
    exe.run(startup)
    losses = [float(exe.run(main, feed=f, fetch_list=[loss])[0]) for f in feeds()]
    return exe, losses


def test_one_process_trains_exactly_as_the_wrapped_optimizer():
    plain_exe, plain_losses = train(*build_small(lambda opt: opt)[:3])
    main, startup, loss, _ = build_small(rg.distributed.DataParallel)
    dp_exe, dp_losses = train(main, startup, loss)
    assert dp_losses == plain_losses
    for param in main.all_parameters():
        np.testing.assert_array_equal(dp_exe.scope.get(param.name), plain_exe.scope.get(param.name))


def test_printed_program_shows_one_allreduce_between_the_backward_and_the_updates():
    main, startup, _, params_grads = build_small(rg.distributed.DataParallel)
    text = str(main)
    assert text.count("= AllReduce(") == 1
    line = next(l for l in text.splitlines() if "= AllReduce(" in l)
    assert "AllReduce(fc1.w.grad, fc1.b.grad, fc2.w.grad, fc2.b.grad; reduce='mean')" in line
    types = [op.type for op in main.global_block().ops]
    reduce_at = types.index("AllReduce")
    assert reduce_at < types.index("GlobalNorm") < types.index("AdamUpdate")   # clipping, then updates
    assert "MatMul" not in types[reduce_at + 1:]                       # the backward is all before it
    assert [g.name for _, g in params_grads] == ["fc1.w.grad.mean", "fc1.b.grad.mean",
                                                 "fc2.w.grad.mean", "fc2.b.grad.mean"]
    last = startup.global_block().ops[-1]
    assert last.type == "Broadcast" and last.attrs == {"root": 0}
    assert {"fc1.w", "fc2.b", "fc1.w.moment1", "fc2.b.moment2", "fc1.w.step"} <= set(last.inputs)
    assert last.outputs == last.inputs


def test_json_round_trip_keeps_the_collectives_and_trains_the_same():
    main, startup, loss, _ = build_small(rg.distributed.DataParallel)
    main2 = rg.Program.from_json(main.to_json())
    startup2 = rg.Program.from_json(startup.to_json())
    assert str(main2) == str(main) and str(startup2) == str(startup)
    _, losses = train(main, startup, loss)
    _, losses2 = train(main2, startup2, loss.name)
    assert losses2 == losses


def test_data_parallel_wraps_only_optimizers():
    with pytest.raises(rg.ProgramError, match="DataParallel wraps an rg.optim optimizer"):
        rg.distributed.DataParallel("adam")
