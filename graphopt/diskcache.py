"""The on-disk cache of compiled code: payloads (object code) keyed by what made them.

A store of bytes, at the bottom layer: it knows nothing of LLVM or of graphs. A backend makes
a key from named string parts with `make_key` (the LLVM backend's parts, kernel text, CPU,
compiler versions and so on, are in backends/llvm/engine.py and runtime.py), calls
`load(key, parts)` before it compiles and `store(key, parts, payload)` after. A change to any
part gives another key, so nothing stale is ever loaded. docs/cache.md has the rules;
graphopt/envvars.py has the switches (GRAPHOPT_CACHE, _DIR, _MAX_BYTES, GRAPHOPT_LOG=cache);
`graphopt cache` (cli.py) shows and clears the entries.

One entry is one file `<key>.gobj` in the cache directory:

    offset  size  field
    0       8     magic b"GOPTOBJ\\0"
    8       4     format version (u32, little-endian, like every number here)
    12      64    the key, as ascii hex (so a file renamed or copied to another name is rejected)
    76      8     payload length (u64)
    84      32    sha256 of the payload
    116     4     description length (u32)
    120     d     description: JSON {part: value, or {sha256, chars, first_line} if long}
    120+d   n     payload: the object code

Nothing in an entry is trusted before it is checked: a file that fails any check is a miss with
one warning per kind of problem per process, and the next store overwrites it. Only a regular
file is ever opened: a FIFO, a directory, a socket, a device or a symbolic link under an
entry's name is a bad entry too, found without opening it, without blocking and without
following anything.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from . import envvars

FORMAT_VERSION = 1
MAGIC = b"GOPTOBJ\0"
SUFFIX = ".gobj"
_HEADER = struct.Struct("<8sI64sQ32sI")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.gobj")
_TEMP_NAME = re.compile(r"\.[0-9a-f]{64}\.[A-Za-z0-9_]+\.tmp")  # from tempfile.mkstemp
_KEY = re.compile(r"[0-9a-f]{64}")
TEMP_MAX_AGE = 600.0  # s; writing an entry takes milliseconds, so an older temp file is a crash's
_SHORT = 80  # a part longer than this, or of several lines, is shown as its hash and first line

__all__ = ["FORMAT_VERSION", "CacheWarning", "Entry", "cache_dir", "clear", "describe", "enabled",
           "entries", "info", "load", "location", "make_key", "max_bytes", "reset", "show",
           "store", "summarize", "unsafe_reason"]


class CacheWarning(UserWarning):
    """A cache entry or directory that graphopt will not use; it compiles without it."""


class _BadEntry(Exception):
    def __init__(self, kind: str, reason: str):
        self.kind, self.reason = kind, reason
        super().__init__(reason)


_warned: set[str] = set()            # kinds of problem already warned about in this process
_unwritable: set[str] = set()        # directories a store failed in: not tried again
_memory: OrderedDict[str, bytes] = OrderedDict()  # the fallback when the disk cannot be used


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(f"graphopt cache: {message}", CacheWarning, stacklevel=4)


def reset() -> None:
    """Forget warnings given, directories found unwritable and in-memory entries (for tests)."""
    _warned.clear()
    _unwritable.clear()
    _memory.clear()


# ----------------------------------------------------------------------------- keys and parts

def make_key(parts: Mapping[str, str]) -> str:
    """The hex sha256 of the parts, in sorted order of name. Each name and value is hashed with
    its length before it, so no two different part sets hash the same bytes."""
    h = hashlib.sha256(b"graphopt-cache-key\0" + struct.pack("<II", FORMAT_VERSION, len(parts)))
    for name in sorted(parts):
        value = parts[name]
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"cache key parts must be str -> str, got {name!r}: {type(value)}")
        for field in (name, value):
            data = field.encode("utf-8", "surrogatepass")
            h.update(struct.pack("<Q", len(data)) + data)
    return h.hexdigest()


def _check_key(key: str, parts: Mapping[str, str]) -> None:
    # The key names a file, so it must be exactly what make_key returns (no "../" in it).
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
    if make_key(parts) != key:
        raise ValueError("cache key does not match its parts: use make_key(parts)")


def summarize(value: str) -> str | dict:
    """A part as the log and the entry description show it: short ones as they are, long ones
    as their own short hash, length and first line."""
    if len(value) <= _SHORT and "\n" not in value:
        return value
    return {"sha256": hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12],
            "chars": len(value), "first_line": value.split("\n", 1)[0][:_SHORT]}


def describe(parts: Mapping[str, str]) -> dict[str, str | dict]:
    """The description stored in an entry's header: each part by name, in sorted order,
    summarized (`summarize`)."""
    return {name: summarize(parts[name]) for name in sorted(parts)}


def show(summary: str | dict) -> str:
    """A summarized part as one line of text (for the log and `graphopt cache list`)."""
    if isinstance(summary, dict):
        return f"[sha256 {summary.get('sha256')}, {summary.get('chars')} chars] " \
               f"{summary.get('first_line', '')}"
    return repr(summary) if summary == "" or summary != summary.strip() else str(summary)


# ----------------------------------------------------------------------------- the directory

def enabled() -> bool:
    """Is the cache on (GRAPHOPT_CACHE, read now, not at import)?"""
    return envvars.cache_enabled()


def location() -> Path | None:
    """The cache directory, whether or not the cache is on; None if there is no home."""
    try:
        return envvars.cache_dir()
    except RuntimeError:
        return None


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is off."""
    return location() if enabled() else None


