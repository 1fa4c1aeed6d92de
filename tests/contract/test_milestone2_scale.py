"""Contract: DESIGN.md "Milestone 2" -- data parallelism, one memory budget, errors at the
user's line, and the ``retrograd`` command; each snippet called as it is written there.

References: the same program run without the wrapper or the budget (whose results
tests/contract/test_quickstart.py checks against NumPy written by hand), and NumPy here.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

HERE = Path(__file__).name
XB = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")


def _line_of(tag: str) -> int:
    """The line of this file that ends with the comment ``# LINE <tag>``."""
    mark = "# LINE " + tag
    lines = [i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(mark)]
    assert len(lines) == 1, (mark, lines)
    return lines[0]


# --- Data parallelism over MPI -------------------------------------------------------------------

def _regressor(wrap: bool):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        loss = rg.mean(rg.square(rg.layers.fc(rg.layers.fc(x, 8, act="tanh", name="fc1"), 1, name="fc2")))
        opt = rg.optim.Adam(1e-3)
        if wrap:
            opt = rg.distributed.DataParallel(rg.optim.Adam(1e-3))        # wraps any optimizer
        params_grads = opt.minimize(loss)     # backward, AllReduce (mean over ranks), updates
    return main, startup, loss, params_grads


def test_data_parallel_runs_unchanged_in_one_process():
    rank, size = rg.distributed.rank(), rg.distributed.world_size()   # mpi4py COMM_WORLD
    assert (rank, size) == (0, 1)
    main, startup, loss, params_grads = _regressor(wrap=True)
    assert sorted(p.name for p, _ in params_grads) == ["fc1.b", "fc1.w", "fc2.b", "fc2.w"]
    ref_main, ref_startup, ref_loss, _ = _regressor(wrap=False)
    exe = rg.Executor()
    exe.run(startup)                          # every rank starts from rank 0's parameters
    ref = rg.Executor()
    ref.run(ref_startup)
    for step in range(3):
        got, = exe.run(main, feed={"x": rg.distributed.shard(XB)}, fetch_list=[loss])
        want, = ref.run(ref_main, feed={"x": XB}, fetch_list=[ref_loss])
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"step {step}")
    for name in ("fc1.w", "fc2.b", "fc1.w.moment1"):
        np.testing.assert_allclose(exe.scope.get(name), ref.scope.get(name), rtol=1e-6, atol=1e-8)


def test_allreduce_and_broadcast_are_ordinary_ops_printed_and_saved_as_json():
    main, startup, loss, _ = _regressor(wrap=True)
    assert "AllReduce" in str(main) and "Broadcast" in str(startup)
    assert any(op.type == "AllReduce" for op in main.global_block().ops)
    assert any(op.type == "Broadcast" for op in startup.global_block().ops)
    main2, startup2 = rg.Program.from_json(main.to_json()), rg.Program.from_json(startup.to_json())
    assert str(main2) == str(main) and str(startup2) == str(startup)
    assert main2.to_json() == main.to_json()
    # the loaded programs train like the built ones
    runs = []
    for m, s in ((main, startup), (main2, startup2)):
        exe = rg.Executor()
        exe.run(s)
        runs.append([exe.run(m, feed={"x": XB}, fetch_list=[loss.name])[0] for _ in range(2)])
    np.testing.assert_array_equal(runs[0], runs[1])


TRAIN_PY = textwrap.dedent("""
    import sys
    import numpy as np
    import retrograd as rg
    rank, size = rg.distributed.rank(), rg.distributed.world_size()   # mpi4py COMM_WORLD
    # rank 1 initialises from another seed: the startup's Broadcast must replace its values
    main, startup = rg.Program(), rg.Program(random_seed=7 * rank)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        loss = rg.mean(rg.square(rg.layers.fc(rg.layers.fc(x, 8, act="tanh", name="fc1"), 1, name="fc2")))
        opt = rg.distributed.DataParallel(rg.optim.Adam(1e-2))        # wraps any optimizer
        params_grads = opt.minimize(loss)     # backward, AllReduce (mean over ranks), updates
    exe = rg.Executor()
    exe.run(startup)                          # every rank starts from rank 0's parameters
    xb = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    for _ in range(3):
        exe.run(main, feed={"x": rg.distributed.shard(xb)})
    rg.save_params(exe.scope, f"{sys.argv[1]}.{rank}.npz", main)
    print(f"rank {rank} of {size}")
""")


