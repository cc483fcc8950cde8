"""Family 11: malformed checkpoint files and state dicts. Each is a CheckpointError that says
what is wrong and where (the file, the entry), and leaves every Parameter as it was: the
weights, the optimizer's state and hyper-parameters, the loss scale, the counters."""
import os
import pickle
import re
import struct
import zipfile

import numpy as np
import pytest

from checkpoint_support import good, run  # noqa: F401 (fixtures)
from checkpoint_support import Run, entries_of, metadata, npy, with_entries, write_zip
from graphopt.errors import CheckpointError


def _flip(path, out, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    out.write_bytes(bytes(data))
    return out


def _data_offset(path, name):
    """Where entry `name`'s data starts in the file (a stored entry: its .npy bytes)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    raw = path.read_bytes()
    n, m = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + n + m


def _truncated(keep):
    def make(good, out):
        data = good.read_bytes()
        out.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
        return out
    return make


def _bytes(data):
    def make(good, out):
        out.write_bytes(data)
        return out
    return make


def _meta(value):
    return lambda good, out: with_entries(good, out, meta=value)


def _with_meta_change(**changes):
    def make(good, out):
        m = metadata(good)
        m.update(changes)
        return with_entries(good, out, meta={k: v for k, v in m.items() if v is not None})
    return make


def _dtypes_change(fn):
    def make(good, out):
        m = metadata(good)
        fn(m["dtypes"])
        return with_entries(good, out, meta=m)
    return make


def _crc(name, delta=40):
    """One byte of entry `name` flipped, `delta` bytes past the start of its data (past the
    .npy header: only the CRC tells)."""
    def make(good, out):
        return _flip(good, out, _data_offset(good, name) + delta)
    return make


def _entry(name, data):
    return lambda good, out: with_entries(good, out, replace={name: data})


def _compressed_damaged(good, out):
    ok = write_zip(out.with_suffix(".z.npz"), entries_of(good), zipfile.ZIP_DEFLATED)
    return _flip(ok, out, _data_offset(ok, "fc.w.npy") + 5)


def _central_header(raw, name):
    """Where entry `name`'s header in the zip's central directory starts."""
    at = raw.find(b"PK\x01\x02")
    while at >= 0:
        n = struct.unpack_from("<H", raw, at + 28)[0]
        if raw[at + 46:at + 46 + n] == name.encode():
            return at
        at = raw.find(b"PK\x01\x02", at + 4)
    raise AssertionError(name)


def _header_field(local, central, value):
    """Entry fc.w with a 16-bit field of its local and central zip headers set to `value`
    (at byte `local` and `central` of each): its flags (bit 0: encrypted) or its compression
    method."""
    def make(good, out):
        raw = bytearray(good.read_bytes())
        with zipfile.ZipFile(good) as z:
            at = z.getinfo("fc.w.npy").header_offset
        struct.pack_into("<H", raw, at + local, value)
        struct.pack_into("<H", raw, _central_header(raw, "fc.w.npy") + central, value)
        out.write_bytes(bytes(raw))
        return out
    return make


def _duplicate(good, out):
    entries = entries_of(good)
    with pytest.warns(UserWarning):  # zipfile warns, and writes it
        return write_zip(out, entries + [e for e in entries if e[0] == "fc.b.npy"])


def _npy_header(text):
    """An entry whose .npy header dict is `text` (length fixed up)."""
    head = text.encode("latin1")
    head += b" " * ((64 - (10 + len(head) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


FILE_CASES = {
    "empty": (_bytes(b""), "empty"),
    "text": (_bytes(b"hello, not a checkpoint\n"), "not a readable .npz archive"),
    "garbage": (_bytes(np.random.default_rng(3).bytes(5000)), "not a readable .npz archive"),
    "zip-magic-then-garbage": (_bytes(b"PK\x03\x04" + bytes(200)), "not a readable .npz"),
    "npy": (_bytes(npy(np.zeros(3))), r"single \.npy array"),
    "pickle": (lambda good, out: (out.write_bytes(pickle.dumps({"fc.w": np.zeros(3)})), out)[1],
               "pickle.*never unpickles"),
    "pickle-protocol-0": (lambda good, out: (out.write_bytes(pickle.dumps([1], protocol=0)),
                                             out)[1], "not a readable .npz archive"),
    "truncated-1-byte": (_truncated(1), "not a readable .npz archive"),
    "truncated-10-bytes": (_truncated(10), "not a readable .npz archive"),
    "truncated-half": (lambda good, out: _truncated(len(good.read_bytes()) // 2)(good, out),
                       "not a readable .npz archive"),
    "truncated-last-byte": (_truncated(-1), "not a readable .npz archive"),
    "truncated-end-record": (_truncated(-22), "not a readable .npz archive"),
    "truncated-central-directory": (_truncated(-100), "not a readable .npz archive"),
    "crc-array-data": (_crc("fc.w.npy"), r"entry 'fc.w' is damaged.*CRC"),
    "crc-bf16-data": (_crc("fc.b.npy", 130), r"entry 'fc.b' is damaged.*CRC"),
    "crc-metadata": (_crc("__graphopt__.npy", 140), r"entry '__graphopt__'"),
    "crc-npy-header": (_crc("fc.w.npy", 12), r"entry 'fc.w'"),
    "npy-magic-damaged": (_crc("opt.step.npy", 0), r"entry 'opt.step'.*damaged"),
    "local-header-damaged": (lambda good, out: _flip(good, out, 1), "damaged|not a readable"),
    "compressed-and-damaged": (_compressed_damaged, r"entry 'fc.w' is damaged"),
    "encrypted-entry": (_header_field(6, 8, 0x1), r"entry 'fc.w' is damaged.*encrypted"),
    "unknown-compression": (_header_field(8, 10, 99), r"entry 'fc.w'.*damaged.*compression"),
    "plain-npz": (lambda good, out: (np.savez(out, x=np.zeros(2)), out)[1],
                  "not a graphopt checkpoint.*no '__graphopt__'"),
    "torch-style-zip": (lambda good, out: write_zip(out, [("archive/data.pkl", b"\x80\x02")]),
                        r"'archive/data.pkl', which is not a \.npy array"),
    "extra-non-npy-entry": (lambda good, out: with_entries(good, out, add=[("notes.txt", b"x")]),
                            r"'notes.txt', which is not a \.npy"),
    "directory-entry": (lambda good, out: with_entries(good, out, add=[("dir/", b"")]),
                        r"'dir/', which is not a \.npy"),
    "duplicate-entry": (_duplicate, r"'fc.b' is there twice"),
    "meta-not-json": (_meta("{not json"), r"metadata .*is not JSON"),
    "meta-empty-string": (_meta(""), r"metadata .*is not JSON"),
    "meta-list": (_meta([1, 2]), r"metadata .*is a JSON list"),
    "meta-string": (_meta('"f32"'), r"metadata .*is a JSON str"),
    "meta-number": (_meta("1"), r"metadata .*is a JSON int"),
    "meta-null": (_meta("null"), r"metadata .*is a JSON NoneType"),
    "meta-no-format": (_with_meta_change(format=None), r"has the keys \['dtypes'\]"),
    "meta-no-dtypes": (_with_meta_change(dtypes=None), r"has the keys \['format'\]"),
    "meta-extra-key": (_with_meta_change(extra=1), r"has the keys \['dtypes', 'extra'"),
    "meta-format-2": (_with_meta_change(format=2), "format 2, this graphopt reads format 1"),
    "meta-format-string": (_with_meta_change(format="1"), "format '1'"),
    "meta-format-true": (_with_meta_change(format=True), "format True"),
    "meta-format-float": (_with_meta_change(format=1.0), "format 1.0"),
    "meta-dtypes-list": (_with_meta_change(dtypes=["f32"]), "'dtypes' is a JSON list"),
    "meta-unknown-dtype": (_dtypes_change(lambda d: d.update({"fc.w": "complex64"})),
                           "gives 'fc.w' the dtype 'complex64'"),
    "meta-numpy-dtype-name": (_dtypes_change(lambda d: d.update({"fc.w": "float32"})),
                              "gives 'fc.w' the dtype 'float32'"),
    "meta-dtype-number": (_dtypes_change(lambda d: d.update({"opt.step": 3})),
                          "gives 'opt.step' the dtype 3"),
    "meta-dtype-null": (_dtypes_change(lambda d: d.update({"opt.step": None})),
                        "gives 'opt.step' the dtype None"),
    "meta-lists-a-missing-array": (lambda good, out: with_entries(good, out, drop=["fc.b"]),
                                   r"metadata lists \['fc.b'\], which the file does not hold"),
    "meta-misses-an-array": (_dtypes_change(lambda d: d.pop("fc.w")),
                             r"entries \['fc.w'\] have no dtype in the metadata"),
    "meta-not-a-string": (_entry("__graphopt__", npy(np.arange(3))),
                          r"metadata .*is i64\[3\], expected a string"),
    "meta-bytes": (_entry("__graphopt__", npy(np.array(b'{"format": 1}'))),
                   "expected a string"),
    "meta-pickled-object": (_entry("__graphopt__", npy(np.array({"format": 1}, dtype=object))),
                            "expected a string"),
    "entry-pickled-object": (_entry("fc.w", npy(np.array([None] * 12).reshape(3, 4))),
                             r"'fc.w' is stored as \|O"),
    "entry-not-npy": (_entry("fc.w", b"not an array at all"), r"entry 'fc.w' is damaged"),
    "entry-empty": (_entry("fc.w", b""), r"entry 'fc.w' is damaged"),
    "entry-header-garbage": (_entry("fc.w", _npy_header("{'descr': <f4")),
                             r"entry 'fc.w' is damaged"),
    "entry-header-not-a-dict": (_entry("fc.w", _npy_header("[1, 2, 3]")),
                                r"entry 'fc.w' is damaged"),
    "entry-header-bad-shape": (_entry("fc.w", _npy_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 4), }")),
        r"'fc.w' is f32\[-3,4\], the parameter is f32\[3,4\]"),
    "entry-huge-shape": (_entry("fc.w", _npy_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (10**12, 4), }")),
        r"entry 'fc.w' is damaged"),
    "entry-huge-shape-that-parses": (_entry("fc.w", _npy_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 4), }")),
        r"'fc.w' is f32\[1000000000000,4\], the parameter is f32\[3,4\]"),
    "entry-truncated-data": (_entry("fc.w", npy(np.zeros((3, 4), np.float32))[:-8]),
                             r"entry 'fc.w' is truncated \(40 of 48 bytes"),
    "entry-header-only": (_entry("fc.w", npy(np.zeros((3, 4), np.float32))[:128]),
                          r"entry 'fc.w' is truncated \(0 of 48"),
    "entry-extra-data": (_entry("fc.w", npy(np.zeros((3, 4), np.float32)) + b"\0" * 4),
                         r"entry 'fc.w' holds more data than its header's f32\[3,4\]"),
    "entry-npy-version-3": (_entry("fc.w", npy(np.zeros((3, 4), np.float32), version=(3, 0))),
                            r"entry 'fc.w' is in \.npy format version \(3, 0\)"),
    "entry-npy-version-9": (_entry("fc.w", b"\x93NUMPY\x09\x00" + bytes(100)),
                            r"entry 'fc.w' is in \.npy format version \(9, 0\)"),
    "another-runs-names": (lambda good, out: write_zip(out, [
        ("w.npy", npy(np.zeros(3, np.float32))),
        ("__graphopt__.npy", npy(np.array('{"format": 1, "dtypes": {"w": "f32"}}')))]),
        r"missing \['fc.w', 'fc.b'.*unexpected \['w'\]"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_a_malformed_file_is_refused_and_changes_nothing(case, good, run, tmp_path):
    make, message = FILE_CASES[case]
    bad = make(good, tmp_path / f"{case}.npz")
    before = run.snapshot()
    with pytest.raises(CheckpointError, match=message) as e:
        run.load(bad)
    assert str(bad) in str(e.value)
    run.assert_unchanged(before)
    run.load(good)  # the run itself is fine, and a good file loads into it


def test_the_good_file_and_its_compressed_copy_load(good, run, tmp_path):
    saved = Run(seed=0)
    saved.train(3)
    zipped = write_zip(tmp_path / "z.npz", entries_of(good), zipfile.ZIP_DEFLATED)
    for path in (good, zipped):
        Run(seed=9).load(path)
        run.load(path)
        assert run.snapshot() == saved.snapshot()


def _fifo(tmp_path):
    path = tmp_path / "fifo.npz"
    os.mkfifo(path)
    return path


def _dangling(tmp_path):
    path = tmp_path / "link.npz"
    os.symlink(tmp_path / "nowhere", path)
    return path


def _link_to_dir(tmp_path):
    path = tmp_path / "dirlink.npz"
    os.symlink(tmp_path, path)
    return path


def _unreadable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "locked.npz"
    path.write_bytes(b"PK")
    path.chmod(0)
    return path


PATH_CASES = {
    "missing": (lambda t: t / "nope.npz", "no such file"),
    "missing-directory": (lambda t: t / "no" / "dir" / "x.npz", "no such file"),
    "directory": (lambda t: t, "is a directory, not a checkpoint file"),
    "fifo": (_fifo, "is a FIFO, not a checkpoint file"),
    "dangling-symlink": (_dangling, "no such file"),
    "symlink-to-directory": (_link_to_dir, "is a directory"),
    "device": (lambda t: "/dev/null" if os.path.exists("/dev/null") else pytest.skip("this system has no /dev/null"),
               "not a regular file"),
    "unreadable": (_unreadable, "cannot be opened.*Permission denied"),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_a_path_that_is_not_a_checkpoint_file(case, tmp_path, child):
    """In a child process: a FIFO or a device must not block the load."""
    make, message = PATH_CASES[case]
    path = make(tmp_path)
    out = child.run(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from checkpoint_support import Run
        from graphopt.errors import CheckpointError
        run = Run(seed=5)
        before = run.snapshot()
        try:
            run.load({str(path)!r})
        except CheckpointError as e:
            print("ERROR", e)
        run.assert_unchanged(before)
        print("UNCHANGED")
        """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "UNCHANGED" in out.stdout
    assert re.search(message, out.stdout) and str(path) in out.stdout, out.stdout


@pytest.mark.parametrize("path", [None, 5, 2.5, b"", "", ["x.npz"]], ids=repr)
def test_a_path_of_the_wrong_kind(path, run):
    before = run.snapshot()
    with pytest.raises(CheckpointError, match="load: the path"):
        run.load(path)
    run.assert_unchanged(before)


def test_a_bytes_path_is_a_path(good, run):
    run.load(os.fsencode(good))


# -- state dicts ----------------------------------------------------------------------------------
def _sd(run):
    return run.opt.state_dict()


def _state(**changes):
    def make(sd):
        state = dict(sd["state"])
        for k, v in changes.items():
            if v is None:
                state.pop(k.replace("__", "."))
            else:
                state[k.replace("__", ".")] = v
        return {**sd, "state": state}
    return make


STATE_DICT_CASES = {
    "int": (lambda sd: 5, r"not a state_dict .*got int"),
    "none": (lambda sd: None, r"not a state_dict .*got NoneType"),
    "string": (lambda sd: "state", r"not a state_dict .*got str"),
    "list": (lambda sd: [sd], r"not a state_dict .*got list"),
    "empty-dict": (lambda sd: {}, r"not a state_dict .*got \[\]"),
    "no-state": (lambda sd: {"param_groups": sd["param_groups"]}, r"got \['param_groups'\]"),
    "no-param-groups": (lambda sd: {"state": sd["state"]}, r"got \['state'\]"),
    "extra-key": (lambda sd: {**sd, "extra": 1}, r"got \['extra', 'param_groups', 'state'\]"),
    "param-groups-5": (lambda sd: {**sd, "param_groups": 5},
                       "'param_groups' must be a list of dicts, one per group, got int 5"),
    "param-groups-string": (lambda sd: {**sd, "param_groups": "groups"},
                            "'param_groups' must be a list of dicts"),
    "param-groups-dict": (lambda sd: {**sd, "param_groups": sd["param_groups"][0]},
                          "'param_groups' must be a list of dicts"),
    "param-groups-of-ints": (lambda sd: {**sd, "param_groups": [5]},
                             "'param_groups' must be a list of dicts"),
    "param-groups-empty": (lambda sd: {**sd, "param_groups": []},
                           "saved groups differ from this optimizer.s"),
    "param-groups-two": (lambda sd: {**sd, "param_groups": sd["param_groups"] * 2},
                         "saved groups differ from this optimizer.s"),
    "param-groups-empty-dict": (lambda sd: {**sd, "param_groups": [{}]},
                                "saved groups differ from this optimizer.s"),
    "param-groups-other-params": (lambda sd: {**sd, "param_groups": [
        {**sd["param_groups"][0], "params": ["x"]}]}, "saved groups differ from this optimizer.s"),
    "param-groups-with-an-array": (lambda sd: {**sd, "param_groups": [
        {**sd["param_groups"][0], "amsgrad": np.array([True, False])}]},
        "saved groups differ from this optimizer.s"),
    "param-groups-other-flag": (lambda sd: {**sd, "param_groups": [
        {**sd["param_groups"][0], "amsgrad": False}]}, "saved groups differ from this optimizer.s"),
    "state-5": (lambda sd: {**sd, "state": 5}, "'state' must be a dict of arrays"),
    "state-list": (lambda sd: {**sd, "state": list(sd["state"].values())},
                   "'state' must be a dict of arrays"),
    "state-int-key": (lambda sd: {**sd, "state": {**sd["state"], 3: np.zeros(1)}},
                      "entry 3: names are strings"),
    "state-ragged": (_state(fc__w__exp_avg=[[1.0, 2.0], [3.0]]), r"entry 'fc.w.exp_avg' is "
                     r"not an array"),
    "state-object": (_state(fc__w__exp_avg=object()), r"'fc.w.exp_avg' is object\[\]"),
    "state-string": (_state(opt__group0__lr="0.1"), r"'opt.group0.lr' is <U3\[\]"),
    "state-none": (_state(opt__group0__lr=np.array(None)), r"'opt.group0.lr' is object\[\]"),
    "state-missing-entry": (_state(fc__b__exp_avg=None), r"missing \['fc.b.exp_avg'\]"),
    "state-extra-entry": (_state(fc__c__exp_avg=np.zeros(4, np.float32)),
                          r"unexpected \['fc.c.exp_avg'\]"),
    "state-wrong-shape": (_state(fc__w__exp_avg=np.zeros((4, 3), np.float32)),
                          r"'fc.w.exp_avg' is f32\[4,3\], the parameter is f32\[3,4\]"),
    "state-wrong-dtype": (_state(fc__w__exp_avg=np.zeros((3, 4), np.float64)),
                          r"'fc.w.exp_avg' is f64\[3,4\], the parameter is f32\[3,4\]"),
    "state-bf16-as-uint16": (_state(fc__b__master=np.zeros(4, np.uint16)),
                             r"'fc.b.master' is uint16\[4\], the parameter is f32\[4\]"),
    "state-int-step": (_state(opt__step=3.0), r"'opt.step' is f64\[\], the parameter is i64"),
    "state-complex": (_state(opt__group0__lr=np.complex128(1)), r"'opt.group0.lr' is "
                      r"complex128\[\]"),
}


@pytest.mark.parametrize("case", list(STATE_DICT_CASES))
def test_a_malformed_state_dict_is_refused_and_changes_nothing(case, run):
    make, message = STATE_DICT_CASES[case]
    sd = make(_sd(Run(seed=0)))
    before = run.snapshot()
    with pytest.raises(CheckpointError, match=message):
        run.opt.load_state_dict(sd)
    run.assert_unchanged(before)
    run.opt.load_state_dict(_sd(Run(seed=0)))


def test_a_state_dict_round_trips_the_bf16_master_bit_for_bit(run):
    other = Run(seed=0)
    other.train(4)
    run.opt.load_state_dict(other.opt.state_dict())
    for p in run.opt.parameters():
        assert p.numpy().tobytes() == other.opt.state_dict()["state"][p.name].tobytes()
