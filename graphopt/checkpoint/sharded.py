"""The checkpoint of a job of several ranks: a directory of logical tensors and a shard map.

    run.ckpt/
      manifest.json             the commit point: written last, by rank 0
      data-<token>/rank<R>.bin  rank R's bytes of this checkpoint, raw, little-endian

Each rank writes only what it holds: its shards of ZeRO's state, and its share of the
replicated tensors (weights, hyper-parameters, zero=0 state: each written once, by the rank
with the fewest bytes so far). The manifest maps every logical tensor (logical.py) to the
parts that tile it: [file, byte offset, start, stop] in its flat elements. A loading rank
reads only the byte ranges of the parts it needs, in blocks whose CRC-32s the manifest
lists, so a flipped or lost byte is found where it is read.

A save is complete or absent. Every rank writes into a new `data-<token>` directory; the
ranks agree (a collective) that all wrote and fsynced their files; then rank 0 writes the
manifest to a temporary file, fsyncs it and renames it over `manifest.json` (one atomic
rename), and only then removes the data directories no manifest names. Until that rename
the old manifest names the old data, which no step of a save touches: a rank killed, or a
disk that fills, at any point before it leaves the previous checkpoint loadable (and a
`data-*` directory that the next save removes); after it, the new one is complete.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..ir.types import DTYPES, TensorType, bf16
from .logical import Holding

MANIFEST = "manifest.json"
KIND = "graphopt sharded checkpoint"
VERSION = 1
# The unit a CRC-32 covers: a rank reading a range reads at most a block more at each end.
BLOCK = 1 << 18
_DATA = re.compile(r"data-[0-9a-f]{32}")
_FILE = re.compile(r"rank[0-9]+\.bin")


def is_sharded(path: str) -> bool:
    """Whether `path` is a directory (then it can only be a sharded checkpoint)."""
    return os.path.isdir(path)


def _wire(t: TensorType) -> np.dtype:
    """How the elements of a logical tensor are stored: little-endian, bf16 as its bits."""
    return np.dtype(np.uint16 if t.dtype == bf16 else t.dtype.np_dtype).newbyteorder("<")


# -- saving ---------------------------------------------------------------------------------------
def save(path: str, holdings: list[Holding], types: dict[str, TensorType], world: Any,
         agreed: Callable[..., list]) -> None:
    """Write this rank's part of the checkpoint at `path`, with every other rank of `world`.
    `agreed(action, on_failure)` runs a step on every rank: an error on any rank is a
    CheckpointError on all (after `on_failure`)."""
    token = uuid.uuid4().hex
    data = os.path.join(path, f"data-{token}")
    mine = world.rank

    def forget() -> None:  # a failed save removes its own data, on rank 0
        if mine == 0:
            shutil.rmtree(data, ignore_errors=True)

    def prepare() -> tuple:
        if mine == 0:
            _directories(path, data)
        replicated = [(h.param.name, zlib.crc32(h.param.numpy()))
                      for h in holdings if h.replicated]
        return token, {n: (t.dtype.name, t.shape) for n, t in types.items()}, replicated

    ranks = agreed(prepare, forget)
    token, data = ranks[0][0], os.path.join(path, f"data-{ranks[0][0]}")
    ranks = agreed(lambda: _write(data, mine, holdings, _owners(ranks, types, path)), forget)
    agreed(lambda: _commit(path, token, ranks, types) if mine == 0 else None, forget)


def _directories(path: str, data: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise CheckpointError(f"{path}: is a file (a checkpoint of one process?); a job of "
                              f"several ranks saves a directory: choose another path")
    try:
        os.makedirs(path, exist_ok=True)
        os.mkdir(data)
    except OSError as e:
        raise CheckpointError(f"{path}: the checkpoint's directory could not be made "
                              f"({e.strerror or e})") from None


def _owners(ranks: list[tuple], types: dict[str, TensorType], path: str) -> dict[str, int]:
    """The ranks agree on what they save (a CheckpointError on every rank otherwise); each
    replicated tensor's writer: the rank with the fewest bytes to write so far."""
    for r, (_, listed, replicated) in enumerate(ranks[1:], 1):
        if listed != ranks[0][1] or [n for n, _ in replicated] != [n for n, _ in ranks[0][2]]:
            raise CheckpointError(f"{path}: rank {r} saves other tensors than rank 0 (every "
                                  f"rank must save the same Parameters and optimizers)")
    for i, (name, crc) in enumerate(ranks[0][2]):
        differ = [r for r, rank in enumerate(ranks) if rank[2][i][1] != crc]
        if differ:
            raise CheckpointError(f"{path}: '{name}' differs between rank 0 and rank "
                                  f"{differ[0]}, though no rank holds a shard of it: each rank "
                                  f"writes a part of what all hold, so it must be the same on "
                                  f"every rank")
    load = [0] * len(ranks)
    owners = {}
    for name, _ in ranks[0][2]:
        owners[name] = load.index(min(load))
        load[owners[name]] += types[name].nbytes
    return owners


