"""Family 5: cache entries are regular files or nothing.

A kernel's cache entry (`<key>.gobj`) replaced by a FIFO hung forever in the cache's read; by
a directory, it raised IsADirectoryError on every run. Now anything but a regular file of
ours under an entry's name is a bad entry, found without opening it (no blocking, no
symbolic link followed, no device opened): a miss with one CacheWarning saying what it is, the
kernel is compiled again, and the store replaces it (or, where a directory with files in it
holds the name, keeps the code in memory and leaves the directory as it was). `graphopt cache
list`, `info` and `clear` cope with every such entry. Every run is a child process with a
timeout: a hang fails the test instead of stopping the run.
"""
import contextlib
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

STEP = """
import warnings
warnings.simplefilter("always")  # the cache must warn once per kind of problem by itself
import numpy as np, graphopt as go
w = go.Parameter(np.arange(1000, dtype=np.float32), name="w")
v = go.Parameter(np.zeros(7, dtype=np.int32), name="v")
go.jit(lambda g: go.assign(w, w * 0.5 - g), backend="llvm")(np.ones(1000, np.float32))
go.jit(lambda g: go.assign(v, v + g), backend="llvm")(np.full(7, 3, np.int32))
print("w", float(w.numpy()[0]), float(w.numpy()[999]), "v", int(v.numpy().sum()))
"""
RESULT = "w -1.0 498.5 v 21"



def _unlinked(make):
    """A replacer: remove the entry, put `make(path)` in its place."""
    def replace(p: Path) -> None:
        p.unlink()
        make(p)
    return replace


def _elsewhere(p: Path, suffix: str) -> Path:
    return p.parent.parent / f"{p.name}.{suffix}"  # outside the cache directory


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _full_dir(p: Path) -> None:
    p.mkdir()
    (p / "notes.txt").write_text("someone's file")


def _link_to(target: Path):
    return lambda p: p.symlink_to(target)


def _link_to_fifo(p: Path) -> None:
    os.mkfifo(_elsewhere(p, "fifo"))
    p.symlink_to(_elsewhere(p, "fifo"))


def _link_to_dir(p: Path) -> None:
    _elsewhere(p, "dir").mkdir()
    p.symlink_to(_elsewhere(p, "dir"))


def _link_to_valid_entry(p: Path) -> None:  # the good entry, moved out, linked back
    p.rename(_elsewhere(p, "gobj"))
    p.symlink_to(_elsewhere(p, "gobj"))


def _socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    with contextlib.chdir(p.parent):  # a socket's path is limited to 108 bytes: bind by name
        s.bind(p.name)
    s.close()  # the socket file stays


def _char_device(p: Path) -> None:
    try:
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    except PermissionError:
        pytest.skip("mknod is not permitted here")


# name: (replace an entry, what the warning calls it, does a store replace it)
KINDS = {
    "fifo": (_unlinked(_fifo), "is a FIFO, not a regular file", True),
    "empty directory": (_unlinked(Path.mkdir), "is a directory, not a regular file", True),
    "directory with a file": (_unlinked(_full_dir), "is a directory, not a regular file", False),
    "symlink to a fifo": (_unlinked(_link_to_fifo), "is a symbolic link, not a regular", True),
    "symlink to a directory": (_unlinked(_link_to_dir), "is a symbolic link", True),
    "symlink to /dev/zero": (_unlinked(_link_to(Path("/dev/zero"))), "is a symbolic link", True),
    "symlink to a valid entry": (_link_to_valid_entry, "is a symbolic link", True),
    "dangling symlink": (_unlinked(_link_to(Path("/nonexistent/x.gobj"))), "is a symbolic link",
                         True),
    "unix socket": (_unlinked(_socket), "is a socket, not a regular file", True),
    "character device": (_unlinked(_char_device), "is a character device, not a regular file",
                         True),
}


def _cache_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CacheWarning" in line]


_first_run: list[Path] = []  # the cache directory of a first run of STEP, made once