def max_bytes() -> int:
    """GRAPHOPT_CACHE_MAX_BYTES (SwitchError if it is not a size: a switch is never guessed)."""
    return envvars.cache_max_bytes()


def unsafe_reason(path: Path) -> str | None:
    """Why object code in directory `path` must not be run, or None if it may. Object code is
    executable, so the directory must be ours and writable by nobody else: otherwise another
    user could put code there that we would load. (Reads os.stat and os.geteuid when called, so
    tests can patch either.)"""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _trusted_dir(create: bool) -> tuple[Path | None, str]:
    """The directory to read and write entries in, or (None, why not)."""
    d = cache_dir()
    if d is None:
        return None, "no cache directory (no home directory; set GRAPHOPT_CACHE_DIR)"
    try:
        if create:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)  # 0700: object code is ours only
        reason = unsafe_reason(d)
    except FileNotFoundError:
        return None, f"no cache directory yet at {d}"
    except OSError as e:
        _warn_once("unwritable", f"cannot use {d} ({e.strerror}); compiled code is kept in "
                                 f"memory only")
        return None, f"cannot use {d}: {e.strerror}"
    if reason:
        _warn_once("unsafe", f"refusing to load or store object code in {d}: it {reason}. "
                             f"Run `chmod 700 {d}` if it is yours, or set GRAPHOPT_CACHE_DIR")
        return None, f"{d} {reason}"
    return d, ""


# ----------------------------------------------------------------------------- entries

def _pack(key: str, parts: Mapping[str, str], payload: bytes) -> bytes:
    desc = json.dumps(describe(parts), sort_keys=True).encode()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, key.encode(), len(payload),
                        hashlib.sha256(payload).digest(), len(desc)) + desc + payload


def _unpack_header(data: bytes, key: str | None) -> tuple[int, int, int]:
    """Check an entry's header (and its key, unless None) -> (header size, description length,
    payload length); raises _BadEntry."""
    if not data.startswith(MAGIC) and not MAGIC.startswith(data):
        raise _BadEntry("magic", "is not a graphopt cache entry (wrong magic bytes)")
    if len(data) < _HEADER.size:
        raise _BadEntry("truncated", f"is truncated ({len(data)} bytes, shorter than a header)")
    _, version, stored_key, n, _, dn = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise _BadEntry("version", f"has format version {version}, not {FORMAT_VERSION}")
    if key is not None and stored_key != key.encode():
        raise _BadEntry("foreign", f"holds the entry of another key "
                                   f"({stored_key[:16].decode('ascii', 'replace')}...)")
    return _HEADER.size, dn, n


_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link",
               stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device"}