def _write(data: str, rank: int, holdings: list[Holding], owners: dict[str, int]) -> tuple:
    """This rank's file: its shards' parts, and the replicated tensors it owns. Returns its
    parts ([name, byte offset, start, stop]) and its blocks' CRC-32s."""
    name = f"rank{rank}.bin"
    parts, writer = [], _Blocks()
    try:
        with open(os.path.join(data, name), "wb") as f:
            for h in holdings:
                if h.replicated and owners[h.param.name] != rank:
                    continue
                for part in h.parts:
                    raw = np.ascontiguousarray(h.piece(part))
                    wire = _wire(h.param.type)
                    raw = (raw.view(np.uint16) if h.param.dtype == bf16 else raw).astype(
                        wire, copy=False)
                    parts.append([part.name, writer.size, part.start, part.stop])
                    writer.write(f, raw.view(np.uint8))
            f.flush()
            os.fsync(f.fileno())  # a full disk may only say so here
    except OSError as e:
        shared = "; the ranks must share a file system" if isinstance(e, FileNotFoundError) else ""
        raise CheckpointError(f"{data}: rank {rank}'s file could not be written "
                              f"({e.strerror or e}{shared})") from None
    return name, parts, writer.size, writer.done()


class _Blocks:
    """The CRC-32 of each BLOCK of bytes written."""

    def __init__(self) -> None:
        self.size, self.crcs, self._crc = 0, [], 0

    def write(self, f: Any, data: np.ndarray) -> None:
        f.write(data.data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), BLOCK - self.size % BLOCK)
            self._crc = zlib.crc32(view[:take], self._crc)
            self.size += take
            view = view[take:]
            if self.size % BLOCK == 0:
                self.crcs.append(self._crc)
                self._crc = 0

    def done(self) -> list[int]:
        return self.crcs + ([self._crc] if self.size % BLOCK else [])


