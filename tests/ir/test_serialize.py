"""Program.to_json / Program.from_json: exact round trips and clear errors on bad input."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import retrograd as rg
from retrograd.errors import ProgramError
from retrograd.ir import block_guard
from retrograd.ir.program import Block, Op, Program
from retrograd.ir.serialize import program_from_json, program_to_json

FLAGS = ("persistable", "trainable", "stop_gradient", "is_parameter", "is_data")


def build_mlp(seed: int = 3):
    main, startup = Program(random_seed=seed), Program(random_seed=seed)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("fc.w", [4, 3])
        b = rg.create_parameter("fc.b", [3], init=0.5)
        h = rg.tanh(rg.matmul(x, w) + b)
        loss = rg.mean(h * h)
        params_grads = rg.append_backward(loss)
    return main, startup, loss, params_grads


def build_with_sub_block():
    """Block 0 calls block 1 (by a sub-block attribute); block 1 has a bound input."""
    main = Program(random_seed=7)
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1, 3])
        scale = rg.create_parameter("scale", [3], init=2.0)
        body = main.create_block(main.global_block())
        h_in = body.create_var("h_in", [-1, 3])
        with block_guard(body):
            y = rg.tanh(h_in) * scale          # reads an outer parameter
            s = rg.sum(y, axis=1, keepdims=True)
        out = main.global_block().create_var("out", [-1, 1])
        main.global_block().append_op(Op("CallBlock", [x.name], [out.name],
                                         {"body": body, "binds": ["h_in"], "results": [s.name]}))
    return main, out


def assert_same_program(a: Program, b: Program) -> None:
    """Structural equality of everything a program holds, attribute types included."""
    assert a.random_seed == b.random_seed
    assert a._name_counts == b._name_counts and a._seed_counter == b._seed_counter
    assert len(a.blocks) == len(b.blocks)
    for ba, bb in zip(a.blocks, b.blocks):
        assert (ba.idx, ba.parent_idx) == (bb.idx, bb.parent_idx)
        assert list(ba.vars) == list(bb.vars)
        for name, va in ba.vars.items():
            vb = bb.vars[name]
            assert vb.block is bb
            assert (va.shape, va.dtype) == (vb.shape, vb.dtype)
            assert [getattr(va, f) for f in FLAGS] == [getattr(vb, f) for f in FLAGS], name
        assert len(ba.ops) == len(bb.ops)
        for oa, ob in zip(ba.ops, bb.ops):
            assert (oa.type, oa.inputs, oa.outputs) == (ob.type, ob.inputs, ob.outputs)
            assert ob.block is bb
            assert list(oa.attrs) == list(ob.attrs)
            for key in oa.attrs:
                assert_same_value(oa.attrs[key], ob.attrs[key], b)


def assert_same_value(x, y, program_y: Program) -> None:
    if isinstance(x, Block):
        assert isinstance(y, Block) and y.idx == x.idx and y.program is program_y
        return
    assert type(x) is type(y), (x, y)
    if isinstance(x, (list, tuple)):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert_same_value(u, v, program_y)
    elif isinstance(x, dict):
        assert list(x) == list(y)
        for key in x:
            assert_same_value(x[key], y[key], program_y)
    elif isinstance(x, float):
        assert (math.isnan(x) and math.isnan(y)) or x.hex() == y.hex()  # bit-exact, signed zeros too
    elif isinstance(x, np.ndarray):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    else:
        assert x == y


# --- Round trips ----------------------------------------------------------------------

def test_round_trip_of_a_built_program_with_its_backward_is_exact():
    main, startup, _, _ = build_mlp()
    for program in (main, startup):
        text = program.to_json()
        loaded = Program.from_json(text)
        assert_same_program(program, loaded)
        assert loaded.to_json() == text
        assert str(loaded) == str(program)


def test_round_trip_keeps_sub_blocks_and_block_references(call_block):
    main, _ = build_with_sub_block()
    loaded = Program.from_json(main.to_json())
    assert_same_program(main, loaded)
    call = loaded.global_block().ops[-1]
    assert call.attrs["body"] is loaded.blocks[1]
    assert loaded.blocks[1].parent is loaded.global_block()
    assert loaded.blocks[1].vars["h_in"].shape == (-1, 3)


def test_every_attribute_kind_survives_exactly(call_block):
    main, _ = build_with_sub_block()
    body = main.blocks[1]
    second = main.create_block(main.global_block())
    attrs = {
        "none": None, "yes": True, "no": False, "zero": 0, "int": -7, "big": 2**62 + 1,
        "float": 0.1, "third": 1 / 3, "tiny": 5e-324, "huge": 1.7976931348623157e308,
        "neg_zero": -0.0, "one_float": 1.0, "inf": math.inf, "ninf": -math.inf, "nan": math.nan,
        "text": 'héllo "quoted" \\ \n', "empty": "", "list": [1, 2.5, "a", None, True],
        "nested": [[1, [2, [3.25]]], [], [[]]], "tuple": (1, (2.0, "b")), "blocks": [body, second],
        "dict": {"a": 1, 2: [body]}, "array": np.arange(6, dtype="int64").reshape(2, 3),
        "np_float": np.float32(0.1),
    }
    main.global_block().ops[-1].attrs.update(attrs)
    loaded = Program.from_json(main.to_json())
    got = loaded.global_block().ops[-1].attrs
    expected = dict(attrs, np_float=float(np.float32(0.1)))  # NumPy scalars load as Python numbers
    for key, value in expected.items():
        assert_same_value(value, got[key], loaded)
    assert got["blocks"][1] is loaded.blocks[2]


def test_every_var_flag_and_dtype_survives():
    program = Program()
    block = program.global_block()
    for i, dtype in enumerate(("float32", "float64", "int64", "int32", "bool")):
        for j, flag in enumerate(FLAGS):
            block.create_var(f"v{i}_{j}", [-1, i, j], dtype, **{flag: True})
    block.create_var("scalar", [], "float64")
    loaded = Program.from_json(program.to_json())
    assert_same_program(program, loaded)


def test_loaded_program_runs_like_the_original():
    main, startup, loss, params_grads = build_mlp()
    xb = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")
    fetch = [loss.name] + [g.name for _, g in params_grads]

    def run(m, s):
        exe = rg.Executor()
        exe.run(s)
        return exe.run(m, feed={"x": xb}, fetch_list=fetch)

    expected = run(main, startup)
    got = run(Program.from_json(main.to_json()), Program.from_json(startup.to_json()))
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


def test_building_after_loading_does_not_clash_names_or_seeds():
    main, startup, loss, _ = build_mlp()
    main2, startup2 = Program.from_json(main.to_json()), Program.from_json(startup.to_json())
    before = set().union(*(b.vars for b in main2.blocks))
    with rg.program_guard(main2, startup2):
        x = main2.global_block().vars["x"]
        w = rg.create_parameter("fc2.w", [4, 3])
        rg.tanh(rg.matmul(x, w))
    new_names = set().union(*(b.vars for b in main2.blocks)) - before
    assert new_names and not new_names & before
    # The loaded program continues the original's name counters.
    assert Program.from_json(main.to_json()).unique_name("tanh") == main.unique_name("tanh") == "tanh_1"
    seeds = [op.attrs.get("seed") for op in startup2.global_block().ops if "seed" in op.attrs]
    assert len(seeds) == len(set(seeds)) == 2  # fc.w and fc2.w drew different seeds
    assert startup2.next_seed() == _advance(startup, 2)


def _advance(program: Program, times: int) -> int:
    seed = None
    for _ in range(times):
        seed = program.next_seed()
    return seed


def test_clone_is_deep_and_equal():
    main, _, _, _ = build_mlp()
    copy = main.clone()
    assert_same_program(main, copy)
    copy.global_block().vars["x"].shape = (-1, 99)
    assert main.global_block().vars["x"].shape == (-1, 4)


def test_json_is_plain_data_without_python_objects():
    main, _, _, _ = build_mlp()
    doc = json.loads(main.to_json())
    assert doc["format"] == "retrograd.program" and doc["version"] == 1
    assert [b["idx"] for b in doc["blocks"]] == [0]
    assert program_from_json(program_to_json(main)).to_json() == main.to_json()


# A JSON-representable attribute value, recursively: what ops may carry.
_scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.lists(inner, max_size=3).map(tuple), max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), _values, max_size=5))
def test_any_attribute_value_round_trips(attrs):
    program = Program()
    block = program.global_block()
    block.create_var("x", [2], is_data=True)
    block.create_var("y", [2])
    block.append_op(Op("Tanh", ["x"], ["y"], attrs))
    loaded = Program.from_json(program.to_json())
    got = loaded.global_block().ops[0].attrs
    assert list(got) == list(attrs)
    for key in attrs:
        assert_same_value(attrs[key], got[key], loaded)


def test_unsaveable_attribute_names_the_op_and_attribute():
    program = Program()
    block = program.global_block()
    block.create_var("x", [2], is_data=True)
    block.create_var("y", [2])
    block.append_op(Op("Tanh", ["x"], ["y"], {"fn": print}))
    with pytest.raises(ProgramError, match=r"op #0 Tanh.*'fn'"):
        program.to_json()


# --- Bad input -------------------------------------------------------------------------

def _good_doc() -> dict:
    main, _, _, _ = build_mlp()
    return json.loads(main.to_json())


def _var(doc, name):
    return next(v for v in doc["blocks"][0]["vars"] if v["name"] == name)


def _op(doc, type_):
    return next(o for o in doc["blocks"][0]["ops"] if o["type"] == type_)


BAD_DOCS = {
    "not an object": (lambda d: [1, 2], r"expected an object"),
    "wrong format": (lambda d: {**d, "format": "pickle"}, r"not a retrograd program"),
    "future version": (lambda d: {**d, "version": 99}, r"version 99"),
    "no blocks key": (lambda d: {k: v for k, v in d.items() if k != "blocks"}, r"missing field 'blocks'"),
    "empty blocks": (lambda d: {**d, "blocks": []}, r"no blocks"),
    "blocks not a list": (lambda d: {**d, "blocks": {"0": 1}}, r"'blocks'.*expected a list"),
    "seed not an int": (lambda d: {**d, "random_seed": "3"}, r"random_seed.*expected an integer"),
    "missing name counts": (lambda d: {k: v for k, v in d.items() if k != "name_counts"},
                            r"missing field 'name_counts'"),
    "missing dtype": (lambda d: _var(d, "x").pop("dtype") and d, r"vars\[\d+\] 'x'.*missing field 'dtype'"),
    "unknown dtype": (lambda d: _var(d, "x").update(dtype="complex64") or d, r"'x'.*unknown dtype 'complex64'"),
    "bad shape": (lambda d: _var(d, "x").update(shape=[-1, "4"]) or d, r"'x'.*shape"),
    "flag not a bool": (lambda d: _var(d, "x").update(is_data=1) or d, r"'x'.*is_data.*true or false"),
    "duplicate var": (lambda d: d["blocks"][0]["vars"].append(dict(_var(d, "x"))) or d, r"'x'.*twice"),
    "unknown op type": (lambda d: _op(d, "MatMul").update(type="MatMulll") or d,
                        r"op #\d+ MatMulll.*not registered"),
    "op missing inputs": (lambda d: _op(d, "MatMul").pop("inputs") and d, r"op #\d+ MatMul.*missing field 'inputs'"),
    "input not a string": (lambda d: _op(d, "MatMul")["inputs"].__setitem__(0, 3) or d,
                           r"MatMul inputs.*3 is not a variable name"),
    "undeclared input": (lambda d: _op(d, "MatMul")["inputs"].__setitem__(0, "ghost") or d,
                         r"op #\d+ MatMul.*'ghost'.*not declared"),
    "dangling block ref": (lambda d: _op(d, "Tanh")["attrs"].update(body={"block": 4}) or d,
                           r"Tanh, attribute 'body'.*block 4"),
    "unknown tag": (lambda d: _op(d, "Tanh")["attrs"].update(x={"eval": "1+1"}) or d,
                    r"attribute 'x'.*unrecognised tagged value"),
    "bad float tag": (lambda d: _op(d, "Tanh")["attrs"].update(x={"float": "big"}) or d,
                      r"attribute 'x'.*unknown float"),
    "block idx out of order": (lambda d: d["blocks"][0].update(idx=1) or d, r"blocks\[0\].*idx 1"),
    "global block with parent": (lambda d: d["blocks"][0].update(parent=0) or d, r"block 0.*parent"),
    "parent not earlier": (lambda d: d["blocks"].append({"idx": 1, "parent": 1, "vars": [], "ops": []}) or d,
                           r"block 1: parent 1"),
    "shape mismatch": (lambda d: _var(d, "matmul_0").update(shape=[-1, 5]) or d,
                       r"op #\d+ MatMul.*'matmul_0'.*float32\[\?, 3\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_bad_documents_raise_program_error_naming_the_fault(case):
    mutate, pattern = BAD_DOCS[case]
    text = json.dumps(mutate(_good_doc()))
    with pytest.raises(ProgramError, match=pattern):
        Program.from_json(text)


@pytest.mark.parametrize("text", ["", "{", "{'blocks': []}", "[1, 2", "null", "\x00", "NaN x"])
def test_malformed_json_raises_program_error(text):
    with pytest.raises(ProgramError, match=r"malformed|expected an object"):
        Program.from_json(text)


def test_json_error_unterminated_string_says_at_once():
    """Issue 23: json's "Unterminated string starting at" gave "starting at at line 1"."""
    with pytest.raises(ProgramError) as info:
        Program.from_json('{"blocks": "abc')
    message = str(info.value)
    assert "at at" not in message
    assert "Unterminated string starting at line 1, column 12" in message