# No blocking (a FIFO that takes a regular file's place between lstat and open), no symbolic
# link followed, no terminal made ours, nothing inherited by a child process.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
    getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def _check_file(st: os.stat_result) -> None:
    """Raise _BadEntry unless `st` is that of a regular file owned by the current user."""
    if not stat.S_ISREG(st.st_mode):
        what = _FILE_KINDS.get(stat.S_IFMT(st.st_mode), f"of file type {stat.S_IFMT(st.st_mode):o}")
        raise _BadEntry(f"not a file: {what}", f"is {what}, not a regular file")
    if st.st_uid != os.geteuid():
        raise _BadEntry("owner", f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")


def _open_entry(path: str | Path) -> int:
    """A file descriptor, for reading, of the regular file we own at `path`; FileNotFoundError
    if there is none, _BadEntry for anything else. lstat first, so that nothing but a regular
    file is opened (opening a FIFO blocks, a device may do anything), then fstat of what was
    opened, in case another file took its place in between."""
    try:
        _check_file(os.lstat(path))
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, _BadEntry):
        raise
    except OSError as e:  # ELOOP: a symbolic link put there since the lstat; EACCES
        raise _BadEntry("unreadable", f"cannot be read ({e.strerror})") from None
    try:
        _check_file(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(path: Path, key: str) -> bytes:
    """The payload of the entry file at `path`, after every check; raises _BadEntry (or
    FileNotFoundError). Reads no more than the header says the entry holds."""
    with os.fdopen(_open_entry(path), "rb") as f:
        try:
            head = f.read(_HEADER.size)
            start, dn, n = _unpack_header(head, key)
            end, size = start + dn + n, os.fstat(f.fileno()).st_size
            if size > end:
                raise _BadEntry("corrupt", f"is corrupt ({size - end} bytes after the payload)")
            data = head + f.read(end - len(head))
        except OSError as e:  # EIO, say: a miss like any other problem
            raise _BadEntry("unreadable", f"cannot be read ({e.strerror})") from None
    if len(data) < end:
        raise _BadEntry("truncated", f"is truncated ({len(data)} of {end} bytes)")
    payload = data[start + dn:]
    if hashlib.sha256(payload).digest() != _HEADER.unpack_from(data)[4]:
        raise _BadEntry("corrupt", "is corrupt (payload sha256 does not match)")
    return payload


def load(key: str, parts: Mapping[str, str]) -> bytes | None:
    """The cached object code for `key`, or None on a miss or any problem with the entry."""
    _check_key(key, parts)
    if not enabled():
        return None
    if key in _memory:
        _memory.move_to_end(key)
        _log("hit", key, parts, "in memory")
        return _memory[key]
    d, why = _trusted_dir(create=False)
    if d is None:
        _log("miss", key, parts, why)
        return None
    path = d / (key + SUFFIX)
    try:
        payload = _read(path, key)
    except FileNotFoundError:
        _log("miss", key, parts, f"no entry in {d}", d)
        return None
    except _BadEntry as e:
        _warn_once(e.kind, f"ignoring {path}: it {e.reason}; it will be recompiled and replaced")
        _log("miss", key, parts, f"bad entry: it {e.reason}")
        return None
    with suppress(OSError, NotImplementedError):  # the mtime is the last use: eviction
        os.utime(path, follow_symlinks=False)        # removes the least recently used
    _log("hit", key, parts, str(path))
    return payload


def store(key: str, parts: Mapping[str, str], payload: bytes) -> None:
    """Save object code under `key`. Never raises for a directory it cannot use: then the code
    is kept in memory for this process, with one warning."""
    _check_key(key, parts)
    if not enabled():
        return
    payload, bound = bytes(payload), max_bytes()
    d, _ = _trusted_dir(create=True)
    if d is not None and str(d) not in _unwritable:
        data = _pack(key, parts, payload)
        if len(data) > bound:
            _log("not stored", key, parts, f"{len(data)} bytes is over the bound of {bound}")
        else:
            try:
                _write(d, key, data)
            except IsADirectoryError:  # a directory with files in it holds the entry's name
                _warn_once("blocked", f"cannot store {d / (key + SUFFIX)}: a directory that is "
                                      f"not empty has its name; its code is kept in memory")
            except OSError as e:
                _unwritable.add(str(d))
                _warn_once("unwritable", f"cannot write to {d} ({e.strerror}); compiled code "
                                         f"is kept in memory only")
            else:
                _log("stored", key, parts, f"{len(data)} bytes in {d}")
                _evict(d, bound, keep=key)
                return
    _memory[key] = payload
    while sum(map(len, _memory.values())) > bound and len(_memory) > 1:
        _memory.popitem(last=False)


def _write(d: Path, key: str, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename it over the entry: a reader
    sees the old file or the new one, never part of one, and two writers of one key both win.
    No fsync: an entry cut short by a power failure fails its checks and is recompiled. A FIFO,
    a socket or a link of the entry's name is replaced like a file; IsADirectoryError if a
    directory that is not empty has the name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=d)  # mode 0600
    path = d / (key + SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)  # over anything but a directory: the name is replaced
        except IsADirectoryError:  # an empty directory of our name is removed
            with suppress(OSError):
                os.rmdir(path)
            os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class Entry:
    # path is the str os.scandir gives: making a Path of each entry, in the scan after every
    # store, was half the time of a store into a cache of 1,000 entries.
    key: str
    path: str
    size: int
    last_used: float                    # mtime: set when written and on each hit
    description: dict | None = None     # None when the header cannot be read


def entries(d: Path | None = None, descriptions: bool = True) -> list[Entry]:
    """The entries in the cache directory, least recently used first. Temporary files left by
    a writer that crashed are removed on the way."""
    d = d or location()
    found: list[Entry] = []
    try:
        listing = list(os.scandir(d)) if d else []
    except OSError:
        return found
    now = time.time()
    for e in listing:
        with suppress(OSError):
            st = e.stat(follow_symlinks=False)
            if _TEMP_NAME.fullmatch(e.name) and now - st.st_mtime > TEMP_MAX_AGE:
                os.unlink(e.path)
            elif _ENTRY_NAME.fullmatch(e.name) and stat.S_ISREG(st.st_mode):
                key = e.name[:-len(SUFFIX)]
                found.append(Entry(key, e.path, st.st_size, st.st_mtime,
                                   _description(e.path, key) if descriptions else None))
    return sorted(found, key=lambda x: (x.last_used, x.key))


def _description(path: str, key: str) -> dict | None:
    try:
        with os.fdopen(_open_entry(path), "rb") as f:
            head = f.read(_HEADER.size)
            _, dn, _ = _unpack_header(head, key)
            desc = json.loads(f.read(dn))
        return desc if isinstance(desc, dict) else None
    except (OSError, ValueError, _BadEntry):
        return None


def _evict(d: Path, bound: int, keep: str) -> None:
    """Remove least recently used entries until the directory is under the bound."""
    found = entries(d, descriptions=False)
    total = sum(e.size for e in found)
    for e in found:
        if total <= bound:
            break
        if e.key != keep:
            with suppress(OSError):  # another process evicted it first (or put a directory there)
                os.unlink(e.path)
            total -= e.size
            _log("evicted", e.key, None, f"{e.size} bytes, last used {time.ctime(e.last_used)}")


def clear() -> int:
    """Remove every entry and temporary file (only names of ours: a FIFO or a link of such a
    name too, and an empty directory); return how many. What cannot be removed (a directory
    with files in it, a file in a directory we cannot write) stays, with a CacheWarning."""
    d, removed = location(), 0
    for e in (os.scandir(d) if d and d.is_dir() else ()):
        if not (_ENTRY_NAME.fullmatch(e.name) or _TEMP_NAME.fullmatch(e.name)):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                os.rmdir(e.path)
            else:
                os.unlink(e.path)
            removed += 1
        except FileNotFoundError:  # another process removed it first
            pass
        except OSError as err:
            warnings.warn(f"graphopt cache: left {e.path}: {err.strerror}", CacheWarning,
                          stacklevel=2)
    _memory.clear()
    return removed


def info() -> dict:
    """What `graphopt cache info` shows: the directory's path, whether the cache is on, the
    number of entries and their bytes, the size bound, and whether the directory is safe to
    use ("ok", or why not)."""
    d = location()
    found = entries(d, descriptions=False)
    try:
        safety = (unsafe_reason(d) or "ok") if d else "no home directory"
    except FileNotFoundError:
        safety = "not made yet"
    except OSError as e:
        safety = f"cannot be used ({e.strerror})"
    return {"path": str(d), "enabled": enabled(), "entries": len(found),
            "bytes": sum(e.size for e in found), "max_bytes": max_bytes(), "directory": safety}


# ----------------------------------------------------------------------------- logging

def _log(event: str, key: str, parts: Mapping[str, str] | None, detail: str,
         d: Path | None = None) -> None:
    """With GRAPHOPT_LOG=cache: the event, the key and every part it was made from; on a miss
    in a directory with entries, also the parts that differ from the closest cached entry, which
    is usually the answer to "why did this compile again?"."""
    logger = envvars.topic_logger("cache")
    if logger is None:
        return
    lines = [f"{event} {key} ({detail})"]
    desc = describe(parts or {})
    width = max(map(len, desc), default=0)
    lines += [f"  {name:<{width}}  {show(value)}" for name, value in desc.items()]
    if d is not None:  # a miss: compare with the cached entry that shares the most parts
        def shared(e: Entry) -> int:
            return sum((e.description or {}).get(n) == v for n, v in desc.items())
        best = max(reversed(entries(d)), key=shared, default=None)  # ties: most recently used
        if best is not None and shared(best) > 0:
            old, absent = best.description or {}, "(absent)"
            changed = [n for n in sorted(set(desc) | set(old)) if desc.get(n) != old.get(n)]
            lines.append(f"  closest cached entry {best.key[:16]} differs in: {', '.join(changed)}")
            lines += [f"    {n}: {show(old.get(n, absent))} -> {show(desc.get(n, absent))}"
                      for n in changed]
    logger.info("\n".join(lines))
