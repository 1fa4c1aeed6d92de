"""save_params / load_params: round trip, exact resume, bad files rejected, atomic writes."""
from __future__ import annotations

import os

import numpy as np
import pytest

import retrograd as rg
import retrograd.io as rio


def _build(hidden: int = 8, opt=None):
    main, startup = rg.Program(random_seed=5), rg.Program(random_seed=5)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4], "float64")
        y = rg.data("y", [-1, 2], "float64")
        w1 = rg.create_parameter("l1.w", [4, hidden], "float64")
        b1 = rg.create_parameter("l1.b", [hidden], "float64")
        w2 = rg.create_parameter("l2.w", [hidden, 2], "float64")
        pred = rg.matmul(rg.tanh(rg.matmul(x, w1) + b1), w2)
        loss = rg.mean(rg.square(pred - y))
        (opt or rg.optim.Adam(0.02, clip_norm=1.0)).minimize(loss)
    return main, startup, loss


def _batch(step: int):
    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((12, 4))
    return {"x": x, "y": np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], axis=1)}


def _train(exe, main, loss, steps: range) -> list[float]:
    return [float(exe.run(main, feed=_batch(s), fetch_list=[loss])[0]) for s in steps]


def _fresh(startup):
    exe = rg.Executor()
    exe.run(startup)
    return exe


def test_round_trip_saves_every_persistable(tmp_path):
    main, startup, loss = _build()
    exe = _fresh(startup)
    _train(exe, main, loss, range(3))
    path = tmp_path / "ckpt.npz"
    assert rg.save_params(exe.scope, path, main) == path
    stored = rg.read_params(path)
    expected = {v.name for v in main.global_block().vars.values() if v.persistable}
    assert set(stored) == expected
    with np.load(path) as raw:                       # a plain .npz, one array per persistable
        assert set(raw.files) == expected
    assert {"l1.w.moment1", "l1.w.moment2", "l1.w.step"} <= set(stored)
    other = rg.Executor()
    loaded = rg.load_params(other.scope, path, main)
    assert loaded == sorted(expected)
    for name in expected:
        a, b = exe.scope.get(name), other.scope.get(name)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert stored["l1.w.step"].tolist() == [3]


def test_resume_equals_straight_training(tmp_path):
    k = 4
    main, startup, loss = _build()
    straight = _fresh(startup)
    losses_straight = _train(straight, main, loss, range(2 * k))

    first = _fresh(startup)
    losses_a = _train(first, main, loss, range(k))
    rg.save_params(first.scope, tmp_path / "half.npz", main)

    main2, startup2, loss2 = _build()          # rebuilt from scratch, as a new process would
    second = _fresh(startup2)
    rg.load_params(second.scope, tmp_path / "half.npz", main2)
    losses_b = _train(second, main2, loss2, range(k, 2 * k))

    assert losses_a + losses_b == losses_straight
    for name in ("l1.w", "l1.b", "l2.w", "l2.w.moment2", "l2.w.step"):
        np.testing.assert_array_equal(second.scope.get(name), straight.scope.get(name))


def test_load_without_program_checks_existing_values(tmp_path):
    main, startup, loss = _build(hidden=8)
    rg.save_params(_fresh(startup).scope, tmp_path / "a.npz", main)
    _, startup_big, _ = _build(hidden=16)
    exe = _fresh(startup_big)
    before = np.array(exe.scope.get("l1.w"))
    with pytest.raises(rio.ParamFileError, match=r"'l1.w' has shape \[4, 8\] in the file, expected \[4, 16\]"):
        rg.load_params(exe.scope, tmp_path / "a.npz")
    np.testing.assert_array_equal(exe.scope.get("l1.w"), before)   # untouched
    empty = rg.Scope()
    rg.load_params(empty, tmp_path / "a.npz")
    assert empty.get("l1.w").shape == (4, 8)


def test_mismatched_model_is_rejected_and_scope_untouched(tmp_path):
    main, startup, _ = _build(hidden=8)
    rg.save_params(_fresh(startup).scope, tmp_path / "small.npz", main)
    big_main, big_startup, _ = _build(hidden=16)
    exe = _fresh(big_startup)
    before = {n: np.array(exe.scope.get(n)) for n in exe.scope.names()}
    with pytest.raises(rg.RetrogradError) as info:
        rg.load_params(exe.scope, tmp_path / "small.npz", big_main)
    message = str(info.value)
    assert "'l1.w' has shape [4, 8] in the file, expected [4, 16]" in message
    assert "'l2.w'" in message and "\n" not in message
    assert isinstance(info.value, rg.FeedError)
    for name, value in before.items():
        np.testing.assert_array_equal(exe.scope.get(name), value)


