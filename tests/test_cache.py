"""The on-disk compilation cache (graphopt/diskcache.py) and `graphopt cache`.

Most tests run the cache in fresh Python processes (`sys.executable -c`), as a user's second
run would, with GRAPHOPT_CACHE_DIR inside tmp_path; a few pure checks run in this process.
"""
from __future__ import annotations

import ast
import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from graphopt import diskcache as cache
from graphopt import envvars
from graphopt.errors import SwitchError

# Helpers shared by this process and the scripts run in fresh ones.
HELPERS = '''
def parts(**changed):
    p = {"kernel": "kernel @adam(f32[16]) {\\n  %0 = multiply %a, %b\\n}",
         "signature": "(f32[16], f32[16]) -> f32[16]", "triple": "x86_64-unknown-linux-gnu",
         "cpu": "znver3", "features": "+avx2,+fma", "llvm": "15.0.7", "llvmlite": "0.50.0",
         "codegen": "1", "flags": "O3 contract"}
    p.update(changed)
    return p

def key(**changed):
    return cache.make_key(parts(**changed))

PAYLOAD = bytes(range(256)) * 64
'''
exec(HELPERS)  # defines parts, key and PAYLOAD here too

PRELUDE = '''
import os, sys, warnings
warnings.simplefilter("always")  # the cache itself must warn only once per kind of problem
from graphopt import envvars
from graphopt import diskcache as cache
''' + HELPERS


def entry_path(d: Path, **changed) -> Path:
    return d / (cache.make_key(parts(**changed)) + ".gobj")


def run(code: str, cache_dir: Path, *, env: dict | None = None, patch: str = "",
        preexec_fn=None) -> subprocess.CompletedProcess:
    """Run PRELUDE + patch + code in a fresh interpreter with the cache in `cache_dir`; the
    patch (unindented) can stand in for another user."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHOPT_")}
    full_env.update(GRAPHOPT_CACHE_DIR=str(cache_dir), **(env or {}))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + patch + textwrap.dedent(code)],
                          env=full_env, capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec_fn)
    assert proc.returncode == 0, proc.stderr
    return proc


def warnings_in(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if "CacheWarning:" in line]


@pytest.fixture
def cdir(tmp_path, monkeypatch):
    """A fresh cache directory, also used by this process's cache module."""
    d = tmp_path / "cache"
    for name in envvars.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(d))
    cache.reset()
    yield d
    cache.reset()
    if d.exists():
        os.chmod(d, 0o700)


# --------------------------------------------------------------------------- keys

def test_key_changes_when_any_part_changes():
    base = parts()
    key = cache.make_key(base)
    assert len(key) == 64 and int(key, 16) >= 0
    assert cache.make_key(dict(reversed(list(base.items())))) == key  # order of the dict: no
    seen = {key}
    for name in base:
        changed = dict(base, **{name: base[name] + " "})
        seen.add(cache.make_key(changed))
    seen.add(cache.make_key(dict(base, extra="")))               # a new, empty part
    seen.add(cache.make_key({k: v for k, v in base.items() if k != "flags"}))
    assert len(seen) == len(base) + 3
    # Length prefixes: moving characters between name and value, or between parts, changes it.
    assert cache.make_key({"ab": "c"}) != cache.make_key({"a": "bc"})
    assert cache.make_key({"a": "b", "c": "d"}) != cache.make_key({"a": "b\0\0c", "": "d"})
    with pytest.raises(TypeError):
        cache.make_key({"flags": 3})


def test_load_and_store_check_the_key(cdir):
    with pytest.raises(ValueError, match="64 lowercase hex"):
        cache.load("../../etc/passwd", parts())
    with pytest.raises(ValueError, match="does not match"):
        cache.store(cache.make_key(parts(llvm="16")), parts(), b"x")


# --------------------------------------------------------------------------- round trip