@pytest.fixture
def entries(child, tmp_path_factory, tmp_path) -> list[Path]:
    """A copy of the cache of a first run of STEP as this test's cache: the paths of its
    entries (the kernel's and the runtime's)."""
    if not _first_run:
        base = tmp_path_factory.mktemp("first_run")
        run = type(child)(base).run(STEP, timeout=120)
        assert run.returncode == 0 and RESULT in run.stdout, run.stderr
        _first_run.append(base / "cache")
    shutil.copytree(_first_run[0], tmp_path / "cache")
    found = sorted((tmp_path / "cache").glob("*.gobj"))
    assert len(found) >= 3  # two kernels and the graph sink
    return found


# One child per kind: `graphopt cache info` and `list` with the special files in place, the
# step (a miss per entry, compiled again, stored over them), then `graphopt cache clear`.
SCRIPT = f"""
import sys
from graphopt.cli import main
for action in ("info", "list"):
    print(f"== {{action}}", flush=True)
    print("status", main(["cache", action]), flush=True)
print("== step", flush=True)
{STEP}
from graphopt import diskcache as cache
for p in sorted(cache.location().iterdir()):  # what the stores left under each entry's name
    try:
        print("valid" if cache._read(p, p.name[:64]) else "empty", p.name)
    except Exception as e:
        print("refused", p.name, e)
print("== clear", flush=True)
print("status", main(["cache", "clear"]))
"""


def _section(stdout: str, name: str) -> str:
    return stdout.split(f"== {name}")[1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_in_place_of_an_entry(child, entries, kind, tmp_path):
    replace, said, replaceable = KINDS[kind]
    kept, special = entries[0], entries[1:]  # one regular entry stays
    for path in special:
        replace(path)
    # A stale temporary file of a crashed writer, as a FIFO: swept away without being opened.
    stale = tmp_path / "cache" / f".{'0' * 64}.abcdef.tmp"
    os.mkfifo(stale)
    os.utime(stale, (1, 1))
    before = {p: p.read_bytes() for p in special} if kind == "symlink to a valid entry" else {}

    run = child.run(SCRIPT, timeout=90)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    out = run.stdout
    assert out.count("status 0") == 3, out  # info, list and clear
    # info and list: only regular files are entries; the special ones are not counted or shown
    assert "entries    1" in out and "directory  ok" in out
    listed = _section(out, "list").split("status 0")[0]
    assert listed.count("kernel:") + listed.count("runtime:") == 1, listed
    assert kept.name[:16] in listed and not any(p.name[:16] in listed for p in special)
    assert not stale.exists()
    # the step: one warning for the kind, compiled again, the right numbers
    assert RESULT in _section(out, "step")
    ignored = [w for w in _cache_warnings(run.stderr) if "ignoring" in w]
    assert len(ignored) == 1 and said in ignored[0], run.stderr
    if replaceable:  # each was replaced by a regular file holding a valid entry
        assert all(f"valid {p.name}" in out for p in special), out
    else:  # the code was kept in memory, with a warning: nothing of the directory is lost
        assert any("kept in memory" in w for w in _cache_warnings(run.stderr)), run.stderr
    # clear: every name of ours is gone (a link, never what it points to) ...
    if replaceable:
        assert f"removed {len(entries)} files" in out
        assert not any(os.path.lexists(p) for p in entries)
    else:  # ... but a directory with files in it, which stays, with its files, said so
        assert "removed 1 files" in out and "graphopt cache: left" in run.stderr
        assert all((p / "notes.txt").read_text() == "someone's file" for p in special)
    for p, data in before.items():
        assert _elsewhere(p, "gobj").read_bytes() == data


def test_entry_replaced_by_a_fifo_between_lstat_and_open_does_not_block(child, entries):
    """The race: lstat sees a regular file, then a FIFO takes its place before the open. The
    open does not block (O_NONBLOCK) and fstat refuses what was opened."""
    script = f"""
        import os, warnings
        warnings.simplefilter("always")
        from graphopt import diskcache as cache
        path = {str(entries[0])!r}
        real_lstat = os.lstat
        def lstat(p, *a, **k):
            st = real_lstat(p, *a, **k)
            if str(p) == path:  # the swap, right after the check
                os.unlink(path)
                os.mkfifo(path)
            return st
        os.lstat = lstat
        try:
            cache._read(cache.Path(path), os.path.basename(path)[:64])
        except cache._BadEntry as e:
            print("refused:", e.reason)
        """
    run = child.run(script, timeout=30)
    assert run.returncode == 0 and "refused: is a FIFO, not a regular file" in run.stdout, \
        run.stderr
