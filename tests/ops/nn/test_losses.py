"""binary_cross_entropy_with_logits and nll_loss against torch (float64), on every backend."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.engine

RNG = np.random.default_rng(3)


def _program(build, feeds):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        vars_ = {n: rg.data(n, [-1] + list(np.shape(a)[1:]), "float64" if np.asarray(a).dtype.kind == "f"
                            else "int64") for n, a in feeds.items()}
        fetch = build(**vars_)
    return main, fetch


def test_binary_cross_entropy_with_logits_and_its_gradients_match_torch(backend):
    logits = RNG.standard_normal((5, 4)) * 40.0           # large logits: no overflow, no NaN
    targets = RNG.uniform(0.0, 1.0, (5, 4))
    feeds = {"x": logits, "t": targets}

    def build(x, t):
        loss = rg.binary_cross_entropy_with_logits(x, t)
        first = rg.gradients(rg.sum(loss * loss), [x, t])
        return [loss, *first, *rg.gradients(rg.sum(first[0] * first[0]), [x])]
    main, fetch = _program(build, feeds)
    got = backend.executor().run(main, feed=feeds, fetch_list=fetch)
    x, t = (torch.tensor(a, requires_grad=True) for a in (logits, targets))
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    first = torch.autograd.grad((loss * loss).sum(), [x, t], create_graph=True)
    second = torch.autograd.grad((first[0] * first[0]).sum(), [x])
    for a, b in zip(got, (loss, *first, *second)):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-10, atol=1e-10)
    assert np.isfinite(got[0]).all()


def test_nll_loss_and_its_gradient_match_torch(backend):
    log_probs = np.log(RNG.dirichlet(np.ones(4), 6))
    labels = np.array([0, 3, 1, 2, 3, 0])
    feeds = {"lp": log_probs, "labels": labels}

    def build(lp, labels):
        loss = rg.nll_loss(lp, labels)
        return [loss, *rg.gradients(rg.sum(loss * loss), [lp])]
    main, fetch = _program(build, feeds)
    got = backend.executor().run(main, feed=feeds, fetch_list=fetch)
    lp = torch.tensor(log_probs, requires_grad=True)
    loss = F.nll_loss(lp, torch.tensor(labels), reduction="none")
    grad, = torch.autograd.grad((loss * loss).sum(), [lp])
    np.testing.assert_allclose(got[0], loss.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[1], grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("bad", [4, -1])
def test_a_label_out_of_range_fails_the_run_naming_the_op(backend, bad):
    feeds = {"lp": np.log(np.full((3, 4), 0.25)), "labels": np.array([0, bad, 1])}
    main, fetch = _program(lambda lp, labels: [rg.nll_loss(lp, labels)], feeds)
    with pytest.raises(rg.ExecutionError, match=rf"NLLLoss.*label {bad} is out of range \[0, 4\)"):
        backend.executor().run(main, feed=feeds, fetch_list=fetch)


def test_shapes_that_cannot_work_are_shape_errors_naming_the_op():
    with rg.program_guard(rg.Program(), rg.Program()):
        logits = rg.data("logits", [-1, 4])
        with pytest.raises(rg.ShapeError, match="BinaryCrossEntropyWithLogits"):
            rg.binary_cross_entropy_with_logits(logits, rg.data("t", [-1, 3]))
        with pytest.raises(rg.ShapeError, match="NLLLoss"):
            rg.nll_loss(logits, rg.data("labels", [-1], "float32"))
        with pytest.raises(rg.ShapeError, match="NLLLoss"):
            rg.nll_loss(rg.data("lp3", [2, 3, 4]), rg.data("labels3", [2], "int64"))