def _commit(path: str, token: str, ranks: list[tuple], types: dict[str, TensorType]) -> None:
    """Rank 0: the manifest, written and renamed over the old one; then the data no manifest
    names is removed."""
    tensors = {n: {"dtype": t.dtype.name, "shape": list(t.shape), "parts": []}
               for n, t in types.items()}
    for file, parts, _, _ in ranks:
        for name, offset, start, stop in parts:
            tensors[name]["parts"].append([file, offset, start, stop])
    for name, t in tensors.items():
        t["parts"].sort(key=lambda p: p[2])
        _tiles(t["parts"], types[name].size, f"{path}: '{name}'")
    manifest = {"kind": KIND, "version": VERSION, "ranks": len(ranks), "block": BLOCK,
                "data": f"data-{token}",
                "files": {file: {"bytes": size, "crc32": crcs} for file, _, size, crcs in ranks},
                "tensors": tensors}
    final, tmp = os.path.join(path, MANIFEST), os.path.join(path, f"{MANIFEST}.tmp-{token}")
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)  # the commit: before it the old checkpoint, after it the new
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CheckpointError(f"{path}: the manifest could not be written "
                              f"({e.strerror or e})") from None
    # Committed: nothing from here on may fail the save (a failed save removes its data).
    with contextlib.suppress(OSError):
        _fsync_directory(path)
        for entry in os.listdir(path):  # what earlier saves left: old data, killed saves' data
            if entry != manifest["data"] and (_DATA.fullmatch(entry) or
                                              entry.startswith(f"{MANIFEST}.tmp-")):
                full = os.path.join(path, entry)
                if os.path.isdir(full):
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    os.unlink(full)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tiles(parts: list[list], size: int, what: str) -> None:
    """Sorted parts [file, offset, start, stop] cover [0, size), each element once."""
    at = 0
    for _, _, start, stop in parts:
        if start != at or stop <= start:
            break
        at = stop
    else:
        if at == size:
            return
    raise CheckpointError(f"{what}: its parts {[p[2:] for p in parts]} do not cover its "
                          f"{size} elements once each")