def test_round_trip_between_processes(cdir):
    run("assert cache.load(key(), parts()) is None\n"
        "cache.store(key(), parts(), PAYLOAD)", cdir)
    assert stat.S_IMODE(cdir.stat().st_mode) == 0o700
    entry = entry_path(cdir)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    before = entry.stat().st_mtime
    os.utime(entry, (before - 100, before - 100))
    proc = run("assert cache.load(key(), parts()) == PAYLOAD\n"
               "assert cache.load(key(llvm='16.0.0'), parts(llvm='16.0.0')) is None\n"
               "print(cache.enabled(), cache.cache_dir())", cdir)
    assert proc.stdout.split() == ["True", str(cdir)] and not warnings_in(proc)
    assert entry.stat().st_mtime > before - 50  # a hit marks the entry as recently used
    assert sorted(p.name for p in cdir.iterdir()) == [entry.name]


# --------------------------------------------------------------------------- bad entries

def _corrupt_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-10] ^= 0xFF
    p.write_bytes(bytes(data))


def _wrong_version(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[8:12] = (cache.FORMAT_VERSION + 1).to_bytes(4, "little")
    p.write_bytes(bytes(data))


def _foreign(p: Path) -> None:  # a valid entry of another key, under this key's name
    other = entry_path(p.parent, flags="O0")
    p.write_bytes(other.read_bytes())


def _symlink(p: Path) -> None:
    target = p.parent / "elsewhere"
    p.rename(target)
    p.symlink_to(target)


BAD_ENTRIES = {
    "corrupt payload byte": (_corrupt_byte, "payload sha256 does not match"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-1000]), "is truncated"),
    "truncated header": (lambda p: p.write_bytes(p.read_bytes()[:50]), "is truncated"),
    "empty": (lambda p: p.write_bytes(b""), "is truncated"),
    "wrong version": (_wrong_version, "format version"),
    "wrong magic": (lambda p: p.write_bytes(b"\x7fELF" + p.read_bytes()[4:]), "wrong magic"),
    "foreign": (_foreign, "another key"),
    "extra bytes": (lambda p: p.write_bytes(p.read_bytes() + b"\0"), "after the payload"),
    "symlink": (_symlink, "is a symbolic link, not a regular file"),
}


@pytest.mark.parametrize("damage", BAD_ENTRIES)
def test_bad_entry_is_a_miss_with_one_warning_and_a_store_repairs_it(cdir, damage):
    cache.store(cache.make_key(parts()), parts(), PAYLOAD)
    cache.store(cache.make_key(parts(flags="O0")), parts(flags="O0"), b"other")
    mutate, message = BAD_ENTRIES[damage]
    mutate(entry_path(cdir))
    proc = run("""
        assert cache.load(key(), parts()) is None
        assert cache.load(key(), parts()) is None      # the same problem again: no new warning
        assert cache.load(key(flags="O0"), parts(flags="O0")) == b"other"  # others still load
        cache.store(key(), parts(), PAYLOAD)           # the recompiled code replaces the entry
        assert cache.load(key(), parts()) == PAYLOAD
        """, cdir)
    found = warnings_in(proc)
    assert len(found) == 1 and message in found[0], proc.stderr
    assert entry_path(cdir).is_file() and not entry_path(cdir).is_symlink()
    assert cache.load(key(), parts()) == PAYLOAD  # repaired for other processes too


def test_entry_owned_by_another_user_is_refused(cdir):
    cache.store(cache.make_key(parts()), parts(), PAYLOAD)
    if os.geteuid() == 0:  # root can give the file away for real
        os.chown(entry_path(cdir), 12345, -1)
        patch = ""
    else:  # otherwise make os.fstat report another owner
        patch = """
            real_fstat = os.fstat
            def fstat(fd):
                st = real_fstat(fd)
                return os.stat_result((st[0], st[1], st[2], st[3], st.st_uid + 1) + tuple(st[5:10]))
            os.fstat = fstat
            """
    proc = run("assert cache.load(key(), parts()) is None", cdir, patch=textwrap.dedent(patch))
    found = warnings_in(proc)
    assert len(found) == 1 and "is owned by uid" in found[0] and "not by you" in found[0]


# --------------------------------------------------------------------------- concurrency

