"""Every public name has a Google-style docstring with a runnable example, and every example runs.

Public = the names in ``retrograd.__all__`` and in the ``__all__`` of the public
subpackages (for ``rg.optim.lr``, which has none: the names it defines), plus the
public methods and properties a public class defines itself. Each docstring needs
a one-line summary, an ``Args:`` section where the callable takes arguments
(``Attributes:`` for a dataclass) and an ``Example:`` section holding a fenced
```python block (properties: a summary). The public modules' own docstrings
count too. Each ```python block runs here as written, in a fresh namespace and
fresh default programs (as in a new interpreter); one whose first line is
``# requires: torch`` (or another module, or ``cuda``) skips with the reason
when that is missing.

Run as a script (``PYTHONPATH=$PWD python tests/test_docstrings.py``) to list
the names that lack something.
"""
from __future__ import annotations

import importlib
import inspect
import re
import textwrap

import pytest

import retrograd as rg

MODULES = ("retrograd", "retrograd.layers", "retrograd.optim", "retrograd.optim.lr", "retrograd.memory",
           "retrograd.onnx", "retrograd.distributed", "retrograd.passes", "retrograd.testing",
           "retrograd.backends")

# Deliberate exceptions: name -> why it has no example of its own.
NO_EXAMPLE = {
    # Backend methods are the interface a backend module implements (called by kernels with the
    # backend's own arrays), not something a user calls; rg.backends.Backend's class docstring
    # shows how to reach one.
    **{f"retrograd.backends.Backend.{m}": "backend implementer interface, called by kernels"
       for m in ("matmul", "fused_attention", "fused_attention_grad",
                 "multi_adam", "conv", "conv_bias", "conv_input_grad", "conv_weight_grad", "max_pool", "max_pool_grad",
                 "max_pool_gather", "avg_pool", "avg_pool_grad", "einsum",
                 "capture_graph", "layer_norm", "layer_norm_backward",
                 "rms_norm", "rms_norm_backward", "channel_stats", "batch_norm", "batch_norm_backward",
                 "erf", "relu", "relu_grad", "gelu", "gelu_grad", "silu", "softplus", "elu", "leaky_relu", "logsumexp",
                 "linear", "global_norm", "softmax", "log_softmax", "add_along_axis", "cumsum", "cumprod",
                 "sort_descending", "take_along_axis", "put_along_axis", "random_uniform", "random_normal",
                 "random_keep_mask", "random_integers", "random_categorical", "kernel_for",
                 "region_compiler", "relu", "relu_grad", "thread_pools", "fix_threads")},
}

def _defined_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:       # rg.optim.lr: the names it defines itself, not what it imports
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return [n for n in names if not inspect.ismodule(getattr(module, n))]


def _members(cls) -> list[tuple[str, object]]:
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((name, value))
    return out


def public_objects() -> dict[str, object]:
    """Qualified name -> object, each object once (under the first module that lists it)."""
    found, seen = {}, set()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in _defined_names(module):
            obj = getattr(module, name)
            if not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            found[f"{module_name}.{name}"] = obj
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for member, value in _members(obj):
                    found[f"{module_name}.{name}.{member}"] = value
    return found


def _takes_arguments(obj) -> bool:
    if isinstance(obj, property):
        return False
    target = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj) and target is object.__init__:
        return False
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.name not in ("self", "cls") for p in params)


def problems(name: str, obj) -> list[str]:
    doc = inspect.getdoc(obj.fget if isinstance(obj, property) else obj) or ""
    if isinstance(obj, property):
        return [] if doc.strip() else ["no docstring"]
    if not doc.strip():
        return ["no docstring"]
    found = []
    lines = doc.splitlines()
    if len(lines) > 1 and lines[1].strip():
        found.append("the summary is not one line followed by a blank line")
    if "Example::" in doc:
        found.append("reST 'Example::' left (use an 'Example:' section with a ```python block)")
    exception = inspect.isclass(obj) and issubclass(obj, BaseException)
    arguments = r"^(Args|Attributes):\s*$" if inspect.isclass(obj) else r"^Args:\s*$"
    if not exception and _takes_arguments(obj) and not re.search(arguments, doc, re.M):
        found.append("no 'Args:' section")
    if name in NO_EXAMPLE:
        return found
    if not re.search(r"^Examples?:\s*$", doc, re.M) or "```python" not in doc:
        found.append("no 'Example:' section with a ```python block")
    return found


def examples(obj) -> list[str]:
    doc = inspect.getdoc(obj.fget if isinstance(obj, property) else obj) or ""
    return [textwrap.dedent(block) for block in re.findall(r"^[ \t]*```python\n(.*?)^[ \t]*```", doc, re.M | re.S)]


PUBLIC = public_objects()
MODULE_DOCS = {name: importlib.import_module(name) for name in MODULES}
EXAMPLES = [(f"{name}[{i}]", code) for name, obj in {**MODULE_DOCS, **PUBLIC}.items()
            for i, code in enumerate(examples(obj))]


def test_the_exception_lists_name_public_objects():
    assert not set(NO_EXAMPLE) - set(PUBLIC)
    assert not [name for name in NO_EXAMPLE if examples(PUBLIC[name])], "listed as exceptions, yet with examples"


def _rest_style(x, axis=0):
    """Sum over ``axis``.

    Example::

        rg.sum(x)
    """


def _google_style(x, axis=0):
    """Sum over ``axis``.

    Args:
        x: A Var.
        axis: The axis.

    Example:
        ```python
        assert 1 + 1 == 2
        ```
    """


def test_the_checker_tells_google_style_from_rest():
    assert problems("f", _google_style) == [] and examples(_google_style) == ["assert 1 + 1 == 2\n"]
    assert len(problems("f", _rest_style)) == 3 and examples(_rest_style) == []


@pytest.mark.parametrize("name", MODULES)
def test_public_module_docstring_has_no_rest_example(name):
    doc = inspect.getdoc(MODULE_DOCS[name]) or ""
    assert doc.strip() and "Example::" not in doc, f"{name}: use an 'Example:' section with a ```python block"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_name_has_a_google_docstring_with_an_example(name):
    found = problems(name, PUBLIC[name])
    assert not found, f"{name}: " + "; ".join(found)


def _skip_unless_available(code: str) -> None:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    match = re.match(r"#\s*requires:\s*(.+)", first)
    if not match:
        return
    for need in (n.strip() for n in match.group(1).split(",")):
        if need == "cuda":
            torch = pytest.importorskip("torch", reason="the example needs torch with CUDA")
            if not torch.cuda.is_available():
                pytest.skip("the example needs a CUDA device")
        else:
            pytest.importorskip(need, reason=f"the example needs {need}")


@pytest.mark.parametrize("name,code", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_docstring_example_runs(name, code):
    _skip_unless_available(code)
    with rg.program_guard(rg.Program(), rg.Program()):     # a fresh interpreter's default programs
        exec(compile(code, f"<example of {name}>", "exec"), {"__name__": "__example__"})


if __name__ == "__main__":
    missing = {n: problems(n, o) for n, o in PUBLIC.items()}
    missing = {n: p for n, p in missing.items() if p}
    for n, p in missing.items():
        print(f"{n}: {'; '.join(p)}")
    print(f"{len(PUBLIC) - len(missing)} of {len(PUBLIC)} public names complete; {len(EXAMPLES)} examples")
