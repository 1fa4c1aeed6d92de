"""Special functions the Array API lacks, written with its elementwise operations.

``erf`` is computed as (the same algorithm as the ONNX lowering of ``Erf`` in
float64, ``retrograd/ops/math/special.py``):

* ``|x| < 3``: ``2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))``,
  a series of positive terms (no cancellation), 50 terms;
* ``|x| >= 3``: ``1 - erfc(|x|)`` with ``erfc(a) = exp(-a^2) / (sqrt(pi) f)``,
  ``f`` the continued fraction ``a + (1/2)/(a + 1/(a + (3/2)/(a + ...)))`` to
  depth 60 (``|x|`` is capped at 30, where erf is 1 in float64).

It agrees with ``math.erf`` within 2e-15 in float64. Backends use their
library's own ``erf`` where it has one (torch, CuPy, SciPy when installed).
"""
from __future__ import annotations

import math

ERF_CUT = 3.0
ERF_SERIES_TERMS = 50
ERF_FRACTION_DEPTH = 60
ERF_CAP = 30.0


def erf(xp, x):
    """The error function of a float array ``x`` of namespace ``xp``."""
    a = xp.abs(x)
    near = xp.minimum(a, ERF_CUT)
    term = near
    total = near
    twice_square = 2.0 * near * near
    for n in range(1, ERF_SERIES_TERMS + 1):
        term = term * twice_square / float(2 * n + 1)
        total = total + term
    small = (2.0 / math.sqrt(math.pi)) * xp.exp(-(near * near)) * total
    far = xp.minimum(xp.maximum(a, ERF_CUT), ERF_CAP)
    fraction = far
    for k in range(ERF_FRACTION_DEPTH, 0, -1):
        fraction = far + (k / 2.0) / fraction
    large = 1.0 - xp.exp(-(far * far)) / (math.sqrt(math.pi) * fraction)
    return xp.sign(x) * xp.where(a < ERF_CUT, small, large)