def test_non_text_input_raises_program_error():
    with pytest.raises(ProgramError, match="must be text"):
        Program.from_json(42)


# --- untrusted documents (issue #10: classes of bad input) --------------------------------------

def _cond_program_doc() -> dict:
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [2, 3])
        y = rg.cond(rg.sum(x) > 0.0, lambda: x * 2.0, lambda: x * 3.0)
        rg.sum(y, axis=1)
    return json.loads(main.to_json())


def _ops_of(doc, op_type):
    return [op for block in doc["blocks"] for op in block["ops"] if op["type"] == op_type]


@pytest.mark.parametrize("depth", [101, 5_000, 200_000])
def test_deep_json_nesting_is_a_program_error_not_recursion_error(depth):
    with pytest.raises(ProgramError, match=f"nests lists and objects {depth} deep"):
        Program.from_json("[" * depth + "]" * depth)
    doc = _cond_program_doc()
    text = json.dumps(doc).replace('"keepdims": false', '"keepdims": ' + "[" * depth + "]" * depth, 1)
    with pytest.raises(ProgramError, match="nests lists and objects"):
        Program.from_json(text)


def test_brackets_inside_strings_do_not_count_as_nesting():
    doc = _cond_program_doc()
    doc["blocks"][0]["ops"][0]["location"] = "[" * 500 + '\\"{' * 100
    again = Program.from_json(json.dumps(doc))
    assert again.global_block().ops[0].location.startswith("[[[")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "1" * 5000, str(2**63), "-" + "9" * 25])
