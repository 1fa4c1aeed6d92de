"""Contract: Program/Block/Var/Op structure, printing, JSON round trip of every construct."""
from __future__ import annotations

import numpy as np

import retrograd as rg


def test_ir_structure_and_printing():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        loss = rg.mean(h * h)
        rg.append_backward(loss)
    blk = main.global_block()
    assert blk.idx == 0 and blk.parent is None and main.blocks[0] is blk
    assert x.name == "x" and x.shape == (-1, 8) and x.dtype == "float32"
    assert not x.persistable and x.stop_gradient
    w = blk.vars["fc1.w"]
    assert w.persistable and w.trainable and not w.stop_gradient
    mm = blk.ops[0]
    assert mm.type == "MatMul" and list(mm.inputs) == ["x", "fc1.w"] and len(mm.outputs) == 1
    assert isinstance(mm.attrs, dict)
    text = str(main)
    for needle in ("MatMul", "Tanh", "fc1.w", "fc1.w.grad" if "fc1.w.grad" in blk.vars else "grad", "16"):
        assert needle in text
    assert len(text.splitlines()) >= len(blk.ops)


def _everything():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 3], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        h_all, h_last, c_all, c_last = rg.layers.lstm(x, 4, name="enc")
        g_all, g_last = rg.layers.gru(x, 4, name="gru")
        w = rg.create_parameter("w", [4, 4], dtype="float64", init=np.eye(4) * 0.5)
        _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, rg.tanh(h @ w)], [rg.constant(0), h_last])
        y = rg.cond(rg.sum(h) > 0.0, lambda: h * 2.0, lambda: h - g_last)
        z = rg.do(lambda a: rg.dropout(a, 0.3, seed=3), y)
        lab = rg.data("lab", [-1], dtype="int64")
        loss = rg.mean(z * z) + rg.mean(rg.softmax_cross_entropy(c_last, lab))
        rg.optim.Adam(0.01).minimize(loss)
    return main, startup, loss


def test_json_round_trip_of_control_flow_recurrent_and_optimizer():
    main, startup, loss = _everything()
    text = main.to_json()
    again = rg.Program.from_json(text)
    assert again.to_json() == text
    assert len(again.blocks) == len(main.blocks) > 1
    st2 = rg.Program.from_json(startup.to_json())
    feed = {"x": np.random.default_rng(0).standard_normal((5, 2, 3)), "n": np.array(3), "lab": np.array([1, 3])}
    runs = []
    for m, s in ((main, startup), (again, st2)):
        exe = rg.Executor()
        exe.run(s)
        out = [exe.run(m, feed=feed, fetch_list=[loss.name])[0] for _ in range(3)]
        runs.append(out + [np.array(exe.scope.get("enc.w_ih")), np.array(exe.scope.get("w"))])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(runs[0][0], runs[0][2])          # it trained
