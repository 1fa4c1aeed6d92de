"""The IR: a Program is a list of Blocks; a Block holds Vars and Ops.

Block 0 is the global block. A sub-block (the body of a loop, a branch of a
cond) has a parent and sees its ancestors' variables (lexical scoping).
Ops refer to variables by name; attributes may reference sub-blocks.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ProgramError
from .dtypes import canonical
from .location import here

_RECORD = object()  # Op(location=...) default: record the user's line now

# Filled by ``retrograd.ops`` so that ``x + y`` on Vars builds ops while the IR
# itself depends on nothing above it.
OPERATORS: dict[str, Callable[..., "Var"]] = {}

_program_serials = itertools.count()

# ``clone(for_test=True)`` rewrites its copy with the pass that ``retrograd/passes/for_test.py``
# hands over when imported (the pass needs the op registry; the IR imports no ops).
_FOR_TEST_PASS: dict[str, Callable[["Program"], None]] = {}


def register_for_test_pass(fn: Callable[["Program"], None]) -> Callable[["Program"], None]:
    """Called once by ``retrograd/passes/for_test.py`` with its ``make_test_program``."""
    _FOR_TEST_PASS["pass"] = fn
    return fn

# The IR's modules that build on this one (the printer, JSON, the builder context) hand their
# functions over when ``ir/__init__`` imports them, so this module imports none of them.
_SERVICES: dict[str, Callable] = {}


def provides(fn: Callable) -> Callable:
    """Register ``fn`` under its name for the methods below (a decorator for those modules)."""
    _SERVICES[fn.__name__] = fn
    return fn

# Blocks inside blocks: passes, the printer and the executor walk nested blocks
# recursively, so loading and verifying refuse deeper nesting than this.
MAX_BLOCK_DEPTH = 64


def as_int(value, what: str) -> int:
    """``value`` as an int: ints (NumPy's too) and integral floats; ProgramError for anything
    else (1.5, NaN, "1", None, True), which ``int()`` would truncate, parse or crash on."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise ProgramError(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")


def as_ints(values, what: str) -> list[int]:
    """A list of ints from any iterable (see ``as_int``); ProgramError if ``values`` is not one."""
    if type(values) is tuple and all(type(v) is int for v in values):     # a Var's own shape: as is
        return list(values)
    return [as_int(v, what) for v in as_list(values, what)]


def as_list(values, what: str) -> list:
    """``list(values)``; ProgramError for a non-iterable (or a string) where a list belongs."""
    if isinstance(values, (str, bytes, Var)) or not hasattr(values, "__iter__"):
        raise ProgramError(f"{what} must be a list, got {type(values).__name__} {values!r:.40}")
    return list(values)