def test_non_finite_and_oversized_numbers_are_refused(number):
    text = json.dumps(_cond_program_doc()).replace('"random_seed": 0', f'"random_seed": {number}', 1)
    with pytest.raises(ProgramError, match="malformed|too large|64 bits"):
        Program.from_json(text)


@pytest.mark.parametrize("value", [1.0, 1.5, "0", True, None, -2])
def test_non_integer_numbers_where_integers_belong(value):
    doc = _cond_program_doc()
    doc["blocks"][1]["parent"] = value
    with pytest.raises(ProgramError, match=r"blocks\[1\]|block 1: parent"):
        Program.from_json(json.dumps(doc))
    doc = _cond_program_doc()
    doc["blocks"][0]["vars"][0]["shape"] = [2, value]
    with pytest.raises(ProgramError, match="shape"):
        Program.from_json(json.dumps(doc))


@pytest.mark.parametrize("ref", [{"block": 1.5}, {"block": "1"}, {"block": True}, {"block": 99},
                                 {"block": -1}, {"block": None}, {"block": [1]}, 1, "block 1",
                                 {"block": 0}, {"block": 1, "idx": 2}])
def test_block_references_of_the_wrong_type_or_out_of_range(ref):
    doc = _cond_program_doc()
    [if_op] = _ops_of(doc, "If")
    if_op["attrs"]["blocks"][0] = ref
    with pytest.raises(ProgramError, match="block|If"):
        Program.from_json(json.dumps(doc))


