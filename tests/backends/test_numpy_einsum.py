"""The NumPy backend's einsum (pairwise batched matmuls) equals np.einsum, on operands big enough
to take the matmul path (and small ones, which go to np.einsum whole)."""
from __future__ import annotations

import numpy as np
import pytest

from retrograd.backends.numpy_einsum import SMALL, einsum

CASES = [
    ("ij,jk->ik", [(60, 50), (50, 70)]),
    ("bij,bjk->bik", [(20, 20, 30), (20, 30, 40)]),
    ("nhld,nhsd->nhls", [(2, 2, 30, 40), (2, 2, 50, 40)]),
    ("ijk,ikj->kj", [(20, 30, 40), (20, 40, 30)]),                       # batch letters out of order
    ("abc,a->abc", [(20, 30, 40), (20,)]),                               # no contraction: an outer product
    ("iij,jk->ik", [(30, 30, 20), (20, 40)]),                            # a diagonal first
    ("ab,cd->", [(40, 50), (60, 70)]),                                   # letters one operand alone has
    ("ij,jk,kl->il", [(30, 40), (40, 50), (50, 30)]),                    # three operands, greedy order
    ("ab,bc,cd,de->ae", [(20, 30), (30, 40), (40, 50), (50, 20)]),
    ("ij,jk,k->", [(40, 50), (50, 60), (60,)]),
    ("ij,j->i", [(0, 5000), (5000,)]),                                   # an empty axis
    ("ij,jk->ik", [(2, 3), (3, 4)]),                                     # small: np.einsum itself
]


@pytest.mark.parametrize("equation, shapes", CASES, ids=[e for e, _ in CASES])
def test_pairwise_matmul_einsum_equals_numpy(equation, shapes):
    r = np.random.default_rng(len(equation))
    operands = [r.standard_normal(s) for s in shapes]
    want = np.einsum(equation, *operands)
    got = einsum(equation, *operands)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_the_big_cases_take_the_matmul_path():
    assert all(sum(int(np.prod(s)) for s in shapes) >= SMALL for _, shapes in CASES[:-1])
