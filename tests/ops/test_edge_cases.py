"""Regression tests for issue 32 (empty batches and edge shapes), one per item, on every backend
(the onnxruntime engine included) and, where it applies, in an exported model run by onnxruntime.

References: PyTorch (float64) where torch runs the case, NumPy written here otherwise.
``tests/ops/test_empty_axes.py`` sweeps every op over each axis of size 0 in a child process;
these pin the reported cases by name.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the references are PyTorch's")
pytestmark = pytest.mark.engine


def _run(backend, main, feed, fetch, startup=None):
    exe = backend.executor()
    if startup is not None:
        exe.run(startup)
    return exe, exe.run(main, feed=feed, fetch_list=fetch)


def _exported(main, feed, fetch, scope=None):
    """The program exported (parameters from ``scope``) and run by a plain onnxruntime session."""
    ort = pytest.importorskip("onnxruntime")
    model = rg.onnx.export(main, None, fetch, scope=scope)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    names = [f.name if isinstance(f, rg.Var) else f for f in fetch]
    return sess.run(names, {k: v for k, v in feed.items() if k in inputs})


def _rand(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype("float32")


# --- item 1: torch's vendor kernels with an empty batch (they died with SIGFPE) ---------------

def test_issue32_item1_attention_empty_batch(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        q = rg.data("q", [-1, 4, 8], stop_gradient=False)
        out = rg.scaled_dot_product_attention(q, q, q)
        dq, = rg.gradients(rg.sum(out), [q])
    feed = {"q": np.zeros((0, 4, 8), "float32")}
    _, (y, g) = _run(backend, main, feed, [out, dq])
    assert y.shape == (0, 4, 8) and g.shape == (0, 4, 8)
    assert [a.shape for a in _exported(main, feed, [out, dq])] == [(0, 4, 8), (0, 4, 8)]


def test_issue32_item1_multi_head_attention_empty_batch(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4, 8], stop_gradient=False)
        out = rg.layers.multi_head_attention(x, num_heads=2, causal=True, name="att")
        dx, = rg.gradients(rg.sum(out), [x])
    feed = {"x": np.zeros((0, 4, 8), "float32")}
    exe, (y, g) = _run(backend, main, feed, [out, dx], startup)
    assert y.shape == (0, 4, 8) and g.shape == (0, 4, 8)


def test_issue32_item1_batch_norm_eval_gradient_empty_batch(backend):
    """batch_norm(training=False)'s gradient with N=0: empty dx, zero parameter gradients
    (torch's autograd gives the same)."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3, 2], stop_gradient=False)
        w = rg.data("w", [3], stop_gradient=False)
        mean, var = rg.data("m", [3]), rg.data("v", [3])
        y = rg.batch_norm(x, mean, var, w, training=False)
        dx, dw = rg.gradients(rg.sum(y * y), [x, w])
    feed = {"x": np.zeros((0, 3, 2), "float32"), "w": _rand(3), "m": _rand(3), "v": np.ones(3, "float32")}
    _, (gx, gw) = _run(backend, main, feed, [dx, dw])
    tx = torch.zeros(0, 3, 2, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(feed["w"], dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.batch_norm(tx, torch.tensor(feed["m"]).double(), torch.ones(3).double(), tw)
    want_x, want_w = torch.autograd.grad((ty * ty).sum(), [tx, tw])
    assert gx.shape == (0, 3, 2)
    np.testing.assert_array_equal(gw, want_w.numpy())
    assert [a.shape for a in _exported(main, feed, [dx, dw])] == [(0, 3, 2), (3,)]


# --- item 2: onnxruntime's Einsum and the CumProd Scan with size 0 -----------------------------

def test_issue32_item2_einsum_empty_contracted_letter(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a, c = rg.data("a", [2, -1]), rg.data("c", [3, -1])
        y = rg.einsum("ab,cb->ac", a, c)
    feed = {"a": np.zeros((2, 0), "float32"), "c": np.zeros((3, 0), "float32")}
    want = torch.einsum("ab,cb->ac", torch.zeros(2, 0), torch.zeros(3, 0)).numpy()     # zeros [2, 3]
    _, (got,) = _run(backend, main, feed, [y])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_exported(main, feed, [y])[0], want)


def test_issue32_item2_einsum_gradient_empty_batch(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a = rg.data("a", [-1, 2, 3], stop_gradient=False)
        c = rg.data("c", [-1, 3, 4], stop_gradient=False)
        y = rg.einsum("bij,bjk->bik", a, c)
        da, dc = rg.gradients(rg.sum(y), [a, c])
    feed = {"a": np.zeros((0, 2, 3), "float32"), "c": np.zeros((0, 3, 4), "float32")}
    _, got = _run(backend, main, feed, [y, da, dc])
    assert [g.shape for g in got] == [(0, 2, 4), (0, 2, 3), (0, 3, 4)]
    assert [g.shape for g in _exported(main, feed, [y, da, dc])] == [(0, 2, 4), (0, 2, 3), (0, 3, 4)]


@pytest.mark.parametrize("axis", [0, 1])
def test_issue32_item2_cumprod_empty_rows(backend, axis):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3], stop_gradient=False)
        y = rg.cumprod(x, axis)
        dx, = rg.gradients(rg.sum(y), [x])
    feed = {"x": np.zeros((0, 3), "float32")}
    _, got = _run(backend, main, feed, [y, dx])
    assert [g.shape for g in got] == [(0, 3), (0, 3)]
    assert [g.shape for g in _exported(main, feed, [y, dx])] == [(0, 3), (0, 3)]


# --- item 3: batch_norm in training needs more than one value per channel, everywhere ----------

@pytest.mark.parametrize("rows", [0, 1])
def test_issue32_item3_batch_norm_training_refuses_one_value_per_channel(backend, rows):
    """torch's rule on every backend: N=1 (no spatial axes) and N=0 raise ExecutionError, and the
    running statistics stay as they were (no NaN variance, no 0.9)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        y = rg.layers.batch_norm(x, name="bn")
    exe = backend.executor()
    exe.run(startup)
    with pytest.raises(rg.ExecutionError, match="more than one value per channel"):
        exe.run(main, feed={"x": _rand(rows, 3)}, fetch_list=[y])
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        torch.nn.functional.batch_norm(torch.ones(1, 3), torch.zeros(3), torch.ones(3), training=True)
    np.testing.assert_array_equal(np.asarray(exe.scope.get("bn.var")), np.ones(3, "float32"))
    np.testing.assert_array_equal(np.asarray(exe.scope.get("bn.mean")), np.zeros(3, "float32"))


def test_issue32_item3_batch_norm_exported_refuses_one_value_per_channel():
    ort = pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        y = rg.layers.batch_norm(x, name="bn")
    exe = rg.Executor()
    exe.run(startup)
    with pytest.raises(Exception, match="more than one value per channel"):
        _exported(main, {"x": _rand(1, 3)}, [y], scope=exe.scope)
    got = _exported(main, {"x": _rand(4, 3)}, [y], scope=exe.scope)[0]
    want = torch.nn.functional.batch_norm(torch.tensor(_rand(4, 3)), None, None, training=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ort is not None


# --- item 8: hidden size 0 and zero-size parameters ---------------------------------------------

def test_issue32_item8_linear_cross_entropy_hidden_size_zero(backend):
    """With no hidden features the logits are the bias: torch's cross entropy of b."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        h, w = rg.data("h", [-1, 0], stop_gradient=False), rg.data("w", [0, 4], stop_gradient=False)
        b, labels = rg.data("b", [4], stop_gradient=False), rg.data("y", [-1], "int64")
        loss = rg.linear_cross_entropy(h, w, b, labels)
        db, = rg.gradients(rg.sum(loss), [b])
    feed = {"h": np.zeros((3, 0), "float32"), "w": np.zeros((0, 4), "float32"), "b": _rand(4),
            "y": np.array([0, 3, 1])}
    tb = torch.tensor(feed["b"], dtype=torch.float64, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tb.expand(3, 4), torch.tensor(feed["y"]), reduction="none")
    want_db, = torch.autograd.grad(tl.sum(), [tb])
    _, (got, got_db) = _run(backend, main, feed, [loss, db])
    np.testing.assert_allclose(got, tl.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(got_db, want_db.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_exported(main, feed, [loss])[0], tl.detach().numpy(), rtol=1e-5)


def test_issue32_item8_zero_size_parameter(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        w = rg.create_parameter("w", [3, 0])
        y = rg.matmul(x, w)
    exe, (got,) = _run(backend, main, {"x": _rand(2, 3)}, [y], startup)
    assert got.shape == (2, 0)
    assert np.asarray(exe.scope.get("w")).shape == (3, 0)


# --- item 4: einsum's ellipsis broadcasts size-1 axes ------------------------------------------

def test_issue32_item4_einsum_ellipsis_broadcasts_size_one(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a = rg.data("a", [2, 1, 3, 4], stop_gradient=False)
        b = rg.data("b", [5, 4, 2], stop_gradient=False)
        y = rg.einsum("...ij,...jk->...ik", a, b)
        da, db = rg.gradients(rg.sum(y * y), [a, b])
    feed = {"a": _rand(2, 1, 3, 4), "b": _rand(5, 4, 2) + 1.0}
    ta, tb = (torch.tensor(feed[k], dtype=torch.float64, requires_grad=True) for k in "ab")
    ty = torch.einsum("...ij,...jk->...ik", ta, tb)
    want = [ty.detach().numpy(), *(g.numpy() for g in torch.autograd.grad((ty * ty).sum(), [ta, tb]))]
    assert y.shape == (2, 5, 3, 2)
    _, got = _run(backend, main, feed, [y, da, db])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    for g, w in zip(_exported(main, feed, [y, da, db]), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


# --- item 6: clone(for_test=True) keeps a batch_norm whose output only the user fetches ----------

def test_issue32_item6_for_test_keeps_unread_batch_norm(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        y = rg.layers.batch_norm(x, name="bn")      # nothing reads y; BatchNormStats reads its stats
    test = main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops] == ["BatchNorm"]
    exe = backend.executor()
    exe.run(startup)
    feed = {"x": _rand(4, 3)}
    got, = exe.run(test, feed=feed, fetch_list=[y])
    want = torch.nn.functional.batch_norm(torch.tensor(feed["x"]), torch.zeros(3), torch.ones(3),
                                          torch.ones(3), torch.zeros(3), training=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(exe.scope.get("bn.var")), np.ones(3, "float32"))
    np.testing.assert_allclose(_exported(test, feed, [y], scope=exe.scope)[0], want, rtol=1e-5, atol=1e-6)


# --- item 5: a scan of zero steps keeps its ys' run-time shapes ---------------------------------

def test_issue32_item5_zero_step_scan_keeps_row_shape(backend):
    """ys of a zero-step scan are [0, *the step's y shape] (here [0, N, 4] with N known only at
    run time), as jax.lax.scan gives; a gradient through it is zero."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xs = rg.data("xs", [-1, -1, 4])
        h0 = rg.data("h0", [-1, 4], stop_gradient=False)
        hT, ys = rg.scan(lambda h, x: (h * 2.0 + x, h + x), h0, xs)
        dh0, = rg.gradients(rg.sum(hT) + rg.sum(ys), [h0])
    feed = {"xs": np.zeros((0, 2, 4), "float32"), "h0": _rand(2, 4)}
    _, (got_h, got_ys, got_d) = _run(backend, main, feed, [hT, ys, dh0])
    assert got_ys.shape == (0, 2, 4)
    np.testing.assert_array_equal(got_h, feed["h0"])
    np.testing.assert_array_equal(got_d, np.ones((2, 4), "float32"))
    assert _exported(main, feed, [ys])[0].shape == (0, 2, 4)
    feed["xs"] = _rand(3, 2, 4)       # and with steps, the same program runs them
    _, (got_h, got_ys, _) = _run(backend, main, feed, [hT, ys, dh0])
    want = feed["h0"] * 2.0 + feed["xs"][0]
    np.testing.assert_allclose(got_ys[1], want + feed["xs"][1], rtol=1e-6)



def test_issue32_item5_empty_tensor_array_with_run_time_element_size(backend):
    """A TensorArray(element_shape=[-1, 4]) carried by a zero-step scan that would write rows
    [N, 4] (N known only at run time) stacks to [0, N, 4], as NumPy's np.stack of the rows a
    step writes gives; one written before the scan keeps its rows; with steps the rows are the
    writes; the gradient is 8 * xs (empty for zero steps); on every backend and exported."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xs = rg.data("xs", [-1, -1, 4], stop_gradient=False)
        y = rg.data("y", [-1, 4])

        def step(carry, x):
            i, a, b = carry
            return (i + 1, a.write(i, x * 2.0), b.write(i + 1, x + 1.0)), []

        empty = rg.TensorArray(dtype="float32", element_shape=[-1, 4])
        written = rg.TensorArray(dtype="float32", element_shape=[-1, 4]).write(0, y)
        (_, a, b), _ = rg.scan(step, [rg.constant(np.array(0)), empty, written], xs)
        stacks = [a.stack(), b.stack()]
        stacks.append(rg.gradients(rg.sum(stacks[0] * stacks[0]), [xs])[0])    # d/dx sum((2x)^2) = 8x
    for n in (0, 3):
        feed = {"xs": _rand(n, 2, 4), "y": _rand(2, 4) + 1.0}
        rows = [feed["xs"][t] for t in range(n)]
        want = [np.stack(rows) if n else np.zeros((0, 2, 4), "float32"),
                np.stack([feed["y"]] + [r + 1.0 for r in rows])]
        assert want[0].shape == (n, 2, 4) and want[1].shape == (n + 1, 2, 4)
        want[0] = want[0] * 2.0
        want.append(8.0 * feed["xs"])
        _, got = _run(backend, main, feed, stacks)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6)
        for g, w in zip(_exported(main, feed, stacks), want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_issue32_item5_empty_tensor_array_step_failing_on_zero_rows_names_it():
    """Where the one step on zero rows fails, the ExecutionError names the scan's TensorArray
    rather than handing on a [0, 0, 4] stack."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xs = rg.data("xs", [-1, -1, 4])

        def step(carry, x):
            i, a = carry
            return (i + 1, a.write(i, rg.reshape(x, [2, 4]))), []     # no [2, 4] in zero rows

        empty = rg.TensorArray(dtype="float32", element_shape=[-1, 4])
        (_, a), _ = rg.scan(step, [rg.constant(np.array(0)), empty], xs)
    with pytest.raises(rg.ExecutionError, match="TensorArray"):
        rg.Executor().run(main, feed={"xs": np.zeros((0, 0, 4), "float32")}, fetch_list=[a.stack()])

def _zero_iteration_loop(element):
    """A while_loop over the rows of xs [T, N, 4] writing ``element(h, row)`` into a
    TensorArray(element_shape=[-1, 4]) per iteration, and its h [N, 4]; T = dim(xs, 0)."""
    from retrograd.ops.array.tensor import dim
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xs = rg.data("xs", [-1, -1, 4], stop_gradient=False)
        h0 = rg.data("h0", [-1, 4], stop_gradient=False)
        arr = rg.TensorArray(dtype="float32", element_shape=[-1, 4])

        def body(i, h, a):
            h = rg.tanh(h + xs[i])
            return i + 1, h, a.write(i, element(h, xs[i]))
        _, h, arr = rg.while_loop(lambda i, h, a: i < dim(xs, 0), body, [rg.constant(np.array(0)), h0, arr])
    return main, xs, h0, h, arr


@pytest.mark.parametrize("written", ["product", "cond"])
def test_issue32_item5_zero_iteration_while_loop_tensor_array_keeps_run_time_sizes(backend, written):
    """A TensorArray(element_shape=[-1, 4]) that a while_loop of zero iterations never wrote stacks
    to [0, N, 4] (NumPy's np.stack of the rows the body writes, N from the loop inputs' run-time
    shapes: x[i] of x [T, N, 4] and h [N, 4], also through a cond in the body), not [0, 0, 4];
    with iterations the rows are the writes; the gradient of sum(stack^2) + sum(h) equals
    torch's; every backend and exported."""
    if written == "product":
        main, xs, h0, h, arr = _zero_iteration_loop(lambda h, row: h * row)
    else:       # sum(row) > -100 always holds: the same rows as "product"
        main, xs, h0, h, arr = _zero_iteration_loop(
            lambda h, row: rg.cond(rg.sum(row) > -100.0, lambda: h * row, lambda: h))
    with rg.program_guard(main):
        stack, size = arr.stack(), arr.size()
        loss = rg.sum(stack * stack) + rg.sum(h)
        grads = rg.gradients(loss, [xs, h0])
    fetch = [stack, size, h] + grads
    for steps in (0, 3):
        feed = {"xs": _rand(steps, 2, 4), "h0": _rand(2, 4) + 1.0}
        tx, th0 = (torch.tensor(feed[k], dtype=torch.float64, requires_grad=True) for k in ("xs", "h0"))
        th, rows = th0, []
        for t in range(steps):
            th = torch.tanh(th + tx[t])
            rows.append(th * tx[t])
        tstack = torch.stack(rows) if rows else torch.zeros((0, 2, 4), dtype=torch.float64)
        tl = (tstack * tstack).sum() + th.sum()
        want = [tstack.detach().numpy(), np.array(steps), th.detach().numpy()]
        want += [np.zeros_like(feed[k]) if g is None else g.numpy()
                 for k, g in zip(("xs", "h0"), torch.autograd.grad(tl, [tx, th0], allow_unused=True))]
        assert want[0].shape == (steps, 2, 4)
        _, got = _run(backend, main, feed, fetch)
        for g, w in zip(got, want):
            assert np.shape(g) == np.shape(w)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        for g, w in zip(_exported(main, feed, fetch), want):
            assert np.shape(g) == np.shape(w)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_issue32_item5_zero_iteration_while_loop_unknown_element_size_names_the_array(backend):
    """Where no input shape gives the size (rows [2N, 4] from a concat), reading the stack of the
    array no iteration wrote raises ExecutionError naming the TensorArray, the while_loop and
    the user's line (TensorFlow refuses to stack it too); size() still reads 0, and with
    iterations the stack is the writes. Exported, the run fails in the check node."""
    main, xs, h0, h, arr = _zero_iteration_loop(lambda h, row: rg.concat([h, row]))
    with rg.program_guard(main):
        stack, size = arr.stack(), arr.size()
    feed = {"xs": _rand(0, 2, 4), "h0": _rand(2, 4)}
    _, (got_size, got_h) = _run(backend, main, feed, [size, h])
    assert got_size == 0
    np.testing.assert_array_equal(got_h, feed["h0"])
    with pytest.raises(rg.ExecutionError, match=r"test_edge_cases.py:\d+: .*While.*TensorArray "
                                                 r"'tensor_array_\d+'.*element_shape \[-1, 4\]") as err:
        _run(backend, main, feed, [stack])
    assert "While in block 0 wrote nothing into the TensorArray" in str(err.value)
    with pytest.raises(Exception, match="written by no iteration"):
        _exported(main, feed, [stack])
    feed["xs"] = _rand(2, 2, 4)
    _, (got,) = _run(backend, main, feed, [stack])
    th = np.tanh(feed["h0"] + feed["xs"][0])
    np.testing.assert_allclose(got[0], np.concatenate([th, feed["xs"][0]]), rtol=1e-5)
    assert got.shape == (2, 4, 4)


def test_issue32_item5_never_written_tensor_array_stack_is_a_shape_error():
    """A TensorArray(element_shape=[-1, 4]) that nothing writes has no element size to stack
    with (TF: "Tried to stack elements of an empty list with non-fully-defined element_shape";
    np.stack([]) refuses too): a ShapeError when built, naming it. A fully declared one stacks
    to [0, 3, 4] and size() of either is 0."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        unknown = rg.TensorArray(dtype="float32", element_shape=[-1, 4])
        with pytest.raises(rg.ShapeError, match=r"TensorArray 'tensor_array_\d+' \(element_shape \[-1, 4\]\) "
                                                r"is never written"):
            unknown.stack()
        with pytest.raises(rg.ShapeError, match="never written"):
            unknown.gather([0])
        known = rg.TensorArray(dtype="float32", element_shape=[3, 4])
        fetch = [known.stack(), unknown.size()]
    stacked, size = rg.Executor().run(main, feed={}, fetch_list=fetch)
    assert stacked.shape == (0, 3, 4) and size == 0


# --- item 9: refusals that should work ------------------------------------------------------------

def test_issue32_item9_cumprod_in_while_loop_body(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3], stop_gradient=False)
        _, acc = rg.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a + rg.cumprod(a, 1)),
                               [rg.constant(np.array(0)), x])
        dx, = rg.gradients(rg.sum(acc), [x])
    feed = {"x": _rand(4, 3)}
    tx = torch.tensor(feed["x"], dtype=torch.float64, requires_grad=True)
    ta = tx
    for _ in range(2):
        ta = ta + torch.cumprod(ta, 1)
    want = [ta.detach().numpy(), torch.autograd.grad(ta.sum(), [tx])[0].numpy()]
    _, got = _run(backend, main, feed, [acc, dx])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    for g, w in zip(_exported(main, feed, [acc, dx]), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_issue32_item9_conv_and_pools_float64_empty_batch(backend):
    """float64 conv forward, ConvWeightGrad, max_pool2d and avg_pool2d with a batch of 0: the
    empty outputs and a zero weight gradient (torch's autograd gives the same)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2, 5, 5], "float64", stop_gradient=False)
        w = rg.create_parameter("w", [3, 2, 3, 3], "float64")
        y = rg.conv2d(x, w, padding=1)
        loss = rg.sum(rg.max_pool2d(y, 2)) + rg.sum(rg.avg_pool2d(y, 2))
        dx, dw = rg.gradients(loss, [x, w])
    feed = {"x": np.zeros((0, 2, 5, 5))}
    exe, got = _run(backend, main, feed, [y, dx, dw], startup)
    assert [g.shape for g in got] == [(0, 3, 5, 5), (0, 2, 5, 5), (3, 2, 3, 3)]
    np.testing.assert_array_equal(got[2], np.zeros((3, 2, 3, 3)))
    exported = _exported(main, feed, [y, dx, dw], scope=exe.scope)
    assert [g.shape for g in exported] == [(0, 3, 5, 5), (0, 2, 5, 5), (3, 2, 3, 3)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_issue32_pools_with_zero_channels(backend, dtype):
    """max_pool2d/avg_pool2d (padded, and with a run-time channel count) over 0 channels give
    [N, 0, Ho, Wo] and an empty gradient on every backend and exported (onnxruntime's pooling
    refused 0 channels); with channels the same program equals torch's."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, 5, 5], dtype, stop_gradient=False)
        ym, ya = rg.max_pool2d(x, 3, stride=2, padding=1), rg.avg_pool2d(x, 2, padding=1)
        dx, = rg.gradients(rg.sum(ym * ym) + rg.sum(ya), [x])
    for channels in (0, 2):
        feed = {"x": _rand(3, channels, 5, 5).astype(dtype)}
        tx = torch.tensor(feed["x"], dtype=torch.float64, requires_grad=True)
        padded = torch.nn.functional.pad(tx, (0, 0, 0, 0, 0, 1))     # torch refuses 0 channels
        tm = torch.nn.functional.max_pool2d(padded, 3, stride=2, padding=1)[:, :-1]
        ta = torch.nn.functional.avg_pool2d(padded, 2, padding=1)[:, :-1]
        want = [tm.detach().numpy(), ta.detach().numpy(),
                torch.autograd.grad((tm * tm).sum() + ta.sum(), [tx])[0].numpy()]
        assert want[0].shape == (3, channels, 3, 3) and want[1].shape == (3, channels, 3, 3)
        for got in (_run(backend, main, feed, [ym, ya, dx])[1], _exported(main, feed, [ym, ya, dx])):
            for g, w in zip(got, want):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_issue32_item9_gradient_of_empty_slice_with_var_index(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 4], stop_gradient=False)
        j = rg.data("j", [], "int64")
        y = x[:-3, j]
        dx, = rg.gradients(rg.sum(y * y), [x])
    for rows in (2, 5):
        feed = {"x": _rand(rows, 4), "j": np.array(1)}
        tx = torch.tensor(feed["x"], dtype=torch.float64, requires_grad=True)
        ty = tx[:-3, 1]
        want = [ty.detach().numpy(), torch.autograd.grad((ty * ty).sum(), [tx])[0].numpy()]
        _, got = _run(backend, main, feed, [y, dx])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        for g, w in zip(_exported(main, feed, [y, dx]), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["map", "scan"])
@pytest.mark.parametrize("level", ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"])
def test_issue32_item9_exported_cond_gradient_over_scan_with_parameter_initializers(kind, level):
    """A cond whose predicate reads only parameters and whose branch is a scan stacking x's rows
    (rg.map, or rg.scan with a carry), with its gradient, exported with the parameters as
    initializers: onnxruntime folds the If and inlines the branch, and then failed building its
    Loop that had no condition and no loop-carried value ("vector::reserve"). The model now
    runs at every optimization level and equals NumPy's executor and torch."""
    ort = pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], stop_gradient=False)
        p = rg.create_parameter("p", [4, 3])

        def branch():
            if kind == "map":
                ys = rg.map(rg.tanh, x)
            else:
                _, ys = rg.scan(lambda c, r: (c + r, rg.tanh(r)), rg.zeros_like(x[0]), x)
            return rg.sum(ys * ys)
        out = rg.cond(rg.sum(p) > -100.0, branch, lambda: rg.sum(x) * 0.5)
        dx, = rg.gradients(out, [x])
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": _rand(5, 3)}
    want = exe.run(main, feed=feed, fetch_list=[out, dx])
    tx = torch.tensor(feed["x"], dtype=torch.float64, requires_grad=True)
    if kind == "map":
        ty = torch.tanh(tx)
    else:
        ty = torch.stack([torch.tanh(r) for r in tx])
    tl = (ty * ty).sum()
    np.testing.assert_allclose(want[0], tl.item(), rtol=1e-5)
    np.testing.assert_allclose(want[1], torch.autograd.grad(tl, [tx])[0].numpy(), rtol=1e-4, atol=1e-5)
    model = rg.onnx.export(main, None, [out, dx], scope=exe.scope)
    assert [i.name for i in model.graph.initializer] == ["p"]
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = sess.run([out.name, dx.name], feed)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# --- item 7: a padded, strided conv2d under memory_budget stays within it -----------------------

@pytest.mark.engine_skip("the executor's measured peak (last_stats.peak_bytes)")
@pytest.mark.parametrize("padding", [1, 2, [1, 2]])
def test_issue32_item7_padded_conv_measured_peak_within_budget(backend, padding):
    """The input gradient of a padded conv was a view of the padded buffer on NumPy, holding more
    than the plan counted: the measured peak passed both the budget and the planned peak."""
    shapes = {"x": (4, 3, 8, 8)}

    def build(budget):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            h = rg.data("x", [-1, 3, 8, 8])
            for i in range(2):
                h = rg.conv2d(h, rg.create_parameter(f"w{i}", [3, 3, 3, 3]), padding=padding, stride=2)
            loss = rg.sum(h * h)
            grads = [g for _, g in rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes)]
        return main, startup, [loss] + grads
    with pytest.raises(rg.ProgramError, match="least budget that fits is") as refused:
        build(64)
    least = int(str(refused.value).split("least budget that fits is ")[1].split()[0])
    feed = {"x": np.random.default_rng(0).standard_normal(shapes["x"]).astype("float32")}
    main, startup, fetch = build(least)
    exe, got = _run(backend, main, feed, fetch, startup)
    assert exe.last_stats.peak_bytes <= least
    ref_main, ref_startup, ref_fetch = build(None)
    _, ref = _run(backend, ref_main, feed, ref_fetch, ref_startup)
    for g, w in zip(got, ref):          # gradients equal store-all's
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# --- item 10: a TensorArray loop var of a while_loop with recompute= ----------------------------

@pytest.mark.parametrize("budget", [300, 1 << 20])
def test_issue32_item10_tensor_array_loop_var_with_recompute(backend, budget):
    """The budgeted While recomputes from the initial loop vars where a loop var grows (no shared
    checkpoint stack); values and gradients equal torch's."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2, 3], stop_gradient=False)
        arr = rg.TensorArray(dtype="float32", element_shape=[2, 3])
        _, h, arr = rg.while_loop(lambda i, h, a: i < 4,
                                  lambda i, h, a: (i + 1, rg.tanh(h * 1.5), a.write(i, h * h)),
                                  [rg.constant(np.array(0)), x, arr], recompute=budget)
        loss = rg.sum(arr.stack()) + rg.sum(h)
        dx, = rg.gradients(loss, [x])
    feed = {"x": _rand(2, 3)}
    tx = torch.tensor(feed["x"], dtype=torch.float64, requires_grad=True)
    th, rows = tx, []
    for _ in range(4):
        rows.append(th * th)
        th = torch.tanh(th * 1.5)
    tl = torch.stack(rows).sum() + th.sum()
    want = [tl.detach().numpy(), torch.autograd.grad(tl, [tx])[0].numpy()]
    _, got = _run(backend, main, feed, [loss, dx])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.engine_skip("the executor's measured peak (last_stats.peak_bytes)")
def test_issue32_item10_memory_budget_plans_einsum_diagonal(backend):
    """memory_budget plans a program whose gradient builds an einsum diagonal's identity from
    run-time sizes (arange of a Dim): it names the least budget, not "pass feed_shapes", and
    the run keeps to it with store-all's gradients (and torch's)."""
    shapes = {"x": (8, 3)}

    def build(budget):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            w = rg.create_parameter("w", [3, 3], init="ones")
            h = rg.tanh(rg.matmul(x, w))
            loss = rg.sum(rg.einsum("ii->i", rg.matmul(h, h, transpose_x=True))) + rg.sum(h)
            grads = [g for _, g in rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes)]
        return main, startup, [loss] + grads
    with pytest.raises(rg.ProgramError, match="least budget that fits is") as refused:
        build(10)
    least = int(str(refused.value).split("least budget that fits is ")[1].split()[0])
    feed = {"x": _rand(*shapes["x"])}
    main, startup, fetch = build(least)
    exe, got = _run(backend, main, feed, fetch, startup)
    assert exe.last_stats.peak_bytes <= least
    tx, tw = torch.tensor(feed["x"]).double(), torch.ones(3, 3, dtype=torch.float64, requires_grad=True)
    th = torch.tanh(tx @ tw)
    tl = torch.einsum("ii->i", th.T @ th).sum() + th.sum()
    np.testing.assert_allclose(got[0], tl.item(), rtol=1e-5)
    np.testing.assert_allclose(got[1], torch.autograd.grad(tl, [tw])[0].numpy(), rtol=1e-4, atol=1e-5)


def _tensor_array_loop(budget, trips=16, max_iters=None, hidden=128, shapes=None):
    """x [64, 32] -> h [64, hidden]; a while_loop of ``trips`` iterations (an int, or a fed int64
    scalar "n") of two tanh layers writing mean(h * h, axis=1) [64] into a TensorArray
    (element_shape [-1]) per iteration; loss = sum(stack) + sum(h); append_backward under
    ``memory_budget=budget``."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 32])
        n = rg.data("n", [], "int64") if trips is None else trips
        h = rg.tanh(rg.matmul(x, rg.create_parameter("w", [32, hidden])))
        w2, w3 = rg.create_parameter("w2", [hidden, hidden]), rg.create_parameter("w3", [hidden, hidden])

        def body(i, h, a):
            h = rg.tanh(rg.matmul(rg.tanh(rg.matmul(h, w2)), w3))
            return i + 1, h, a.write(i, rg.mean(h * h, axis=1))
        _, h, arr = rg.while_loop(lambda i, h, a: i < n, body,
                                  [rg.constant(np.array(0)), h, rg.TensorArray(element_shape=[-1])],
                                  max_iters=max_iters)
        loss = rg.sum(arr.stack()) + rg.sum(h)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes or {"x": (64, 32)})
    return main, startup, [loss] + [g for _, g in pairs]


def _least_budget(build) -> int:
    with pytest.raises(rg.ProgramError, match="least budget that fits is") as refused:
        build(64)
    return refused.value.least_budget


@pytest.mark.engine_skip("the executor's measured peak (last_stats.peak_bytes)")
@pytest.mark.parametrize("bound", ["counted", "max_iters"])
def test_issue32_item10_memory_budget_over_while_loop_with_tensor_array(backend, bound):
    """memory_budget plans a while_loop carrying a TensorArray where its trip count is fixed
    (i < 16) or bounded (max_iters=16 over a fed n): the budgeted loop recomputes (the least
    budget is well below storing everything), the measured peak stays within each budget and
    the gradients equal the unbudgeted run's (and torch's)."""
    def build(budget):
        if bound == "counted":
            return _tensor_array_loop(budget)
        return _tensor_array_loop(budget, trips=None, max_iters=16)
    least = _least_budget(build)
    feed = {"x": _rand(64, 32)} if bound == "counted" else {"x": _rand(64, 32), "n": np.array(16)}
    main, startup, fetch = build(None)
    exe, ref = _run(backend, main, feed, fetch, startup)
    params = {p: np.asarray(exe.scope.get(p)) for p in ("w", "w2", "w3")}
    store_all = main.memory_plan.planned_peak if getattr(main, "memory_plan", None) else None
    for budget in (least, least * 3 // 2):
        main, startup, fetch = build(budget)
        assert main.memory_plan.activation_budget is not None        # the loop recomputes
        assert store_all is None or budget < store_all
        exe = backend.executor()
        exe.run(startup)
        for p, v in params.items():
            exe.scope.set(p, v)
        got = exe.run(main, feed=feed, fetch_list=fetch)
        assert exe.last_stats.peak_bytes <= budget
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)
    tx = torch.tensor(feed["x"], dtype=torch.float64)
    tw = [torch.tensor(params[p], dtype=torch.float64, requires_grad=True) for p in ("w", "w2", "w3")]
    th, rows = torch.tanh(tx @ tw[0]), []
    for _ in range(16):
        th = torch.tanh(torch.tanh(th @ tw[1]) @ tw[2])
        rows.append((th * th).mean(1))
    tl = torch.stack(rows).sum() + th.sum()
    np.testing.assert_allclose(got[0], tl.item(), rtol=1e-5)
    for g, w in zip(got[1:], torch.autograd.grad(tl, tw)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.engine_skip("the executor's measured peak (last_stats.peak_bytes)")
def test_issue32_item10_memory_budget_plans_scan(backend):
    """memory_budget plans an rg.scan (its trip count is xs' length, which feed_shapes gives): it
    names the least budget (not "pass feed_shapes"); at it the measured peak stays within and the
    gradients equal the unbudgeted run's and torch's."""
    shapes = {"xs": (12, 16, 8)}

    def build(budget):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            xs = rg.data("xs", [-1, -1, 8])
            w = rg.create_parameter("w", [8, 8])

            def step(h, x):
                h = rg.tanh(rg.matmul(rg.tanh(rg.matmul(h, w)) + x, w))
                return h, rg.mean(h * h, axis=1)
            h_last, ys = rg.scan(step, rg.tanh(xs[0]), xs)
            loss = rg.sum(ys) + rg.sum(h_last)
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes)
        return main, startup, [loss] + [g for _, g in pairs]
    least = _least_budget(build)
    feed = {"xs": _rand(*shapes["xs"])}
    main, startup, fetch = build(None)
    exe, ref = _run(backend, main, feed, fetch, startup)
    w = np.asarray(exe.scope.get("w"))
    main, startup, fetch = build(least)
    exe = backend.executor()
    exe.run(startup)
    exe.scope.set("w", w)
    got = exe.run(main, feed=feed, fetch_list=fetch)
    assert exe.last_stats.peak_bytes <= least
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)
    tx, tw = torch.tensor(feed["xs"], dtype=torch.float64), torch.tensor(w, dtype=torch.float64, requires_grad=True)
    th, rows = torch.tanh(tx[0]), []
    for t in range(shapes["xs"][0]):
        th = torch.tanh((torch.tanh(th @ tw) + tx[t]) @ tw)
        rows.append((th * th).mean(1))
    tl = torch.stack(rows).sum() + th.sum()
    np.testing.assert_allclose(got[0], tl.item(), rtol=1e-5)
    np.testing.assert_allclose(got[1], torch.autograd.grad(tl, [tw])[0].numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.engine_skip("memory_budget is planned when the program is built")
def test_issue32_item10_memory_budget_names_what_cannot_be_planned(backend):
    """A while_loop whose trip count is a fed value and unbounded writes a TensorArray of a
    length known only at run time: memory_budget names the loop (its line) and how to bound it
    (max_iters=), not "pass feed_shapes" when every feed shape was given."""
    with pytest.raises(rg.ProgramError) as refused:
        _tensor_array_loop(1 << 20, trips=None)
    message = str(refused.value)
    assert "cannot be planned" in message and "max_iters=" in message and "recompute=" in message
    assert "test_edge_cases.py:" in message and "While" in message
    assert "pass feed_shapes" not in message
