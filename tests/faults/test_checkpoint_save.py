"""Family 13: `save` inside a traced step is refused (it would run once, at trace time, and
leave a stale file), in eager mode it works; a save that fails (a directory, a missing or
read-only directory, a full disk, an error or Ctrl-C mid-write) is a CheckpointError (or the
interrupt itself), leaves no temporary file, and leaves the old checkpoint as it was."""
import errno
import io
import os
import subprocess
import threading
import zipfile

import numpy as np
import pytest

import graphopt as go
from checkpoint_support import Run
from graphopt import checkpoint, optim
from graphopt.errors import CheckpointError, GraphoptError


def _files(directory):
    return sorted(os.listdir(directory))


# -- inside a trace -------------------------------------------------------------------------------
def _in_step(run, path):
    def step(gs):
        run.scaler.step(run.acc, gs)
        go.save(path, run.params, *run.objects)
    return step


def _in_a_helper(run, path):
    def checkpoint_now():
        run.save(path)

    def step(gs):
        run.scaler.step(run.acc, gs)
        checkpoint_now()
    return step


def _in_value_and_grad(run, path):
    def step(gs):
        def loss():
            run.save(path)
            return go.ops.sum(run.params[0] * run.params[0])
        return go.value_and_grad(loss, wrt=[run.params[0]])()[0]
    return step


def _load_in_step(run, path):
    run.save(path)
    os.rename(path, f"{path}.saved")

    def step(gs):
        go.load(f"{path}.saved", run.params, *run.objects)
    return step


TRACED = {"save-in-step": (_in_step, "save"), "save-in-a-helper": (_in_a_helper, "save"),
          "save-in-value-and-grad": (_in_value_and_grad, "save"),
          "load-in-step": (_load_in_step, "load")}


@pytest.mark.parametrize("backend", ["llvm", "interpreter"])
@pytest.mark.parametrize("case", list(TRACED))
def test_save_or_load_inside_a_traced_step_is_refused(case, backend, tmp_path):
    make, what = TRACED[case]
    run = Run()
    path = tmp_path / "run.npz"
    step = go.jit(make(run, path), backend=backend)
    gs = [np.ones(p.shape, p.dtype.np_dtype) for p in run.params]
    before = run.snapshot()
    for _ in range(2):  # every call, not only the first
        with pytest.raises(GraphoptError, match=rf"{what}\(.*run.npz.*\) inside a traced step "
                                                rf"\(@jit\): it would run once"):
            step(gs)
    assert not path.exists() and _files(tmp_path) == (["run.npz.saved"] if what == "load" else [])
    run.assert_unchanged(before)


def test_save_inside_trace_is_refused(tmp_path):
    run = Run()
    with pytest.raises(CheckpointError, match="inside a traced step"):
        go.trace(lambda: run.save(tmp_path / "x.npz"))
    assert _files(tmp_path) == []


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_a_save_between_steps_holds_the_latest_values(mode, tmp_path):
    """Eager calls save (a plain function that steps and saves); jitted steps save between
    calls. Three steps later, the file holds the values of then, not of the first step."""
    run = Run()
    gs = [np.ones(p.shape, p.dtype.np_dtype) for p in run.params]
    step = (lambda: run.scaler.step(run.acc, gs)) if mode == "eager" else \
        (lambda: run.step(gs))

    def step_and_save(path):
        step()
        run.save(path)
    for i in range(4):
        step_and_save(tmp_path / "run.npz")
    latest = run.snapshot()
    fresh = Run(seed=9)
    fresh.load(tmp_path / "run.npz")
    assert fresh.snapshot() == latest
    assert _files(tmp_path) == ["run.npz"]


# -- failed saves ---------------------------------------------------------------------------------
@pytest.fixture
def old(tmp_path):
    """A directory holding one good checkpoint, the old file every failed save must keep."""
    run = Run()
    run.train(2)
    path = tmp_path / "ckpt" / "run.npz"
    path.parent.mkdir()
    run.save(path)
    run.train(1)  # the run moves on: a new save would hold other values
    return run, path, path.read_bytes()


def _assert_old_intact(run, path, data):
    assert _files(path.parent) == [path.name], "a temporary file was left behind"
    assert path.read_bytes() == data
    Run(seed=3).load(path)  # still a good checkpoint


class _FullAfter(io.FileIO):
    """A file whose writes fail with ENOSPC once `limit` bytes are written."""

    limit = 0

    def write(self, b):
        if self.tell() + len(b) > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def _full_disk_at(where):
    """The disk fills up `where(size, directory)` bytes into the file (size: the whole
    checkpoint's; directory: where its zip directory starts)."""
    def patch(monkeypatch, size, directory):
        cls = type("Full", (_FullAfter,), {"limit": where(size, directory)})
        monkeypatch.setattr(checkpoint, "open", lambda path, mode: cls(path, "w"), raising=False)
    return patch


def _raises(name, err):
    def patch(monkeypatch, size, directory):
        def fail(*args, **kwargs):
            raise OSError(err, os.strerror(err))
        monkeypatch.setattr(os, name, fail)
    return patch


