"""einsum on NumPy through BLAS: each pairwise contraction is one batched ``matmul``.

``np.einsum`` without ``optimize`` loops in C without BLAS (a [512, 512] product
2x slower than ``@``); with ``optimize`` it plans well for plain products but
loops over batch letters in Python ("nhld,nhsd->nhls" on [4, 4, 128, 64]: 19x
slower than without). Here a pair of operands is transposed to
``[batch, free, contracted]`` and ``[batch, contracted, free]``, multiplied
once with ``matmul``, and the result transposed (a view) to the output's order;
more operands are contracted pairwise in ``np.einsum_path``'s greedy order.
Letters one operand alone has (summed away) and diagonals go through
``np.einsum`` of that operand first; small operands go to ``np.einsum`` whole.
"""
from __future__ import annotations

import math

import numpy as np

# Below this many operand elements, planning costs more than it saves: np.einsum's C loop
# (an [8, 16] @ [16, 4] product: 9 us, against 70 us through transposes and matmul).
SMALL = 4096


def einsum(equation: str, *operands: np.ndarray) -> np.ndarray:
    """``np.einsum(equation, *operands)`` for an explicit equation ("ij,jk->ik")."""
    lhs, output = equation.split("->")
    subscripts = lhs.split(",")
    if len(operands) == 1 or sum(x.size for x in operands) < SMALL:
        return np.asarray(np.einsum(equation, *operands))
    terms = list(zip(subscripts, operands))
    if len(terms) > 2:
        path = np.einsum_path(equation, *operands, optimize="greedy")[0][1:]
        for pair in path:
            picked = [terms[i] for i in pair]
            terms = [t for i, t in enumerate(terms) if i not in pair]
            needed = set(output).union(*(s for s, _ in terms))
            letters = "".join(dict.fromkeys(c for s, _ in picked for c in s if c in needed))
            terms.append((letters, _pair(*picked[0], *picked[1], letters) if len(picked) == 2
                          else _single(*picked[0], letters)))
        (subs, value), = terms
        return _single(subs, value, output)
    return _pair(*terms[0], *terms[1], output)


def _single(subs: str, x: np.ndarray, out: str) -> np.ndarray:
    return x if subs == out else np.asarray(np.einsum(f"{subs}->{out}", x))


def _pair(sa: str, a: np.ndarray, sb: str, b: np.ndarray, out: str) -> np.ndarray:
    """The contraction of two operands into ``out`` with one batched matmul."""
    keep_a = "".join(dict.fromkeys(c for c in sa if c in sb or c in out))
    keep_b = "".join(dict.fromkeys(c for c in sb if c in sa or c in out))
    a, b = _single(sa, a, keep_a), _single(sb, b, keep_b)
    size = {**dict(zip(keep_a, a.shape)), **dict(zip(keep_b, b.shape))}
    batch = [c for c in keep_a if c in keep_b and c in out]
    summed = [c for c in keep_a if c in keep_b and c not in out]
    left = [c for c in keep_a if c not in keep_b]
    right = [c for c in keep_b if c not in keep_a]

    def grouped(subs: str, x: np.ndarray, groups) -> np.ndarray:
        order = [c for group in groups for c in group]
        x = np.transpose(x, [subs.index(c) for c in order])
        return x.reshape([math.prod(size[c] for c in group) for group in groups])
    product = np.matmul(grouped(keep_a, a, (batch, left, summed)), grouped(keep_b, b, (batch, summed, right)))
    letters = batch + left + right
    product = product.reshape([size[c] for c in letters])
    return np.transpose(product, [letters.index(c) for c in out])
