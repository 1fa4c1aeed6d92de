"""Contract: the quick-start snippet, values, programs, executor, saving, CLI.

Written from DESIGN.md's "Public API contract" alone, calling the API exactly
as it is spelled there; references are NumPy written here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import retrograd as rg


def _quickstart():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        loss = rg.mean(h * h)
        params_grads = rg.append_backward(loss)
    return main, startup, x, h, loss, params_grads


def test_quickstart_verbatim_values_and_gradients():
    main, startup, x, h, loss, params_grads = _quickstart()
    assert x.dtype == "float32"
    assert tuple(x.shape) == (-1, 8)
    # fc1.w [8,16], fc1.b [16], created in startup
    sb = startup.global_block()
    assert tuple(sb.vars["fc1.w"].shape) == (8, 16)
    assert tuple(sb.vars["fc1.b"].shape) == (16,)
    assert any("fc1.w" in op.outputs for op in sb.ops)
    assert any("fc1.b" in op.outputs for op in sb.ops)
    # [(Var, Var)]
    assert isinstance(params_grads, list)
    assert {p.name for p, _ in params_grads} == {"fc1.w", "fc1.b"}
    for p, g in params_grads:
        assert isinstance(p, rg.Var) and isinstance(g, rg.Var)
        assert tuple(g.shape) == tuple(p.shape)

    exe = rg.Executor()
    assert isinstance(exe.scope, rg.Scope)
    exe.run(startup)
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((5, 8)).astype("float32")
    loss_v, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    w = np.asarray(exe.scope.get("fc1.w"), dtype=np.float64)
    b = np.asarray(exe.scope.get("fc1.b"), dtype=np.float64)
    assert w.shape == (8, 16) and b.shape == (16,)
    hh = np.tanh(xb.astype(np.float64) @ w + b)
    np.testing.assert_allclose(float(np.asarray(loss_v)), np.mean(hh * hh), rtol=1e-5)

    # the gradients, fetched by Var, against a hand-written NumPy backward
    grads = exe.run(main, feed={"x": xb}, fetch_list=[g for _, g in params_grads])
    dh = 2 * hh / hh.size
    dz = dh * (1 - hh * hh)
    ref = {"fc1.w": xb.astype(np.float64).T @ dz, "fc1.b": dz.sum(0)}
    for (p, _), gv in zip(params_grads, grads):
        np.testing.assert_allclose(np.asarray(gv, dtype=np.float64), ref[p.name], rtol=1e-4, atol=1e-6)

    # exe.scope.set then a rerun sees the new value
    w2 = np.full((8, 16), 0.01, dtype="float32")
    exe.scope.set("fc1.w", w2)
    loss_v2, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    hh2 = np.tanh(xb.astype(np.float64) @ w2 + b)
    np.testing.assert_allclose(float(np.asarray(loss_v2)), np.mean(hh2 * hh2), rtol=1e-5)

    st = exe.last_stats
    assert isinstance(st.peak_bytes, int) and st.peak_bytes > 0
    assert isinstance(st.time_s, float) and st.time_s >= 0
    assert isinstance(st.ops_run, int) and st.ops_run > 0


def test_startup_is_seeded_and_reproducible():
    vals = []
    for _ in range(2):
        main, startup, *_ = _quickstart()
        exe = rg.Executor()
        exe.run(startup)
        vals.append(np.array(exe.scope.get("fc1.w")))
    np.testing.assert_array_equal(vals[0], vals[1])
    assert np.std(vals[0]) > 0


def test_fetch_list_names_and_vars_mixed():
    main, startup, x, h, loss, params_grads = _quickstart()
    exe = rg.Executor()
    exe.run(startup)
    xb = np.ones((3, 8), "float32")
    a, b, c = exe.run(main, feed={"x": xb}, fetch_list=[loss, loss.name, h.name])
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(c).shape == (3, 16)
    g_name = params_grads[0][1].name
    gv, = exe.run(main, feed={"x": xb}, fetch_list=[g_name])
    assert np.asarray(gv).shape == tuple(params_grads[0][0].shape)


def test_same_program_other_batch_sizes():
    main, startup, x, h, loss, _ = _quickstart()
    exe = rg.Executor()
    exe.run(startup)
    w = np.asarray(exe.scope.get("fc1.w"), np.float64)
    b = np.asarray(exe.scope.get("fc1.b"), np.float64)
    for n in (7, 2, 11, 1):
        xb = np.random.default_rng(n).standard_normal((n, 8)).astype("float32")
        hv, = exe.run(main, feed={"x": xb}, fetch_list=[h])
        np.testing.assert_allclose(np.asarray(hv), np.tanh(xb @ w + b), rtol=1e-5, atol=1e-6)


def test_values_builders():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x64 = rg.data("x64", [2, 3], dtype="float64")
        ids = rg.data("ids", [-1], dtype="int64")
        p = rg.create_parameter("p", [2, 3], dtype="float64")
        c = rg.constant(2.5, dtype="float64")
        ci = rg.constant(3, dtype="int64")
        ca = rg.constant(np.arange(6.0).reshape(2, 3), dtype="float32")
        f = rg.fill([2, 3], 1.5)
        y = x64 * p + c
    assert x64.dtype == "float64" and ids.dtype == "int64" and p.dtype == "float64"
    assert p.persistable
    assert f.dtype == "float32"
    assert tuple(f.shape) == (2, 3)
    assert ca.dtype == "float32" and ci.dtype == "int64"
    assert isinstance(main.blocks, (list, tuple)) and main.blocks[0] is main.global_block()
    assert main.global_block().ops and isinstance(main.global_block().vars, dict)
    exe = rg.Executor()
    exe.run(startup)
    xv = np.arange(6.0).reshape(2, 3)
    yv, fv, cav, civ = exe.run(main, feed={"x64": xv, "ids": np.array([1], "int64")},
                               fetch_list=[y, f, ca, ci])
    pv = np.asarray(exe.scope.get("p"))
    np.testing.assert_allclose(yv, xv * pv + 2.5)
    np.testing.assert_array_equal(fv, np.full((2, 3), 1.5))
    np.testing.assert_array_equal(cav, np.arange(6.0).reshape(2, 3))
    assert int(np.asarray(civ)) == 3


def test_create_parameter_init_spellings():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        p = rg.create_parameter("p", [3], init=0.5)
        q = rg.create_parameter("q", [2, 2], dtype="float64", init=np.eye(2))
    exe = rg.Executor()
    exe.run(startup)
    np.testing.assert_array_equal(exe.scope.get("p"), np.full(3, 0.5, "float32"))
    np.testing.assert_array_equal(exe.scope.get("q"), np.eye(2))


def test_json_round_trip_and_rerun():
    main, startup, x, h, loss, params_grads = _quickstart()
    text = main.to_json()
    assert isinstance(text, str)
    json.loads(text)
    again = rg.Program.from_json(text)
    assert again.to_json() == text
    stext = startup.to_json()
    startup2 = rg.Program.from_json(stext)
    xb = np.random.default_rng(3).standard_normal((4, 8)).astype("float32")
    outs = []
    for m, s in ((main, startup), (again, startup2)):
        exe = rg.Executor()
        exe.run(s)
        outs.append(exe.run(m, feed={"x": xb}, fetch_list=[loss.name, params_grads[0][1].name]))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_save_and_load_params(tmp_path):
    main, startup, x, h, loss, _ = _quickstart()
    exe = rg.Executor()
    exe.run(startup)
    w = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    exe.scope.set("fc1.w", w)
    path = os.path.join(tmp_path, "params.npz")
    rg.save_params(exe.scope, path, main)
    assert os.path.exists(path)
    with np.load(path) as z:
        np.testing.assert_array_equal(z["fc1.w"], w)
    # no temporary file left behind
    assert sorted(os.listdir(tmp_path)) == ["params.npz"]

    exe2 = rg.Executor()
    exe2.run(startup)
    assert not np.array_equal(exe2.scope.get("fc1.w"), w)
    rg.load_params(exe2.scope, path)
    np.testing.assert_array_equal(exe2.scope.get("fc1.w"), w)
    xb = np.ones((2, 8), "float32")
    a, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    b, = exe2.run(main, feed={"x": xb}, fetch_list=[loss])
    np.testing.assert_array_equal(a, b)

    # into a fresh executor whose scope was never initialised
    exe3 = rg.Executor()
    rg.load_params(exe3.scope, path)
    c, = exe3.run(main, feed={"x": xb}, fetch_list=[loss])
    np.testing.assert_array_equal(a, c)


def test_load_params_bad_file_is_retrograd_error(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    exe = rg.Executor()
    with pytest.raises(rg.RetrogradError):
        rg.load_params(exe.scope, str(bad))
    with pytest.raises(rg.RetrogradError):
        rg.load_params(exe.scope, str(tmp_path / "missing.npz"))


def test_cli_help():
    r = subprocess.run([sys.executable, "-m", "retrograd", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0
    assert "train" in r.stdout