WRITE_FAILURES = {
    "full-at-first-write": (_full_disk_at(lambda n, d: 0), "No space left on device"),
    "full-mid-write": (_full_disk_at(lambda n, d: d // 2), "No space left on device"),
    "full-in-the-zip-directory": (_full_disk_at(lambda n, d: d + 100),
                                  "No space left on device"),
    "full-at-the-last-byte": (_full_disk_at(lambda n, d: n - 1), "No space left on device"),
    "fsync-fails": (_raises("fsync", errno.ENOSPC), "No space left on device"),
    "fsync-io-error": (_raises("fsync", errno.EIO), "Input/output error"),
    "rename-fails": (_raises("replace", errno.EXDEV), "Invalid cross-device link"),
    "rename-refused": (_raises("replace", errno.EACCES), "Permission denied"),
}


@pytest.mark.parametrize("case", list(WRITE_FAILURES))
def test_a_failed_write_is_a_checkpoint_error_and_keeps_the_old_file(case, old, monkeypatch):
    run, path, data = old
    patch, message = WRITE_FAILURES[case]
    with zipfile.ZipFile(path) as z:
        directory = z.start_dir
    patch(monkeypatch, len(data), directory)
    with pytest.raises(CheckpointError, match=rf"run.npz: the checkpoint could not be written "
                                              rf"\({message}\); no file was changed"):
        run.save(path)
    monkeypatch.undo()
    _assert_old_intact(run, path, data)
    run.save(path)  # and the next save works
    assert _files(path.parent) == ["run.npz"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, MemoryError])
def test_an_interrupt_mid_write_is_raised_and_leaves_no_temporary_file(interrupt, old,
                                                                        monkeypatch):
    run, path, data = old

    def stop(*args, **kwargs):
        raise interrupt()
    monkeypatch.setattr(os, "fsync", stop)
    with pytest.raises(interrupt):
        run.save(path)
    monkeypatch.undo()
    _assert_old_intact(run, path, data)


def test_a_full_tmpfs(old, tmp_path):
    """A real full disk: a tmpfs that holds one checkpoint and not a second beside it (needs
    root to mount one; the monkeypatched cases above run for everyone)."""
    run, _, _ = old
    mnt = tmp_path / "small"
    mnt.mkdir()
    big = [go.Parameter(np.ones(12_000, np.float32), name="big")]  # 48 KB, the tmpfs 64 KB
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount)")
    try:
        path = mnt / "run.npz"
        go.save(path, big)
        data = path.read_bytes()
        big[0]._value[:] = 2  # noqa: SLF001 (new values for the save that fails)
        with pytest.raises(CheckpointError, match="No space left on device"):
            go.save(path, big)
        assert _files(mnt) == ["run.npz"] and path.read_bytes() == data
        fresh = [go.Parameter(np.zeros(12_000, np.float32), name="big")]
        go.load(path, fresh)
        assert (fresh[0].numpy() == 1).all()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    w = [go.Parameter(np.ones(3, np.float32), name="w")]
    if os.geteuid() == 0:  # root writes anywhere a mode allows nothing: mount it read-only
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs")
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match=r"could not be written \((Read-only file "
                                                  r"system|Permission denied)\)"):
            go.save(ro / "run.npz", w)
        assert _files(ro) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=True)
        else:
            ro.chmod(0o755)


BAD_TARGETS = {
    "a-directory": (lambda t: t, "is a directory; save writes a file"),
    "a-missing-directory": (lambda t: t / "no" / "such" / "run.npz",
                            r"could not be written \(No such file or directory\)"),
    "under-a-file": (lambda t: (t / "file").write_text("x") and t / "file" / "run.npz",
                     r"could not be written \(Not a directory\)"),
    "a-symlink-to-a-directory": (lambda t: (os.symlink(t, t / "link"), t / "link")[1],
                                 "is a directory"),
}


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_a_target_that_cannot_be_a_checkpoint_file(case, tmp_path):
    make, message = BAD_TARGETS[case]
    target = make(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        Run().save(target)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("path", [None, 5, 2.5, "", b"", ["run.npz"]], ids=repr)
def test_a_path_of_the_wrong_kind(path):
    with pytest.raises(CheckpointError, match="save: the path"):
        Run().save(path)


def test_a_bytes_path_is_a_path(tmp_path):
    Run().save(os.fsencode(tmp_path / "b.npz"))
    Run(seed=2).load(tmp_path / "b.npz")


BAD_ARGUMENTS = {
    "not-parameters": (lambda: ([np.zeros(3)],), r"array\(.*is not a graphopt.Parameter"),
    "not-iterable": (lambda: (5,), "params must be a Parameter, a list of them or a dict"),
    "an-object-without-parameters": (lambda: ([], "opt"), r"cannot checkpoint a str"),
    "two-parameters-one-name": (lambda: ([go.Parameter(np.zeros(1), name="w"),
                                          go.Parameter(np.ones(1), name="w")],),
                                "two different Parameters are named 'w'"),
    "the-metadata-name": (lambda: ([go.Parameter(np.zeros(1), name="__graphopt__")],),
                          "a Parameter is named '__graphopt__'"),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments(case, tmp_path):
    make, message = BAD_ARGUMENTS[case]
    with pytest.raises(CheckpointError, match=message):
        go.save(tmp_path / "run.npz", *make())
    assert _files(tmp_path) == []


def test_threads_saving_to_one_path(tmp_path):
    """Each save is whole: 4 threads × 10 saves of one run to one file leave one good file."""
    run = Run()
    run.train(2)
    path = tmp_path / "run.npz"
    errors = []

    def saver():
        try:
            for _ in range(10):
                run.save(path)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=saver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _files(tmp_path) == ["run.npz"]
    fresh = Run(seed=4)
    fresh.load(path)
    assert fresh.snapshot() == run.snapshot()


def test_optimizer_state_dict_inside_a_trace_is_refused():
    w = go.Parameter(np.ones(3, np.float32), name="w")
    opt = optim.SGD([w], lr=0.1)
    sd = opt.state_dict()
    with pytest.raises(CheckpointError, match="inside a traced step"):
        go.jit(lambda: opt.load_state_dict(sd), backend="interpreter")()