def test_blocks_nested_beyond_the_limit_are_refused_when_loading():
    from retrograd.ir.program import MAX_BLOCK_DEPTH
    blocks = [{"idx": 0, "parent": -1, "vars": [], "ops": []}]
    blocks += [{"idx": i, "parent": i - 1, "vars": [], "ops": []} for i in range(1, MAX_BLOCK_DEPTH + 5)]
    doc = {"format": "retrograd.program", "version": 1, "random_seed": 0, "seed_counter": 0,
           "name_counts": {}, "blocks": blocks}
    with pytest.raises(ProgramError, match=f"nested more than {MAX_BLOCK_DEPTH} blocks deep"):
        Program.from_json(json.dumps(doc))


@pytest.mark.parametrize("attrs", [{"axis": 1.5, "keepdims": False}, {"axis": "1", "keepdims": False},
                                   {"axis": [1, 1], "keepdims": False}, {"axis": [[1]], "keepdims": False},
                                   {"axis": {"block": 1}, "keepdims": False}, {"keepdims": False}])
def test_non_integer_axes_in_a_loaded_op_are_shape_errors(attrs):
    doc = _cond_program_doc()
    _ops_of(doc, "Sum")[-1]["attrs"] = attrs
    with pytest.raises(ProgramError, match=r"block 0, op #\d+ Sum"):
        Program.from_json(json.dumps(doc))


@pytest.mark.parametrize("shape", [[1.5, 4], ["a", 4], [None], [[2], 3], [True, 6], [2.0, 3.0]])
def test_non_integer_shapes_in_a_loaded_op_are_reported_not_crashed_on(shape):
    """The verifier formatted the rule's shape in its own message and crashed on a string."""
    main = Program()
    with rg.program_guard(main, Program()):
        rg.reshape(rg.data("x", [2, 3]), [3, 2])
    doc = json.loads(main.to_json())
    _ops_of(doc, "Reshape")[0]["attrs"]["shape"] = shape
    with pytest.raises(ProgramError, match="Reshape: shape rule"):
        Program.from_json(json.dumps(doc))


def test_array_attribute_out_of_its_dtype_range_is_a_program_error():
    doc = _cond_program_doc()
    _ops_of(doc, "Sum")[-1]["attrs"]["table"] = {"array": [2**62], "dtype": "int32"}
    with pytest.raises(ProgramError, match="not an array of int32"):
        Program.from_json(json.dumps(doc))