def test_data_parallel_under_mpiexec_equals_one_process_on_the_whole_batch(tmp_path):
    if shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip('needs mpiexec and mpi4py: pip install "retrograd[mpi]"')
    (tmp_path / "train.py").write_text(TRAIN_PY)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")   # Open MPI in containers
    done = subprocess.run(["mpiexec", "-n", "2", sys.executable, "train.py", "m"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    # (the two ranks' lines may interleave in the launcher's output)
    assert sorted(re.findall(r"rank \d of \d", done.stdout)) == ["rank 0 of 2", "rank 1 of 2"]
    got, other = rg.read_params(tmp_path / "m.0.npz"), rg.read_params(tmp_path / "m.1.npz")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        loss = rg.mean(rg.square(rg.layers.fc(rg.layers.fc(x, 8, act="tanh", name="fc1"), 1, name="fc2")))
        rg.optim.Adam(1e-2).minimize(loss)
    exe = rg.Executor()
    exe.run(startup)
    for _ in range(3):
        exe.run(main, feed={"x": XB})
    for name in ("fc1.w", "fc1.b", "fc2.w", "fc2.b"):
        np.testing.assert_allclose(got[name], exe.scope.get(name), rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_array_equal(other[name], got[name], err_msg=name)     # the ranks agree


# --- One memory budget for the whole program -----------------------------------------------------

FEED_SHAPES = {"x": (1024, 256)}


def _mlp(budget=None, optimizer=False, depth=3):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 256])
        h = x
        for i in range(depth):
            h = rg.layers.fc(h, 256, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        if optimizer:
            opt = rg.optim.SGD(0.1)
            params_grads = opt.minimize(loss, memory_budget=budget, feed_shapes={"x": (1024, 256)})
        else:
            params_grads = rg.append_backward(loss, memory_budget=budget,      # bytes: the run's peak
                                              feed_shapes={"x": (1024, 256)})  # where shapes hold -1
    return main, startup, loss, params_grads


def _run(main, startup, fetch, kind=("numpy", None)):
    if kind[0] == "torch":
        pytest.importorskip("torch")
    exe = rg.Executor(backend=kind[0], device=kind[1])
    exe.run(startup)
    xb = np.random.default_rng(0).standard_normal(FEED_SHAPES["x"]).astype("float32")
    values = exe.run(main, feed={"x": xb}, fetch_list=fetch)
    return values, exe.last_stats.peak_bytes


def _close(got, want):
    """Equal to float32 rounding: the sums over 1024 examples cancel, so the tolerance is taken
    relative to the largest entry (torch sums in another order than NumPy)."""
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("kind", [("numpy", None), ("torch", "cpu")], ids=["numpy", "torch-cpu"])
def test_append_backward_memory_budget_bounds_peak_bytes_and_keeps_gradients(kind):
    main, startup, loss, params_grads = _mlp(None)
    want, store_all = _run(main, startup, [loss] + [g for _, g in params_grads], kind)
    main, startup, loss, params_grads = _mlp(64 << 20)
    got, peak = _run(main, startup, [loss] + [g for _, g in params_grads], kind)
    assert peak <= 64 << 20
    for g, w in zip(got, want):
        _close(g, w)
    # a budget below store-all's peak (but one that fits) is kept too, with the same gradients
    tight = int(store_all * 0.8)
    main, startup, loss, params_grads = _mlp(tight)
    got, peak = _run(main, startup, [loss] + [g for _, g in params_grads], kind)
    assert peak <= tight
    for g, w in zip(got, want):
        _close(g, w)


def test_minimize_memory_budget_bounds_peak_bytes_and_keeps_the_update():
    main, startup, loss, _ = _mlp(None, optimizer=True)
    want, store_all = _run(main, startup, [loss, "fc0.w"])
    for budget in (64 << 20, int(store_all * 0.85)):
        main, startup, loss, _ = _mlp(budget, optimizer=True)
        got, peak = _run(main, startup, [loss, "fc0.w"])
        assert peak <= budget, (budget, peak)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("optimizer", [False, True], ids=["append_backward", "minimize"])
def test_a_budget_too_small_names_the_least_budget_that_fits_and_that_budget_works(optimizer):
    with pytest.raises(rg.ProgramError) as info:
        _mlp(1 << 20, optimizer=optimizer)
    found = re.search(r"the least budget that fits is (\d+) bytes", str(info.value))
    assert found, str(info.value)
    least = int(found.group(1))
    assert least > 1 << 20
    main, startup, loss, params_grads = _mlp(least, optimizer=optimizer)
    _, peak = _run(main, startup, [loss])
    assert peak <= least
    with pytest.raises(rg.ProgramError, match=f"the least budget that fits is {least} bytes"):
        _mlp(least - 1, optimizer=optimizer)


def _lstm_model(budget):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8])                     # [T, N, 8]: both sizes known at run time
        h_all, h_last, _, _ = rg.layers.lstm(x, 16, name="lstm")
        loss = rg.mean(rg.layers.fc(h_last, 1, name="out") ** 2) + rg.mean(h_all * h_all)
        rg.optim.Adam(1e-2).minimize(loss, memory_budget=budget, feed_shapes={"x": (20, 4, 8)})
    return main, startup, loss