def test_missing_names_and_dtype_mismatch_are_reported(tmp_path):
    sgd_main, sgd_startup, _ = _build(opt=rg.optim.SGD(0.1))
    rg.save_params(_fresh(sgd_startup).scope, tmp_path / "sgd.npz", sgd_main)
    adam_main, adam_startup, _ = _build()
    with pytest.raises(rio.ParamFileError, match=r"missing 'l1.b.moment1'.*and \d+ more"):
        rg.load_params(_fresh(adam_startup).scope, tmp_path / "sgd.npz", adam_main)
    arrays = {k: v.astype(np.float32) if k == "l1.b" else v for k, v in rg.read_params(tmp_path / "sgd.npz").items()}
    np.savez(tmp_path / "f32.npz", **arrays)
    with pytest.raises(rio.ParamFileError, match="'l1.b' has dtype float32 in the file, expected float64"):
        rg.load_params(rg.Scope(), tmp_path / "f32.npz", sgd_main)
    # A plain np.savez file with the right names loads.
    np.savez(tmp_path / "plain.npz", **rg.read_params(tmp_path / "sgd.npz"))
    assert "l1.w" in rg.load_params(rg.Scope(), tmp_path / "plain.npz", sgd_main)


def test_strict_rejects_extra_entries(tmp_path):
    main, startup, _ = _build()
    rg.save_params(_fresh(startup).scope, tmp_path / "adam.npz", main)
    sgd_main, _, _ = _build(opt=rg.optim.SGD(0.1))
    assert "l1.w.moment1" in rg.load_params(rg.Scope(), tmp_path / "adam.npz", sgd_main)
    with pytest.raises(rio.ParamFileError, match="not in the program: 'l1.b.moment1'"):
        rg.load_params(rg.Scope(), tmp_path / "adam.npz", sgd_main, strict=True)