def test_concurrent_stores_of_one_key_all_succeed(cdir):
    """Four processes store the same (1 MiB) entry 10 times each, starting together, while
    loading it; every load sees a whole entry or none, every process exits cleanly."""
    start = time.time() + 1.5  # after every interpreter has imported graphopt
    code = f"""
        import time
        big = PAYLOAD * 64
        time.sleep(max(0.0, {start} - time.time()))
        for _ in range(10):
            cache.store(key(), parts(), big)
            assert cache.load(key(), parts()) == big
        print("ok")
        """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHOPT_")}
    full_env["GRAPHOPT_CACHE_DIR"] = str(cdir)
    procs = [subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                              env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
    for out, err, rc in results:
        assert rc == 0 and out.strip() == "ok" and "Warning" not in err, err
    run("assert cache.load(key(), parts()) == PAYLOAD * 64", cdir)
    assert [p.name for p in cdir.iterdir()] == [entry_path(cdir).name]  # no temp files left


# --------------------------------------------------------------------------- directories

def _without_dac_override() -> None:
    """Run as root without CAP_DAC_OVERRIDE, so file modes bind root as they bind a user."""
    if ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_read_only_directory_keeps_code_in_memory(cdir):
    cache.store(cache.make_key(parts()), parts(), PAYLOAD)
    os.chmod(cdir, 0o500)
    proc = run("""
        assert cache.load(key(), parts()) == PAYLOAD        # old entries still load
        new = parts(cpu="skylake")
        assert cache.load(key(cpu="skylake"), new) is None
        cache.store(key(cpu="skylake"), new, b"obj")         # warns, does not raise
        cache.store(key(cpu="icelake"), parts(cpu="icelake"), b"obj2")
        assert cache.load(key(cpu="skylake"), new) == b"obj"   # from memory
        """, cdir, preexec_fn=_without_dac_override if os.geteuid() == 0 else None)
    found = warnings_in(proc)
    assert len(found) == 1 and "cannot write" in found[0] and "memory only" in found[0]
    assert [p.name for p in cdir.iterdir()] == [entry_path(cdir).name]


def test_directory_that_cannot_be_made_keeps_code_in_memory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    proc = run("""
        cache.store(key(), parts(), PAYLOAD)
        cache.store(key(cpu="x"), parts(cpu="x"), PAYLOAD)
        assert cache.load(key(), parts()) == PAYLOAD
        """, blocker / "cache")
    assert len(warnings_in(proc)) == 1 and "memory only" in proc.stderr


@pytest.mark.parametrize("how", ["mode 0777", "mode 0720", "owner via geteuid",
                                 "owner via chown"])
def test_unsafe_directory_is_refused(cdir, how):
    cache.store(cache.make_key(parts()), parts(), PAYLOAD)
    patch = ""
    if how.startswith("mode"):
        os.chmod(cdir, int(how.split()[1], 8))
        message = "writable by group or others"
    elif how == "owner via geteuid":  # what another user's directory looks like to us
        patch = "os.geteuid = lambda: 4242\n"
        message = "is owned by uid"
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can chown a directory to another user")
        os.chown(cdir, 12345, -1)
        message = "is owned by uid 12345"
    proc = run("""
        assert cache.load(key(), parts()) is None           # refused, although it is valid
        cache.store(key(cpu="x"), parts(cpu="x"), PAYLOAD)  # not written there either
        assert cache.load(key(cpu="x"), parts(cpu="x")) == PAYLOAD  # in memory
        assert cache.load(key(), parts()) is None
        """, cdir, patch=patch)
    found = warnings_in(proc)
    assert len(found) == 1 and message in found[0] and "refusing" in found[0], proc.stderr
    assert [p.name for p in cdir.iterdir()] == [entry_path(cdir).name]


# --------------------------------------------------------------------------- eviction

def test_eviction_removes_least_recently_used(cdir, monkeypatch):
    names = ["a", "b", "c", "d"]
    for i, n in enumerate(names[:3]):
        cache.store(cache.make_key(parts(cpu=n)), parts(cpu=n), PAYLOAD)
        os.utime(entry_path(cdir, cpu=n), (1000 + i, 1000 + i))  # a oldest, c newest
    size = entry_path(cdir, cpu="a").stat().st_size
    assert cache.load(cache.make_key(parts(cpu="a")), parts(cpu="a")) == PAYLOAD  # a: newest
    stale, fresh = cdir / f".{'0' * 64}.abc123.tmp", cdir / f".{'1' * 64}.def456.tmp"
    stale.write_bytes(b"left by a crashed writer")
    fresh.write_bytes(b"a writer at work")
    os.utime(stale, (time.time() - 3600,) * 2)
    mine = cdir / "notes.txt"
    mine.write_text("not ours: kept")
    monkeypatch.setenv("GRAPHOPT_CACHE_MAX_BYTES", str(3 * size))  # for info() below
    proc = run("cache.store(key(cpu='d'), parts(cpu='d'), PAYLOAD)", cdir,
               env={"GRAPHOPT_CACHE_MAX_BYTES": str(3 * size)})
    assert not warnings_in(proc)
    left = {p.name for p in cdir.iterdir()}
    assert left == {entry_path(cdir, cpu=n).name for n in "acd"} | {fresh.name, mine.name}
    assert cache.info()["bytes"] == 3 * size <= cache.info()["max_bytes"]
    # An entry larger than the bound is not written at all (it is kept in memory).
    monkeypatch.setenv("GRAPHOPT_CACHE_MAX_BYTES", "1K")
    cache.store(cache.make_key(parts(cpu="e")), parts(cpu="e"), PAYLOAD)
    assert not entry_path(cdir, cpu="e").exists()
    assert cache.load(cache.make_key(parts(cpu="e")), parts(cpu="e")) == PAYLOAD


def test_max_bytes_setting(monkeypatch):
    for text, value in [("1024", 1024), ("64M", 64 << 20), ("2G", 2 << 30), ("512MiB", 512 << 20),
                        ("1.5k", 1536)]:
        with envvars.override(GRAPHOPT_CACHE_MAX_BYTES=text):
            assert envvars.cache_max_bytes() == value
    monkeypatch.setenv("GRAPHOPT_CACHE_MAX_BYTES", "lots")
    with pytest.raises(SwitchError, match="GRAPHOPT_CACHE_MAX_BYTES='lots'"):
        envvars.cache_max_bytes()
    with pytest.raises(SwitchError, match="GRAPHOPT_CACHE_MAX_BYTES='lots'"):  # not guessed
        cache.max_bytes()
    monkeypatch.setenv("GRAPHOPT_CACHE_MAX_BYTES", "")  # empty: the default
    assert cache.max_bytes() == 512 << 20


# --------------------------------------------------------------------------- switches

def test_cache_off(cdir, monkeypatch):
    proc = run("""
        assert not cache.enabled() and cache.cache_dir() is None
        cache.store(key(), parts(), PAYLOAD)
        assert cache.load(key(), parts()) is None
        """, cdir, env={"GRAPHOPT_CACHE": "0"})
    assert not cdir.exists() and not warnings_in(proc)
    # Read when called, not at import; settable in code, which wins over the environment.
    assert cache.enabled()
    monkeypatch.setenv("GRAPHOPT_CACHE", "off")
    assert not cache.enabled() and cache.cache_dir() is None
    with envvars.override(GRAPHOPT_CACHE="1"):
        assert cache.enabled()
    assert not cache.enabled()


def test_location(monkeypatch, tmp_path):
    for name in ("GRAPHOPT_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "graphopt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "graphopt"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "graphopt"
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


def test_log_names_the_parts_of_a_miss_and_a_hit(cdir):
    proc = run("""
        cache.load(key(), parts())
        cache.store(key(), parts(), PAYLOAD)
        cache.load(key(), parts())
        """, cdir, env={"GRAPHOPT_LOG": "cache"})
    k = cache.make_key(parts())
    log = proc.stderr
    assert f"graphopt.cache: miss {k}" in log and f"graphopt.cache: hit {k}" in log
    assert log.index("miss") < log.index("hit")
    for name, value in parts().items():
        if name != "kernel":
            assert f"  {name}" in log and value in log
    # The kernel text is shown by its own hash and first line only.
    assert "kernel @adam(f32[16]) {" in log and "%0 = multiply" not in log
    # A later miss says which parts differ from the closest entry: why it compiled again.
    proc = run("""
        envvars.set_var("GRAPHOPT_LOG", "cache")          # settable in code too
        cache.load(key(llvm="16.0.6"), parts(llvm="16.0.6"))
        envvars.set_var("GRAPHOPT_LOG", None)
        cache.load(key(llvm="17"), parts(llvm="17"))      # not logged
        """, cdir)
    assert "differs in: llvm" in proc.stderr and "15.0.7 -> 16.0.6" in proc.stderr
    assert proc.stderr.count("graphopt.cache: miss") == 1
    assert run("cache.load(key(), parts())", cdir).stderr == ""  # quiet without GRAPHOPT_LOG


# --------------------------------------------------------------------------- the command

def cli(capsys, *args: str) -> str:
    from graphopt.cli import main
    assert main(["cache", *args]) == 0
    return capsys.readouterr().out


def test_cli(cdir, capsys):
    # The installed entry point, once, in a fresh process; then main() in this one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHOPT_")}
    proc = subprocess.run([sys.executable, "-m", "graphopt.cli", "cache", "path"],
                          env=dict(env, GRAPHOPT_CACHE_DIR=str(cdir)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == str(cdir), proc.stderr
    assert "entries    0" in cli(capsys, "info")
    cache.store(key(), parts(), PAYLOAD)
    cache.store(key(flags="O0"), parts(flags="O0"), b"x")
    (cdir / "notes.txt").write_text("not an entry")
    info = cli(capsys, "info")
    assert f"path       {cdir}" in info and "enabled    yes" in info
    assert "entries    2" in info and "max bytes  536870912" in info and "directory  ok" in info
    size = sum(p.stat().st_size for p in cdir.glob("*.gobj"))
    assert f"bytes      {size} " in info
    os.utime(entry_path(cdir), (1000, 1000))
    lines = cli(capsys, "list").splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(key(flags="O0")[:16])  # most recently used first
    assert "flags: O0" in lines[0]
    # The kernel as the log shows it: its own hash tells kernels with one first line apart.
    kernel = cache.summarize(parts(flags="O0")["kernel"])
    assert f"kernel: [sha256 {kernel['sha256']}, {kernel['chars']} chars] " \
        "kernel @adam(f32[16]) {" in lines[0]
    assert lines[1].startswith(key()[:16]) and "flags: O3 contract" in lines[1]
    assert "1970-01-01" in lines[1] or "1969-12-31" in lines[1]  # its last use
    assert cli(capsys, "clear").startswith("removed 2 files")
    assert [p.name for p in cdir.iterdir()] == ["notes.txt"]
    assert "entries    0" in cli(capsys, "info")
    with envvars.override(GRAPHOPT_CACHE="0"):
        assert "enabled    no" in cli(capsys, "info")


def test_the_store_is_at_the_bottom_layer():
    """diskcache imports nothing of graphopt but envvars, errors and memory: no backend, IR or
    frontend (and so no LLVM), whatever uses it."""
    ours = set()  # the graphopt modules it imports, relatively or not
    for node in ast.walk(ast.parse(Path(cache.__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            ours |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names]
            ours |= {n.removeprefix("graphopt.") for n in names if n.startswith("graphopt")}
    assert ours and ours <= {"envvars", "errors", "memory"}, ours


def test_every_switch_is_documented():
    docs = (Path(__file__).parent.parent / "docs" / "switches.md").read_text()
    for name in envvars.VARIABLES:
        assert f"`{name}`" in docs and f"`{name}`" in envvars.__doc__
    assert "graphopt/envvars.py" in docs
    cache_doc = (Path(__file__).parent.parent / "docs" / "cache.md").read_text()
    assert all(f"`{name}`" in cache_doc for name in envvars.VARIABLES if "CACHE" in name)
    with pytest.raises(KeyError, match="not a graphopt switch"):
        envvars.get("GRAPHOPT_NO_SUCH_THING")