# -- loading --------------------------------------------------------------------------------------
class Source:
    """A sharded checkpoint opened for reading: its logical tensors' types (`types`), checked,
    and `read(name, start, stop)`, which reads and checks only the blocks that range lies in."""

    def __init__(self, path: str, open_regular: Callable[[str], Any]):
        self.path, self._open = path, open_regular
        with open_regular(os.path.join(path, MANIFEST)) as f:
            text = f.read()
        self._manifest(text)
        self._files: dict[str, Any] = {}
        self._blocks: dict[tuple[str, int], bytes] = {}

    def _manifest(self, text: bytes) -> None:
        where = f"{self.path}: {MANIFEST}"
        try:
            m = json.loads(text)
        except ValueError as e:
            raise CheckpointError(f"{where} is not JSON ({e}): damaged, or not written by "
                                  f"graphopt.save") from None
        keys = ["block", "data", "files", "kind", "ranks", "tensors", "version"]
        if not isinstance(m, dict) or sorted(m) != keys or m["kind"] != KIND:
            raise CheckpointError(f"{where}: not a graphopt checkpoint's manifest (expected "
                                  f"an object with {keys}, kind {KIND!r})")
        if m["version"] != VERSION or type(m["version"]) is not int:
            raise CheckpointError(f"{where}: version {m['version']!r}, this graphopt reads "
                                  f"version {VERSION}")
        if not _count(m["block"], 1) or not _count(m["ranks"], 1) or \
                not isinstance(m["data"], str) or not _DATA.fullmatch(m["data"]):
            raise CheckpointError(f"{where}: 'block', 'ranks' or 'data' is malformed")
        self.block, self.data = m["block"], os.path.join(self.path, m["data"])
        files = m["files"]
        if not isinstance(files, dict) or not all(
                _FILE.fullmatch(n) and isinstance(f, dict) and sorted(f) == ["bytes", "crc32"]
                and _count(f["bytes"], 0) and isinstance(f["crc32"], list) and
                len(f["crc32"]) == -(-f["bytes"] // self.block) and
                all(_count(c, 0) for c in f["crc32"]) for n, f in files.items()):
            raise CheckpointError(f"{where}: its 'files' are malformed (each rankR.bin: its "
                                  f"bytes, one CRC-32 per block)")
        self.files = files
        if not isinstance(m["tensors"], dict):
            raise CheckpointError(f"{where}: 'tensors' is not an object")
        self.types: dict[str, TensorType] = {}
        self.parts: dict[str, list[list]] = {}
        for name, t in m["tensors"].items():
            self.types[name] = self._tensor(name, t, where)
            self.parts[name] = t["parts"]

    def _tensor(self, name: str, t: Any, where: str) -> TensorType:
        what = f"{where}: tensor '{name}'"
        if not isinstance(t, dict) or sorted(t) != ["dtype", "parts", "shape"]:
            raise CheckpointError(f"{what} is malformed (expected dtype, shape, parts)")
        if not isinstance(t["dtype"], str) or t["dtype"] not in DTYPES:
            raise CheckpointError(f"{what} has the dtype {t['dtype']!r}; graphopt's dtypes "
                                  f"are {', '.join(DTYPES)}")
        if not isinstance(t["shape"], list) or not all(_count(d, 0) for d in t["shape"]):
            raise CheckpointError(f"{what}: its shape {t['shape']!r} is not a list of sizes")
        tt = TensorType(tuple(t["shape"]), DTYPES[t["dtype"]])
        parts = t["parts"]
        if not isinstance(parts, list) or not all(
                isinstance(p, list) and len(p) == 4 and p[0] in self.files and
                all(_count(x, 0) for x in p[1:]) for p in parts):
            raise CheckpointError(f"{what}: its parts are malformed ([file, offset, start, "
                                  f"stop], of files the manifest lists)")
        _tiles(sorted(parts, key=lambda p: p[2]), tt.size, what)
        itemsize = _wire(tt).itemsize
        for file, offset, start, stop in parts:
            if offset + (stop - start) * itemsize > self.files[file]["bytes"]:
                raise CheckpointError(f"{what}: a part lies past the end of {file}")
        return tt

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of the flat logical tensor `name`, in its dtype."""
        t = self.types[name]
        wire = _wire(t)
        out = np.empty(stop - start, wire)
        for file, offset, a, b in self.parts[name]:
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                at = offset + (lo - a) * wire.itemsize
                out[lo - start:hi - start] = np.frombuffer(
                    self._bytes(file, at, at + (hi - lo) * wire.itemsize), wire)
        native = out.astype(wire.newbyteorder("="), copy=False)
        return native.view(bf16.np_dtype) if t.dtype == bf16 else native

    def _bytes(self, file: str, start: int, stop: int) -> bytes:
        first, last = start // self.block, (stop - 1) // self.block
        data = b"".join(self._block(file, i) for i in range(first, last + 1))
        return data[start - first * self.block:stop - first * self.block]

    def _block(self, file: str, i: int) -> bytes:
        """Block i of a data file, read once and checked against its CRC-32."""
        key = (file, i)
        if key not in self._blocks:
            meta = self.files[file]
            size = min(self.block, meta["bytes"] - i * self.block)
            data = os.pread(self._file(file).fileno(), size, i * self.block)
            if len(data) != size or zlib.crc32(data) != meta["crc32"][i]:
                why = "truncated" if len(data) != size else "its CRC-32 differs"
                raise CheckpointError(f"{self.path}: {file} is damaged (block {i}: {why})")
            self._blocks[key] = data
        return self._blocks[key]

    def _file(self, file: str) -> Any:
        if file not in self._files:
            path = os.path.join(self.data, file)
            stack = contextlib.ExitStack()
            try:
                f = stack.enter_context(self._open(path))
            except CheckpointError as e:
                raise CheckpointError(f"{self.path}: the data file {file} is missing or "
                                      f"unreadable ({e.message})") from None
            size = os.fstat(f.fileno()).st_size
            if size != self.files[file]["bytes"]:
                stack.close()
                raise CheckpointError(f"{self.path}: {file} holds {size} bytes where the "
                                      f"manifest says {self.files[file]['bytes']} (truncated "
                                      f"or damaged)")
            self._files[file] = (f, stack)
        return self._files[file][0]

    def close(self) -> None:
        for _, stack in self._files.values():
            stack.close()
        self._files, self._blocks = {}, {}


def _count(x: Any, least: int) -> bool:
    return type(x) is int and x >= least