@pytest.mark.parametrize("content", [b"", b"not a zip file at all", b"PK\x03\x04garbage"])
def test_corrupt_files_are_rejected(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(rio.ParamFileError, match="not a readable parameter file"):
        rg.load_params(rg.Scope(), path)


def test_truncated_file_is_rejected(tmp_path):
    main, startup, _ = _build()
    path = tmp_path / "ckpt.npz"
    rg.save_params(_fresh(startup).scope, path, main)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(rio.ParamFileError):
        rg.load_params(rg.Scope(), path, main)


def test_pickled_and_npy_files_are_rejected(tmp_path):
    np.savez(tmp_path / "obj.npz", w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(rio.ParamFileError, match="not a readable parameter file"):
        rg.load_params(rg.Scope(), tmp_path / "obj.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(rio.ParamFileError, match="single array"):
        rg.load_params(rg.Scope(), tmp_path / "one.npy")


def test_missing_file_is_rejected(tmp_path):
    with pytest.raises(rio.ParamFileError, match="does not exist"):
        rg.load_params(rg.Scope(), tmp_path / "nope.npz")


def test_save_needs_initialised_values_and_an_existing_directory(tmp_path):
    main, startup, _ = _build()
    with pytest.raises(rio.ParamFileError, match="run the startup program first"):
        rg.save_params(rg.Scope(), tmp_path / "x.npz", main)
    with pytest.raises(rio.ParamFileError, match="does not exist"):
        rg.save_params(_fresh(startup).scope, tmp_path / "no" / "x.npz", main)


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    main, startup, loss = _build()
    exe = _fresh(startup)
    path = tmp_path / "ckpt.npz"
    rg.save_params(exe.scope, path, main)
    old_bytes = path.read_bytes()
    _train(exe, main, loss, range(2))

    def crash_midway(file, arrays):
        file.write(b"PK\x03\x04 half of a zip")
        raise OSError("disk full")

    monkeypatch.setattr(rio, "_write_npz", crash_midway)
    with pytest.raises(rio.ParamFileError, match="disk full"):
        rg.save_params(exe.scope, path, main)
    assert path.read_bytes() == old_bytes
    assert os.listdir(tmp_path) == ["ckpt.npz"]          # no temporary file left behind
    monkeypatch.undo()
    rg.save_params(exe.scope, path, main)
    np.testing.assert_array_equal(rg.read_params(path)["l1.w"], exe.scope.get("l1.w"))


def test_save_writes_exactly_the_given_path(tmp_path):
    main, startup, _ = _build()
    rg.save_params(_fresh(startup).scope, tmp_path / "weights.bin", main)
    assert os.listdir(tmp_path) == ["weights.bin"]
    assert "l1.w" in rg.read_params(tmp_path / "weights.bin")


# --- untrusted parameter files, failing saves (issue #10: classes of bad input) -----------------

import io as _bytes_io          # noqa: E402  (only these tests build archives by hand)
import subprocess               # noqa: E402
import sys                      # noqa: E402
import time                     # noqa: E402
import tracemalloc              # noqa: E402
import zipfile                  # noqa: E402


def _saved(tmp_path):
    main, startup, loss = _build()
    exe = _fresh(startup)
    path = tmp_path / "ckpt.npz"
    rg.save_params(exe.scope, path, main)
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    return main, exe, path, members


def _rewrite(path, members, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _npy_header(shape, descr="<f8") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def _both_loads_fail(main, path, match):
    for program in (main, None):
        scope = rg.Scope()
        with pytest.raises(rio.ParamFileError, match=match):
            rg.load_params(scope, path, program)
        assert scope.names() == []                       # nothing touched


@pytest.mark.parametrize("extra", ["notes.txt", "dir/", "l1.w.npy.bak", "x"])
def test_zip_members_that_are_not_npy_are_refused(tmp_path, extra):
    main, _, path, members = _saved(tmp_path)
    members[extra] = b"hello"
    _rewrite(path, members)
    _both_loads_fail(main, path, f"holds '{extra}', which is not an array")


@pytest.mark.parametrize("shape", [(10**12,), (2**31, 2**31), (4, 10**9)])
def test_enormous_declared_shapes_are_refused_before_allocating(tmp_path, shape):
    main, _, path, members = _saved(tmp_path)
    members["l1.w.npy"] = _npy_header(shape) + b"\0" * 64
    _rewrite(path, members)
    tracemalloc.start()
    try:
        _both_loads_fail(main, path, r"'l1.w' has shape|declares shape")
        with pytest.raises(rio.ParamFileError, match=r"declares shape .* more than the \d+ bytes it holds"):
            rg.read_params(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"reading a lying header allocated {peak} bytes"


def test_corrupt_compression_is_a_param_file_error(tmp_path):
    main, _, path, members = _saved(tmp_path)
    _rewrite(path, members, zipfile.ZIP_DEFLATED)
    assert rg.read_params(path)["l1.w"].shape == (4, 8)     # deflated files are fine
    raw = bytearray(path.read_bytes())
    start = raw.find(b"l1.w.npy") + len("l1.w.npy")            # the member's compressed data
    for i in range(start + 20, start + 60):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    _both_loads_fail(main, path, "not a readable parameter file")


@pytest.mark.parametrize("patch", ["encrypted", "unknown method"])
def test_encrypted_members_and_unknown_compression_methods_are_refused(tmp_path, patch):
    main, _, path, _ = _saved(tmp_path)
    raw = bytearray(path.read_bytes())
    central = raw.find(b"PK\x01\x02")
    if patch == "encrypted":
        raw[central + 8] |= 1
    else:
        raw[central + 10] = 99
    path.write_bytes(bytes(raw))
    _both_loads_fail(main, path, "not a readable parameter file")


def test_object_arrays_are_never_unpickled(tmp_path):
    main, _, path, members = _saved(tmp_path)
    buf = _bytes_io.BytesIO()
    np.lib.format.write_array(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    members["l1.w.npy"] = buf.getvalue()
    _rewrite(path, members)
    _both_loads_fail(main, path, "'l1.w' has dtype object")


def test_duplicate_members_and_bad_headers_are_refused(tmp_path):
    main, _, path, members = _saved(tmp_path)
    members["l1.w.npy"] = b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8'\n" + b"\0" * 8
    _rewrite(path, members)
    _both_loads_fail(main, path, "not a readable parameter file")
    main, _, path, members = _saved(tmp_path)
    with zipfile.ZipFile(path, "a") as archive, pytest.warns(UserWarning):
        archive.writestr("l1.w.npy", members["l1.w.npy"])
    _both_loads_fail(main, path, "holds 'l1.w' twice")


def test_big_endian_and_fortran_members_load_as_native_arrays(tmp_path):
    main, exe, path, members = _saved(tmp_path)
    w = np.asarray(exe.scope.get("l1.w"))
    buf = _bytes_io.BytesIO()
    np.lib.format.write_array(buf, np.asfortranarray(w.astype(">f8")))
    members["l1.w.npy"] = buf.getvalue()
    _rewrite(path, members)
    scope = rg.Scope()
    rg.load_params(scope, path, main)
    np.testing.assert_array_equal(scope.get("l1.w"), w)
    assert scope.get("l1.w").dtype == np.float64 and scope.get("l1.w").flags.c_contiguous


def test_object_values_are_never_saved_as_pickles(tmp_path):
    main, startup, _ = _build()
    exe = _fresh(startup)
    exe.scope.vars["l1.w"] = np.array([object()], dtype=object)
    with pytest.raises(rio.ParamFileError, match="cannot save 'l1.w'.*never pickled"):
        rg.save_params(exe.scope, tmp_path / "x.npz", main)
    assert os.listdir(tmp_path) == []


def test_a_value_named_like_a_savez_argument_saves(tmp_path):
    """np.savez(file, **arrays) failed on a persistable named 'file'."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.create_parameter("file", [2], init=1.5)
    exe = _fresh(startup)
    rg.save_params(exe.scope, tmp_path / "p.npz", main)
    np.testing.assert_array_equal(np.load(tmp_path / "p.npz")["file"], [1.5, 1.5])


def test_os_errors_on_save_are_param_file_errors(tmp_path, monkeypatch):
    main, startup, _ = _build()
    exe = _fresh(startup)
    with pytest.raises(rio.ParamFileError, match="it is a directory"):
        rg.save_params(exe.scope, tmp_path, main)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rio, "_create_temp", refuse)
    with pytest.raises(rio.ParamFileError, match="cannot save to .*Permission denied"):
        rg.save_params(exe.scope, tmp_path / "p.npz", main)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a user that permissions stop")
def test_saving_into_a_read_only_directory_is_a_param_file_error(tmp_path):
    main, startup, _ = _build()
    exe = _fresh(startup)
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(rio.ParamFileError, match="Permission denied"):
            rg.save_params(exe.scope, tmp_path / "p.npz", main)
    finally:
        tmp_path.chmod(0o700)


_KILLED_SAVE = """
import os, signal, sys
import numpy as np
import retrograd as rg, retrograd.io as rio
main, startup = rg.Program(), rg.Program()
with rg.program_guard(main, startup):
    rg.create_parameter("w", [64, 64])
exe = rg.Executor(); exe.run(startup)
def die_midway(file, arrays):
    file.write(b"PK half written")
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)
rio._write_npz = die_midway
rg.save_params(exe.scope, sys.argv[1], main)
"""


def test_a_save_killed_midway_leaves_no_temporary_file_after_the_next_save(tmp_path):
    path = tmp_path / "ckpt.npz"
    result = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(path)], capture_output=True)
    assert result.returncode != 0
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".ckpt.npz.") and left[0].endswith(".tmp"), left
    stranger = tmp_path / ".other.npz.1.x.tmp"                   # another file's temporary: untouched
    stranger.write_bytes(b"")
    main, startup, _ = _build()
    rg.save_params(_fresh(startup).scope, path, main)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.npz.1.x.tmp", "ckpt.npz"]


def test_a_temporary_file_of_a_live_save_is_kept_until_it_is_old(tmp_path):
    path = tmp_path / "ckpt.npz"
    live = tmp_path / f".ckpt.npz.{os.getpid()}.abc.tmp"        # this process: still saving
    live.write_bytes(b"")
    main, startup, _ = _build()
    exe = _fresh(startup)
    rg.save_params(exe.scope, path, main)
    assert live.exists()
    old = time.time() - 2 * 3600                               # stale after an hour
    os.utime(live, (old, old))
    rg.save_params(exe.scope, path, main)
    assert not live.exists()


@pytest.mark.skipif(os.name != "posix", reason="file modes and the umask are POSIX's")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_save_params_files_get_the_umask_mode_not_0600(tmp_path, umask):
    """Issue 23: files written through mkstemp were 0600 whatever the umask; a save gives the
    mode a plain open() would: 0666 less the umask."""
    main, startup, _ = _build()
    exe = _fresh(startup)
    previous = os.umask(umask)
    try:
        path = rg.save_params(exe.scope, tmp_path / "m.npz", main)
        with open(tmp_path / "plain.txt", "w"):
            pass
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "plain.txt"]     # no temp left
