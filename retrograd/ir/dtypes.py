"""The dtypes a Var may hold, and the rules for mixing them."""
from __future__ import annotations

import numpy as np

from ..errors import ProgramError

DTYPES = ("float32", "float64", "int64", "int32", "bool")
FLOAT_DTYPES = ("float32", "float64")


def canonical(dtype) -> str:
    """Return the dtype's name as retrograd spells it ("float32", ...)."""
    if isinstance(dtype, str) and dtype in DTYPES:      # already spelled so (most calls: no NumPy lookup)
        return dtype
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError, KeyError) as exc:
        raise ProgramError(f"unknown dtype {dtype!r:.40}; use one of {', '.join(DTYPES)}") from exc
    if name not in DTYPES:
        raise ProgramError(f"unsupported dtype {name!r}; use one of {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def promote(a: str, b: str) -> str:
    """Result dtype of a binary arithmetic op (NumPy's rule restricted to our dtypes)."""
    return canonical(np.promote_types(a, b))
