"""rg.layers.conv1d / conv2d against torch.nn.Conv1d / Conv2d with the same weights (forward and
gradients) on every backend; initialisation, naming, act= and hyper-parameter errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def _fresh_programs():
    with rg.program_guard(rg.Program(), rg.Program()):
        yield


def _run_layer(backend, build, x: np.ndarray, prefix: str):
    """Build the layer over data ``x``, run it and the gradients of sum(y * p); return
    (y, dx, {param: (value, grad)}, p)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xv = rg.data("x", [-1, *x.shape[1:]], dtype=str(x.dtype), stop_gradient=False)
        y = build(xv)
        p = rg.data("p", y.shape, dtype=str(x.dtype))
        params = [v for v in main.global_block().vars.values() if v.is_parameter and v.name.startswith(prefix)]
        grads = rg.gradients(rg.sum(y * p), [xv, *params])
    exe = backend.executor()
    exe.run(startup)
    p_value = np.random.default_rng(1).standard_normal([x.shape[0], *y.shape[1:]]).astype(x.dtype)
    got = exe.run(main, feed={"x": x, "p": p_value}, fetch_list=[y, *grads, *params])
    n = len(params)
    values = {v.name: (got[2 + n + i], got[2 + i]) for i, v in enumerate(params)}
    return got[0], got[1], values, p_value


@pytest.mark.parametrize("case", [dict(stride=1, padding=0, act=None), dict(stride=2, padding=1, act="relu"),
                                  dict(stride=(1, 2), padding=(2, 1), act="tanh")], ids=str)
def test_conv2d_layer_matches_torch_conv2d(backend, case):
    x = np.random.default_rng(0).standard_normal((3, 2, 9, 8)).astype("float32")
    case = dict(case)
    act = case.pop("act")
    y, dx, params, p = _run_layer(backend, lambda xv: rg.layers.conv2d(xv, 5, (3, 2), act=act, name="c1", **case),
                                  x, "c1.")
    assert set(params) == {"c1.w", "c1.b"}
    (w, dw), (b, db) = params["c1.w"], params["c1.b"]
    assert w.shape == (5, 2, 3, 2) and b.shape == (5,)
    module = torch.nn.Conv2d(2, 5, (3, 2), **case)
    with torch.no_grad():
        module.weight.copy_(torch.tensor(w))
        module.bias.copy_(torch.tensor(b))
    xt = torch.tensor(x, requires_grad=True)
    yt = module(xt)
    yt = {None: yt, "relu": torch.relu(yt), "tanh": torch.tanh(yt)}[act]
    (yt * torch.tensor(p)).sum().backward()
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, module.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, module.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv1d_layer_matches_torch_conv1d(backend):
    x = np.random.default_rng(2).standard_normal((2, 3, 11)).astype("float32")
    y, dx, params, p = _run_layer(backend, lambda xv: rg.layers.conv1d(xv, 4, 3, stride=2, padding=1, name="t1"),
                                  x, "t1.")
    (w, dw), (b, db) = params["t1.w"], params["t1.b"]
    module = torch.nn.Conv1d(3, 4, 3, stride=2, padding=1)
    with torch.no_grad():
        module.weight.copy_(torch.tensor(w))
        module.bias.copy_(torch.tensor(b))
    xt = torch.tensor(x, requires_grad=True)
    (module(xt) * torch.tensor(p)).sum().backward()
    np.testing.assert_allclose(y, module(xt).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, module.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, module.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_initialisation_is_torch_kaiming_uniform_bound():
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for w and b, fan_in = C * kh * kw (torch.nn.Conv2d's)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.layers.conv2d(rg.data("x", [-1, 16, 8, 8]), 64, 3, name="c1")
    exe = rg.Executor()
    exe.run(startup)
    w, b = exe.scope.get("c1.w"), exe.scope.get("c1.b")
    bound = 1.0 / math.sqrt(16 * 9)
    for value in (w, b):
        assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound
    assert abs(w.std() - bound / math.sqrt(3.0)) < 0.05 * bound      # uniform's spread, not a narrower one


def test_output_is_named_after_the_layer_and_parameters_are_shared():
    x = rg.data("x", [-1, 3, 8, 8])
    y = rg.layers.conv2d(x, 4, 3, padding=1, act="relu", name="c1")
    assert y.name == "c1" and y.shape == (-1, 4, 8, 8)
    again = rg.layers.conv2d(y, 4, 3, padding=1, name="c1.again")
    assert again.shape == (-1, 4, 8, 8)
    block = rg.default_main_program().global_block()
    assert {"c1.w", "c1.b", "c1.again.w", "c1.again.b"} <= set(block.vars)


def test_kernel_larger_than_the_padded_input_names_the_layer_and_line():
    x = rg.data("x", [-1, 1, 4, 4])
    with pytest.raises(rg.ShapeError) as info:
        rg.layers.conv2d(x, 2, 7, padding=1, name="c9")
    assert "layers.conv2d 'c9'" in str(info.value) and "test_conv.py" in str(info.value)


@pytest.mark.parametrize("kwargs", [dict(num_filters=0, kernel_size=3), dict(num_filters=2, kernel_size=0),
                                    dict(num_filters=2, kernel_size=3, stride=0),
                                    dict(num_filters=2, kernel_size=3, act="nope")], ids=str)
def test_bad_hyper_parameters_name_the_layer_and_line(kwargs):
    x = rg.data("x", [-1, 1, 8, 8])
    with pytest.raises(rg.ProgramError, match=r"test_conv.py:\d+: layers.conv2d 'c2'"):
        rg.layers.conv2d(x, name="c2", **kwargs)


def test_unknown_channel_count_is_refused():
    with pytest.raises(rg.ProgramError, match="known channel count"):
        rg.layers.conv1d(rg.data("x", [-1, -1, 10]), 2, 3, name="t")


def test_readme_conv_example_runs_and_matches_torch():
    import re
    from pathlib import Path
    readme = "\n".join(p.read_text() for p in sorted((Path(__file__).resolve().parents[2] / "docs").rglob("*.md")))   # docs/ pages
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if 'name="c1"' in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    scope, out = env["exe"].scope, env["out"]
    t = {name: torch.tensor(scope.get(name)) for name in ("c1.w", "c1.b", "logits.w", "logits.b")}
    h = torch.relu(torch.nn.functional.conv2d(torch.tensor(env["batch"]), t["c1.w"], t["c1.b"], padding=1))
    expected = torch.nn.functional.max_pool2d(h, 2).reshape(2, -1) @ t["logits.w"] + t["logits.b"]
    assert out.shape == (2, 10)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-4, atol=1e-5)