def as_float(value, what: str) -> float:
    """``float(value)`` for numbers; ProgramError for strings, None and other objects."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise ProgramError(f"{what} must be a number, got {type(value).__name__} {value!r:.40}")


def _format_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


class Var:
    """A named, typed value in a block: build them with ``rg.data``, ops and layers.

    A Var has a ``name``, a ``shape`` (a tuple of ints, ``-1`` where known only
    at run time), a ``dtype`` and flags (``persistable``, ``trainable``,
    ``stop_gradient``, ``is_parameter``, ``is_data``). Python operators build ops:
    ``+ - * / // % ** @``, unary ``-``, ``< <= > >=`` (with Python numbers and
    NumPy arrays on either side), ``x[...]`` (``rg.getitem``) and ``x.T``; ``==``
    is identity, so Vars stay hashable (use ``rg.equal``). A Var has no truth
    value and cannot be iterated while the program is built (ProgramError: use
    ``rg.cond`` / ``rg.while_loop``, or index it).

    Args:
        block: The block that declares it (use ``Block.create_var`` or the builders).
        name: Its name, unique in the program.
        shape: Its shape; ``-1`` for a dimension known only at run time.
        dtype: ``"float32"`` (default), ``"float64"``, ``"int64"``, ``"int32"``, ``"bool"``...
        persistable: Lives in the executor's scope across runs (parameters, state).
        trainable: ``append_backward`` differentiates with respect to it by default.
        stop_gradient: No gradient flows into it.
        is_parameter: Made by ``rg.create_parameter``.
        is_data: Made by ``rg.data`` (fed at run time).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 8])                  # batch size known only at run time
            y = rg.tanh(x * 2.0 + 1.0)[:, :2]          # operators build ops
        assert x.shape == (-1, 8) and y.dtype == "float32"
        (out,) = rg.Executor().run(main, feed={"x": np.zeros((3, 8), "float32")}, fetch_list=[y])
        assert out.shape == (3, 2) and np.allclose(out, np.tanh(1.0))
        ```
    """

    # Let ``numpy_scalar * var`` reach Var.__rmul__ instead of NumPy broadcasting.
    __array_ufunc__ = None

    def __init__(self, block: "Block", name: str, shape, dtype="float32", *,
                 persistable: bool = False, trainable: bool = False,
                 stop_gradient: bool = False, is_parameter: bool = False,
                 is_data: bool = False):
        self.block = block
        self.name = name
        if type(shape) is tuple and all(type(d) is int for d in shape):     # another Var's shape: as is
            self.shape = shape
        elif type(shape) is list and all(type(d) is int for d in shape):    # what shape rules answer
            self.shape = tuple(shape)
        else:
            self.shape = tuple(as_ints(shape, f"the shape of '{name}'"))
        self.dtype = canonical(dtype)
        self.persistable = persistable
        self.trainable = trainable
        self.stop_gradient = stop_gradient
        self.is_parameter = is_parameter
        self.is_data = is_data

    @property
    def ndim(self) -> int:
        """The number of dimensions (``len(shape)``)."""
        return len(self.shape)

    def type_str(self) -> str:
        """The dtype and shape as text, ``?`` for unknown dimensions.

        Returns:
            A string such as ``"float32[?, 8]"``.

        Example:
            ```python
            import retrograd as rg

            with rg.program_guard(rg.Program()):
                x = rg.data("x", [-1, 8])
            assert x.type_str() == "float32[?, 8]"
            ```
        """
        return f"{self.dtype}{_format_shape(self.shape)}"

    def __repr__(self) -> str:
        return f"Var({self.name}: {self.type_str()})"

    def __bool__(self):
        raise ProgramError(
            f"Var '{self.name}' has no truth value while the program is being built; "
            "use rg.cond / rg.while_loop for data-dependent control flow")

    # Arithmetic builds ops through the table filled by retrograd.ops.
    def __add__(self, other): return OPERATORS["add"](self, other)
    def __radd__(self, other): return OPERATORS["add"](other, self)
    def __sub__(self, other): return OPERATORS["sub"](self, other)
    def __rsub__(self, other): return OPERATORS["sub"](other, self)
    def __mul__(self, other): return OPERATORS["mul"](self, other)
    def __rmul__(self, other): return OPERATORS["mul"](other, self)
    def __truediv__(self, other): return OPERATORS["div"](self, other)
    def __rtruediv__(self, other): return OPERATORS["div"](other, self)
    def __matmul__(self, other): return OPERATORS["matmul"](self, other)
    def __rmatmul__(self, other): return OPERATORS["matmul"](other, self)
    def __pow__(self, other): return OPERATORS["pow"](self, other)
    def __rpow__(self, other): return OPERATORS["pow"](other, self)
    def __floordiv__(self, other): return OPERATORS["floor_divide"](self, other)
    def __rfloordiv__(self, other): return OPERATORS["floor_divide"](other, self)
    def __mod__(self, other): return OPERATORS["mod"](self, other)
    def __rmod__(self, other): return OPERATORS["mod"](other, self)
    def __neg__(self): return OPERATORS["neg"](self)
    def __lt__(self, other): return OPERATORS["less"](self, other)
    def __le__(self, other): return OPERATORS["less_equal"](self, other)
    def __gt__(self, other): return OPERATORS["greater"](self, other)
    def __ge__(self, other): return OPERATORS["greater_equal"](self, other)
    __hash__ = object.__hash__

    def __getitem__(self, key):
        """``x[1:, ::2, None, i]``: ints, slices (steps too), None, ``...`` and int64 0-d Vars."""
        return OPERATORS["getitem"](self, key)

    def __iter__(self):
        # Without this, __getitem__ would make a Var iterable (x[0], x[1], ... until IndexError),
        # and a dimension known only at run time would never end it.
        raise ProgramError(f"Var '{self.name}' cannot be iterated while the program is being built; "
                           "index it (x[i]) or split it (rg.split)")

    @property
    def T(self) -> "Var":
        """The Var with its axes reversed (``x.T`` of a matrix is its transpose)."""
        return OPERATORS["transpose"](self)


class Op:
    """One operator: ``outputs = type(inputs; attrs)``; inputs and outputs are Var names.

    Ops are usually appended by the builders (``rg.add``, layers); build one
    yourself to extend a program by hand (``Block.append_op``).

    Args:
        type: The registered op type, CamelCase (``"MatMul"``).
        inputs: The input Var names, in the op's positional order.
        outputs: The output Var names.
        attrs: Attributes (ints, floats, strings, bools, lists, sub-blocks).
        location: Where user code built it (``"train.py:42"``) or None; by
            default recorded from the call stack now.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2, 3])
            y = rg.exp(x)
        op = main.global_block().ops[0]
        assert op.type == "Exp" and op.inputs == ["x"] and op.outputs == [y.name]
        ```
    """

    def __init__(self, type: str, inputs, outputs, attrs: dict[str, Any] | None = None,
                 location: Any = _RECORD):
        self.type = type
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self.block: Block | None = None
        self.location: str | None = here() if location is _RECORD else location

    def sub_blocks(self) -> list["Block"]:
        """The sub-blocks this op's attributes reference, in attribute order.

        Returns:
            A list of Blocks (empty for ops without sub-blocks).

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
                y = rg.cond(rg.sum(x) > 0.0, lambda: x * 2.0, lambda: -x)
            if_op = main.global_block().ops[-1]
            assert if_op.type == "If" and len(if_op.sub_blocks()) == 2
            ```
        """
        found = []
        for value in self.attrs.values():
            if isinstance(value, Block):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    if isinstance(v, Block):
                        found.append(v)
        return found

    def index(self) -> int:
        """The position of this op in its block (-1 if not placed yet).

        Returns:
            The index into ``op.block.ops``, or -1.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
                y = rg.exp(rg.tanh(x))
            assert [op.index() for op in main.global_block().ops] == [0, 1]
            ```
        """
        if self.block is None:
            return -1
        for i, op in enumerate(self.block.ops):
            if op is self:
                return i
        return -1

    def where(self) -> str:
        """Where the op is, for error messages: ``'train.py:42: op #3 MatMul in block 0'``.

        The user's line comes first, as in a compiler's message, when it is known.

        Returns:
            The description, as text.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            assert main.global_block().ops[0].where().endswith("op #0 Exp in block 0")
            ```
        """
        block = "?" if self.block is None else self.block.idx
        place = f"{self.location}: " if self.location else ""
        return f"{place}op #{self.index()} {self.type} in block {block}"

    def __repr__(self) -> str:
        return f"Op({self.type}: {self.inputs} -> {self.outputs})"


class Block:
    """An ordered list of ops over the variables it declares (and its ancestors').

    ``vars`` maps names to the Vars this block declares, ``ops`` lists its ops,
    ``idx`` is its index in ``program.blocks`` and ``parent_idx`` its parent's
    (-1 for the global block). A sub-block (a loop body, a branch) sees its
    ancestors' variables.

    Args:
        program: The program it belongs to (use ``Program.create_block``).
        idx: Its index in ``program.blocks``.
        parent_idx: Its parent's index, -1 for the global block.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2])
            y = rg.tanh(x)
        block = main.global_block()
        assert block.idx == 0 and "x" in block.vars and block.ops[0].type == "Tanh"
        ```
    """

    def __init__(self, program: "Program", idx: int, parent_idx: int = -1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars: dict[str, Var] = {}
        self.ops: list[Op] = []

    @property
    def parent(self) -> "Block | None":
        """The enclosing block, or None for the global block."""
        return None if self.parent_idx < 0 else self.program.blocks[self.parent_idx]

    def ancestors(self) -> Iterator["Block"]:
        """This block, then its parent, up to the global block.

        Returns:
            An iterator over Blocks.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            body = main.create_block()                     # a sub-block of block 0
            assert [b.idx for b in body.ancestors()] == [1, 0]
            ```
        """
        block: Block | None = self
        while block is not None:
            yield block
            block = block.parent

    def depth(self) -> int:
        """How many blocks enclose this one: 0 for the global block.

        Returns:
            The nesting depth.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            inner = main.create_block(main.create_block())
            assert main.global_block().depth() == 0 and inner.depth() == 2
            ```
        """
        return sum(1 for _ in self.ancestors()) - 1

    def find_var(self, name: str) -> Var | None:
        """The variable ``name`` as seen from this block (lexical lookup), or None.

        Args:
            name: The variable's name.

        Returns:
            The Var declared here or in the nearest ancestor, or None.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
            body = main.create_block()
            assert body.find_var("x") is x and body.find_var("nope") is None
            ```
        """
        var = self.vars.get(name)
        if var is not None:
            return var
        for block in self.ancestors():
            var = block.vars.get(name)
            if var is not None:
                return var
        return None

    def var(self, name: str) -> Var:
        """The variable ``name`` as seen from this block.

        Args:
            name: The variable's name.

        Returns:
            The Var declared here or in the nearest ancestor.

        Raises:
            ProgramError: Neither this block nor an ancestor declares it.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
            assert main.global_block().var("x") is x
            ```
        """
        var = self.find_var(name)
        if var is None:
            raise ProgramError(f"block {self.idx} has no variable '{name}' (nor do its ancestors)")
        return var

    def sees(self, var: Var) -> bool:
        """Whether ``var`` is declared in this block or one of its ancestors.

        Args:
            var: The Var to look for.

        Returns:
            True when an op of this block may read it.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
            body = main.create_block()
            inner = body.create_var("t", [2])
            assert body.sees(x) and not main.global_block().sees(inner)
            ```
        """
        if var.block is self:        # the common case: no walk up the blocks
            return True
        return any(block is var.block for block in self.ancestors())

    def home_of(self, var: Var) -> str:
        """Where ``var`` lives, for errors about a Var this block cannot see.

        Args:
            var: The Var.

        Returns:
            ``'block 2'``, or ``'block 0 of another program'`` (Vars of two programs mixed).

        Example:
            ```python
            import retrograd as rg

            main, other = rg.Program(), rg.Program()
            with rg.program_guard(other):
                y = rg.data("y", [2])
            assert main.global_block().home_of(y) == "block 0 of another program"
            ```
        """
        other = "" if var.block.program is self.program else " of another program"
        return f"block {var.block.idx}{other}"

    def create_var(self, name: str, shape, dtype="float32", **flags) -> Var:
        """Declare a Var in this block without an op (an op's output, a loop state).

        Args:
            name: Its name, not yet used in this block.
            shape: Its shape (``-1`` for run-time dimensions).
            dtype: Its dtype (``"float32"`` by default).
            **flags: ``persistable``, ``trainable``, ``stop_gradient``,
                ``is_parameter``, ``is_data`` (see ``Var``).

        Returns:
            The new Var.

        Raises:
            ProgramError: The block already has a variable of that name.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            v = main.global_block().create_var("state", [4], persistable=True)
            assert v.persistable and main.global_block().vars["state"] is v
            ```
        """
        if name in self.vars:
            raise ProgramError(f"block {self.idx} already has a variable named '{name}'")
        var = Var(self, name, shape, dtype, **flags)
        self.vars[name] = var
        self.program.bump()
        return var

    def append_op(self, op: Op) -> Op:
        """Append ``op`` at the end of this block (and mark the program changed).

        Args:
            op: The Op; its input and output Vars must be visible from this block.

        Returns:
            The same Op, now placed.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            block = main.global_block()
            x = block.create_var("x", [2], is_data=True)
            y = block.create_var("y", [2])
            block.append_op(rg.Op("Exp", ["x"], ["y"]))
            (out,) = rg.Executor().run(main, feed={"x": np.zeros(2, "float32")}, fetch_list=[y])
            assert list(out) == [1.0, 1.0]
            ```
        """
        op.block = self
        self.ops.append(op)
        self.program.bump()
        return op

    def insert_op(self, index: int, op: Op) -> Op:
        """Insert ``op`` at position ``index`` of this block (and mark the program changed).

        Args:
            index: Where the op goes in ``block.ops``.
            op: The Op.

        Returns:
            The same Op, now placed.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
                y = rg.exp(x)
            block = main.global_block()
            t = block.create_var("t", [2])
            block.insert_op(0, rg.Op("Tanh", ["x"], ["t"]))
            assert [op.type for op in block.ops] == ["Tanh", "Exp"]
            ```
        """
        op.block = self
        self.ops.insert(index, op)
        self.program.bump()
        return op

    def remove_op(self, index: int) -> Op:
        """Remove and return the op at ``index`` (and mark the program changed).

        Args:
            index: The op's position in ``block.ops``.

        Returns:
            The removed Op.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.tanh(rg.data("x", [2])))
            removed = main.global_block().remove_op(1)
            assert removed.type == "Exp" and len(main.global_block().ops) == 1
            ```
        """
        op = self.ops.pop(index)
        self.program.bump()
        return op

    def __repr__(self) -> str:
        return f"Block({self.idx}, parent={self.parent_idx}, {len(self.ops)} ops)"


class Program:
    """A whole program: a list of Blocks, ``blocks[0]`` being the global block.

    Build into it with ``rg.program_guard``; ``print(program)`` shows it one op
    per line with shapes; an ``Executor`` runs it. Parameter initialisers go to
    a separate startup program.

    Args:
        random_seed: The seed its random initialisers and random ops derive
            theirs from (with the build order), so a rebuilt program draws the
            same numbers.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 4])
            y = rg.layers.fc(x, 2, name="fc")
        print(main)                                    # one op per line, with shapes
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.ones((3, 4), "float32")}, fetch_list=[y])
        assert out.shape == (3, 2)
        ```
    """

    def __init__(self, random_seed: int = 0):
        self.random_seed = int(random_seed)
        self.blocks: list[Block] = [Block(self, 0)]
        self.version = 0
        self.serial = next(_program_serials)
        # serials of the programs this one was cloned from (``clone``): their Vars are its Vars too
        self.lineage: frozenset[int] = frozenset()
        self._name_counts: dict[str, int] = {}
        self._seed_counter = 0

    def bump(self) -> None:
        """Mark the program changed, so executors recompile their cached plans.

        Call it after editing ``block.ops`` or ``block.vars`` directly (the Block
        methods call it for you).

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            before = main.version
            main.bump()
            assert main.version == before + 1
            ```
        """
        self.version += 1

    def global_block(self) -> Block:
        """Block 0, the global block (``blocks[0]``).

        Returns:
            The global Block.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            assert main.global_block() is main.blocks[0] and main.global_block().idx == 0
            ```
        """
        return self.blocks[0]

    def block(self, idx: int) -> Block:
        """The block at index ``idx``.

        Args:
            idx: An index into ``program.blocks``.

        Returns:
            The Block.

        Raises:
            ProgramError: The program has no such block.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            body = main.create_block()
            assert main.block(1) is body
            ```
        """
        if not 0 <= idx < len(self.blocks):
            raise ProgramError(f"program has no block {idx} (it has {len(self.blocks)})")
        return self.blocks[idx]

    def create_block(self, parent: Block | None = None) -> Block:
        """A new sub-block (a cell block for ``rg.recurrent_net``, a body by hand).

        Args:
            parent: Its parent; by default the block being built (inside
                ``rg.block_guard``), else the global block.

        Returns:
            The new Block, appended to ``program.blocks``.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            cell = main.create_block()
            assert cell.idx == 1 and cell.parent is main.global_block()
            ```
        """
        if parent is None:
            parent = _SERVICES["current_block"]()
            if parent.program is not self:
                parent = self.global_block()
        block = Block(self, len(self.blocks), parent.idx)
        self.blocks.append(block)
        self.bump()
        return block

    def has_name(self, name: str) -> bool:
        """Whether any block of the program declares a variable ``name``.

        Args:
            name: The variable name.

        Returns:
            True when the name is taken.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                rg.data("x", [2])
            assert main.has_name("x") and not main.has_name("y")
            ```
        """
        for block in self.blocks:
            if name in block.vars:
                return True
        return False

    def unique_name(self, prefix: str) -> str:
        """A variable name not used anywhere in the program: ``prefix_N``.

        Args:
            prefix: The name's stem.

        Returns:
            The first free ``prefix_N`` (N counts per prefix).

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            a, b = main.unique_name("tmp"), main.unique_name("tmp")
            assert (a, b) == ("tmp_0", "tmp_1")
            ```
        """
        while True:
            count = self._name_counts.get(prefix, 0)
            self._name_counts[prefix] = count + 1
            name = f"{prefix}_{count}"
            if not self.has_name(name):
                return name

    @property
    def name_counts(self) -> dict[str, int]:
        """How many names ``unique_name`` handed out per prefix: the program's own dict (a
        rewrite that is undone, or a program read from JSON, sets the counts through it).

        Returns:
            The counts per prefix.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            main.unique_name("tmp")
            assert main.name_counts == {"tmp": 1}
            ```
        """
        return self._name_counts

    def next_seed(self) -> int:
        """A reproducible seed for the next random op (it depends on the build order only).

        Returns:
            An int in ``[0, 2**31 - 1)`` derived from ``random_seed`` and a counter.

        Example:
            ```python
            import retrograd as rg

            a, b = rg.Program(random_seed=7), rg.Program(random_seed=7)
            assert a.next_seed() == b.next_seed() and a.next_seed() != a.next_seed()
            ```
        """
        self._seed_counter += 1
        return (self.random_seed * 1_000_003 + self._seed_counter) % (2**31 - 1)

    def list_vars(self) -> list[Var]:
        """Every variable of every block, block by block.

        Returns:
            A list of Vars.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            assert [v.name for v in main.list_vars()] == ["x", y.name]
            ```
        """
        return [var for block in self.blocks for var in block.vars.values()]

    def all_parameters(self) -> list[Var]:
        """The parameters (``rg.create_parameter``'s Vars) of the global block.

        Returns:
            A list of Vars, in creation order.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main, rg.Program()):
                rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc")
            assert [p.name for p in main.all_parameters()] == ["fc.w", "fc.b"]
            ```
        """
        return [var for var in self.global_block().vars.values() if var.is_parameter]

    def __str__(self) -> str:
        return _SERVICES["format_program"](self)

    def to_string(self, locations: bool = False) -> str:
        """The program as text (what ``str(program)`` gives).

        Args:
            locations: End each op's line with ``# file:line`` where user code built it.

        Returns:
            One op per line, with shapes and dtypes; sub-blocks nested.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            text = main.to_string(locations=True)
            assert "Exp" in text and "#" in text
            ```
        """
        return _SERVICES["format_program"](self, locations=locations)

    def to_json(self) -> str:
        """The program as JSON text; ``Program.from_json`` restores it exactly.

        Returns:
            The JSON text (no code, no pickle).

        Example:
            ```python
            import json
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            assert isinstance(json.loads(main.to_json()), dict)
            ```
        """
        return _SERVICES["program_to_json"](self)

    @staticmethod
    def from_json(text: str) -> "Program":
        """Load a program saved by ``to_json``; loading never executes code, and the result is verified.

        Args:
            text: The JSON text.

        Returns:
            The Program.

        Raises:
            ProgramError: The text is not a valid program.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            copy = rg.Program.from_json(main.to_json())
            assert str(copy) == str(main)
            ```
        """
        return _SERVICES["program_from_json"](text)

    def clone(self, for_test: bool = False) -> "Program":
        """A deep copy (through the JSON form, so nothing is shared).

        The copy remembers where it came from, so the original's Vars can be
        fetched from it and fed to it: ``exe.run(main.clone(), fetch_list=[loss])``.

        With ``for_test=True`` the copy is the program's evaluation form: forward
        only (no gradient ops, optimizer updates, AllReduce, nor the ops that only
        feed those); dropout is the identity and batch_norm uses its running
        statistics without writing them (ops registered ``test_mode=True`` get
        ``attrs["is_test"] = True``).

        Args:
            for_test: Make the evaluation form described above.

        Returns:
            The new Program.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                x = rg.data("x", [-1, 4])
                loss = rg.mean(rg.dropout(rg.layers.fc(x, 2, name="fc"), 0.5))
                rg.optim.SGD(0.1).minimize(loss)
            test_program = main.clone(for_test=True)       # no backward, no update, no dropout
            exe = rg.Executor()
            exe.run(startup)
            w = exe.scope.get("fc.w").copy()
            exe.run(test_program, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])
            assert np.array_equal(exe.scope.get("fc.w"), w)
            ```
        """
        copy = Program.from_json(self.to_json())
        copy.lineage = self.lineage | {self.serial}
        if for_test:
            if "pass" not in _FOR_TEST_PASS:
                raise ProgramError("clone(for_test=True) needs the op registry; import retrograd")
            _FOR_TEST_PASS["pass"](copy)
        return copy

    def owns(self, var: Var) -> bool:
        """Whether ``var`` belongs to this program or one related to it by ``clone``.

        Related means its source, a clone of it, or a clone of the same source.
        Executors and the ONNX exporter check fetches and feed keys with it: a Var
        of an unrelated program would bind by name to a different variable.

        Args:
            var: The Var.

        Returns:
            True when it may be fed to or fetched from this program.

        Example:
            ```python
            import retrograd as rg

            main, other = rg.Program(), rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
            assert main.clone().owns(x) and not other.owns(x)
            ```
        """
        other = var.block.program
        if other is self:
            return True
        return bool((self.lineage | {self.serial}) & (other.lineage | {other.serial}))
