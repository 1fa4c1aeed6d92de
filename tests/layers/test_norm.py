"""layer_norm, rms_norm and batch_norm layers against the torch modules with the same weights:
parameter names and initial values, forward, gradients, running statistics over training steps,
and evaluation through clone(for_test=True)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.engine

RNG = np.random.default_rng(11)


def _numpy(value):
    return rg.backends.to_numpy(value)         # torch (CPU/CUDA) and CuPy arrays alike


def _build(layer, shape):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1] + list(shape[1:]), "float64")
        c = rg.data("c", [-1] + list(shape[1:]), "float64")
        y = layer(x)
        loss = rg.sum(y * c + y * y)
    return main, startup, x, y, loss


def _torch_loss(y, c):
    return (y * c + y * y).sum()


def _check_module(backend, layer, module, names, shape):
    """Initial values, then forward and every gradient with new random weights in both."""
    main, startup, x, y, loss = _build(layer, shape)
    with rg.program_guard(main, startup):
        grads = rg.gradients(loss, [x] + [main.global_block().var(n) for n in names.values()])
    exe = backend.executor()
    exe.run(startup)
    for ours, theirs in names.items():
        np.testing.assert_array_equal(_numpy(exe.scope.get(theirs)),
                                      getattr(module, ours).detach().numpy(), err_msg=theirs)
    with torch.no_grad():
        for ours, theirs in names.items():
            getattr(module, ours).copy_(torch.tensor(RNG.standard_normal(getattr(module, ours).shape)))
            exe.scope.set(theirs, getattr(module, ours).detach().numpy().copy())
    xb, cb = RNG.standard_normal(shape) * 2.0 + 0.3, RNG.standard_normal(shape)
    got = exe.run(main, feed={"x": xb, "c": cb}, fetch_list=[y, *grads])
    xt = torch.tensor(xb, requires_grad=True)
    yt = module(xt)
    want = torch.autograd.grad(_torch_loss(yt, torch.tensor(cb)), [xt] + [getattr(module, n) for n in names])
    np.testing.assert_allclose(got[0], yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    for name, a, b in zip(["x", *names.values()], got[1:], want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)


def test_layer_norm_layer_matches_torch_layer_norm(backend):
    _check_module(backend, lambda x: rg.layers.layer_norm(x, name="ln"), torch.nn.LayerNorm(6).double(),
                  {"weight": "ln.w", "bias": "ln.b"}, (3, 4, 6))


def test_rms_norm_layer_matches_torch_rms_norm(backend):
    _check_module(backend, lambda x: rg.layers.rms_norm(x, name="rn"),
                  torch.nn.RMSNorm(6, eps=1e-6).double(), {"weight": "rn.w"}, (5, 6))


def test_batch_norm_layer_gradients_match_torch_batch_norm(backend):
    _check_module(backend, lambda x: rg.layers.batch_norm(x, name="bn"), torch.nn.BatchNorm1d(3).double(),
                  {"weight": "bn.w", "bias": "bn.b"}, (4, 3, 5))


def test_norm_layers_create_their_parameters_named_and_typed():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4, 8, 8])
        rg.layers.batch_norm(x, name="bn")
        rg.layers.layer_norm(x, name="ln")
        rg.layers.rms_norm(x, name="rn")
    block = main.global_block()
    shapes = {n: (block.var(n).shape, block.var(n).trainable) for n in
              ["bn.w", "bn.b", "bn.mean", "bn.var", "ln.w", "ln.b", "rn.w"]}
    assert shapes == {"bn.w": ((4,), True), "bn.b": ((4,), True), "bn.mean": ((4,), False),
                      "bn.var": ((4,), False), "ln.w": ((8,), True), "ln.b": ((8,), True),
                      "rn.w": ((8,), True)}
    assert block.var("bn.mean").persistable and block.var("bn.var").persistable


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 2)])
def test_batch_norm_layer_trains_and_evaluates_like_torch(backend, shape):
    """Several SGD steps: parameters and running statistics as torch's; then the test clone
    equals the module in eval mode and changes nothing."""
    main, startup, x, y, loss = _build(lambda v: rg.layers.batch_norm(v, name="bn", momentum=0.3), shape)
    with rg.program_guard(main, startup):
        rg.optim.SGD(0.05).minimize(loss)
    test_program = main.clone(for_test=True)
    exe = backend.executor()
    exe.run(startup)
    module = torch.nn.BatchNorm1d(3, momentum=0.3).double() if len(shape) < 4 else \
        torch.nn.BatchNorm2d(3, momentum=0.3).double()
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    for step in range(4):
        xb, cb = RNG.standard_normal(shape) * (step + 1) + step, RNG.standard_normal(shape)
        exe.run(main, feed={"x": xb, "c": cb}, fetch_list=[loss])
        opt.zero_grad()
        _torch_loss(module(torch.tensor(xb)), torch.tensor(cb)).backward()
        opt.step()
    expected = {"bn.w": module.weight, "bn.b": module.bias, "bn.mean": module.running_mean,
                "bn.var": module.running_var}
    for name, value in expected.items():
        np.testing.assert_allclose(_numpy(exe.scope.get(name)), value.detach().numpy(), rtol=1e-9, atol=1e-9,
                                   err_msg=name)
    before = {name: _numpy(exe.scope.get(name)).copy() for name in expected}
    xb = RNG.standard_normal(shape)
    got, = exe.run(test_program, feed={"x": xb, "c": xb}, fetch_list=[y])     # a training Var
    module.eval()
    np.testing.assert_allclose(got, module(torch.tensor(xb)).detach().numpy(), rtol=1e-9, atol=1e-9)
    for name, value in before.items():
        np.testing.assert_array_equal(_numpy(exe.scope.get(name)), value, err_msg=name)


def test_a_layer_without_a_known_width_is_refused_naming_it():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ProgramError, match="layer_norm 'ln1'.*last dimension"):
            rg.layers.layer_norm(rg.data("x", [4, -1]), name="ln1")
        with pytest.raises(rg.ProgramError, match="batch_norm 'bn1'.*channel"):
            rg.layers.batch_norm(rg.data("y", [4]), name="bn1")