def test_one_budget_covers_recurrent_ops_and_holds_at_other_run_time_lengths():
    runs = {}
    for budget in (None, 72 * 1024):
        main, startup, loss = _lstm_model(budget)
        exe = rg.Executor()
        exe.run(startup)
        peaks, losses = [], []
        for T in (20, 40, 20):                          # the planned length, a longer one, again
            xb = np.random.default_rng(T).standard_normal((T, 4, 8)).astype("float32")
            losses.append(exe.run(main, feed={"x": xb}, fetch_list=[loss])[0])
            peaks.append(exe.last_stats.peak_bytes)
        runs[budget] = peaks, losses, exe.scope.get("lstm.w_hh")
    (store_all, want, w_want), (peaks, got, w_got) = runs[None], runs[72 * 1024]
    assert store_all[0] > 72 * 1024                    # the budget binds
    assert max(peaks) <= 72 * 1024, peaks
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(w_got, w_want, rtol=1e-4, atol=1e-6)
    with pytest.raises(rg.ProgramError, match=r"the least budget that fits is \d+ bytes"):
        _lstm_model(1000)


# --- Errors point at the user's line -------------------------------------------------------------

def test_errors_and_the_printed_program_name_the_users_file_and_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        ids = rg.data("ids", [-1], dtype="int64")
        y = rg.layers.fc(x, 3, name="fc")
        rows = rg.gather(y, ids)                                    # LINE gather
        with pytest.raises(rg.ShapeError) as shape_error:
            rg.matmul(y, rg.create_parameter("v", [5, 2]))          # LINE bad matmul
    gather_at = f"{HERE}:{_line_of('gather')}"
    assert f"{HERE}:{_line_of('bad matmul')}" in str(shape_error.value)
    text = main.to_string(locations=True)
    assert re.search(rf"= Gather\(.*\)  # \S*{re.escape(gather_at)}", text), text
    assert gather_at not in str(main)                                 # only when asked for
    exe = rg.Executor()
    exe.run(startup)
    with pytest.raises(rg.FeedError) as feed_error:
        exe.run(main, feed={"x": np.ones((2, 8), "float32"), "ids": np.array([0.5])}, fetch_list=[rows])
    assert gather_at in str(feed_error.value)
    with pytest.raises(rg.ExecutionError) as run_error:
        exe.run(main, feed={"x": np.ones((2, 8), "float32"), "ids": np.array([7])}, fetch_list=[rows])
    assert gather_at in str(run_error.value) and "Gather" in str(run_error.value)
    # saved JSON keeps it
    loaded = rg.Program.from_json(main.to_json())
    assert loaded.to_string(locations=True) == text


def test_an_ill_formed_program_error_names_the_users_line():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2, 3])
        y = rg.tanh(x)                                                # LINE tanh
    main.global_block().vars.pop(x.name)                              # now Tanh reads an undeclared name
    with pytest.raises(rg.ProgramError) as info:
        rg.Executor().run(main, fetch_list=[y])
    assert f"{HERE}:{_line_of('tanh')}" in str(info.value)


# --- The retrograd command -----------------------------------------------------------------------

SMALL = ["--hidden", "32", "--embed", "16", "--seq-len", "16", "--batch", "8"]


def _retrograd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("retrograd")
    command = [exe] if exe else [sys.executable, "-m", "retrograd"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_train_with_checkpoints_and_a_json_lines_log_then_sample(tmp_path):
    done = _retrograd("train", "--steps", "2", "--save", "m.npz", "--save-every", "1", "--log", "m.jsonl",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert {"step", "loss", "chars_per_s", "peak_bytes"} <= set(r)
        assert 0 < r["loss"] < 10 and r["chars_per_s"] > 0 and isinstance(r["peak_bytes"], int)
        assert r["peak_bytes"] > 0
    assert "val_loss" in records[-1] and 0 < records[-1]["val_loss"] < 10   # measured at the end
    assert rg.read_params(tmp_path / "m.npz")["train.step"].tolist() == [2]

    done = _retrograd("sample", "m.npz", "--length", "40", "--prompt", "def ", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("def ")
    assert len(done.stdout.rstrip("\n")) >= len("def ") + 40 - 1   # the prompt, then 40 characters


def test_train_recompute_takes_byte_sizes_with_suffixes(tmp_path):
    done = _retrograd("train", "--recompute", "96K", *SMALL, "--steps", "2", "--save", "r.npz",
                      "--no-plot", "--sample-len", "10", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.npz").exists()
    # the same run without recompute: the same losses
    plain = _retrograd("train", *SMALL, "--steps", "2", "--save", "p.npz", "--no-plot", "--sample-len", "10",
                       cwd=tmp_path)
    losses = [re.findall(r"^step\s+\d+\s+loss\s+([0-9.]+)", d.stdout, re.M) for d in (done, plain)]
    assert losses[0] and losses[0] == losses[1]
    bad = _retrograd("train", "--recompute", "96Q", "--steps", "1", cwd=tmp_path)
    assert bad.returncode != 0 and "96Q" in bad.stderr and "Traceback" not in bad.stderr


def test_train_recompute_96k_at_the_default_sizes(tmp_path):
    # One taped step of the default LSTM holds 229,376 bytes (gates, states, the step's input
    # projection and gradient rows): the command says so and trains with that budget.
    done = _retrograd("train", "--recompute", "96K", "--steps", "1", "--save", "r.npz", "--no-plot",
                      "--sample-len", "10", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--recompute 98,304 bytes cannot hold one step" in done.stdout
    assert "using the least budget that fits, 229,376 bytes" in done.stdout
