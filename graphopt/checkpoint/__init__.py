"""Checkpoints: every Parameter of a run (weights, optimizer state, hyper-parameters, step
counters, loss scale) saved by name, and restored bit for bit.

    graphopt.save("run.npz", params, opt, scaler)      # after step 500
    graphopt.load("run.npz", params, opt, scaler)      # a fresh process continues exactly

What is saved are logical tensors, the ones a single process holds (logical.py): under
`DataParallel(zero=1|2)` the optimizer state a rank holds is shards of flat buckets, saved
as the parts of the per-parameter tensors (`fc0.w.exp_avg`) they are. One process saves one
`.npz` (below). In a job of several ranks (graphopt.distributed.init()), `save` and `load`
are collectives, called by every rank with the same objects: `save` writes a directory
(sharded.py) in which each rank wrote only what it holds, atomically as a whole (complete or
absent: a rank killed mid-save leaves the previous checkpoint loadable); `load` reads either
form at any world size and zero stage, each rank reading only the tensors (of a directory:
the byte ranges) its Parameters take. Under ZeRO the optimizer's shards exist from its first
step (or `parallel.sharding(opt)`); loaded before, a rank reads its state whole, as the
optimizer holds it until then. On every rank the checks below come first, and the ranks
agree (a collective) before any assigns: a problem on one rank is a CheckpointError on
every rank, and nothing changed anywhere.

Everything a step reads lives in Parameters, so restoring their bytes restores the run: a
resumed run takes the same steps as an uninterrupted one, bit for bit. Objects are anything
with `.parameters()` (optimizers, `Accumulate`, loss scalers); `params` may be a list of
Parameters or a dict by name. bf16 arrays are stored as their raw 16-bit patterns (npz has
no bf16) and each array's dtype is recorded, so nothing is converted on the way.

The file is an .npz (a zip of .npy arrays) with one more entry, `__graphopt__`: JSON with
the format number and each array's dtype. `load` trusts none of it. It opens regular files
only, reads no pickle, and checks, before it changes anything: the archive and each entry
(a damaged, truncated or foreign file is refused, naming the entry), the metadata (its form,
its format, every dtype a graphopt dtype, one entry per array and one array per entry),
that each array is stored as the dtype the metadata records (bits are never reinterpreted),
that the file holds exactly the expected names with their shapes and dtypes (read from each
array's header, before its data), and that the values are ones the objects would accept:
hyper-parameters are checked by the same code as the optimizer's constructor, step counters
and loss scales by their own rules (each object's `check_loaded`). Any failure is a
CheckpointError and nothing was changed.

`save` writes a temporary file next to the target and renames it over the target, so the old
checkpoint stays whole until the new one is complete; a save that fails removes its temporary
file. Neither may run inside a traced step: there they would run once, when the step is
traced, and never again.
"""
from __future__ import annotations

import contextlib
import functools
import json
import lzma
import math
import os
import stat
import struct
import threading
import tokenize
import zipfile
import zlib
from typing import IO, Any, Callable, Iterable, Mapping

import numpy as np

from .. import comm
from ..errors import CheckpointError, OptimizerError
from ..frontend import Parameter, assign
from ..frontend.traces import current_trace
from ..ir.types import DTYPES, DType, TensorType, bf16, to_dtype

FORMAT = 1
_META = "__graphopt__"
# What reading a damaged archive can raise (zipfile and the decompressors raise many kinds).
# A .npy header is parsed as a Python literal: SyntaxError, tokenize's TokenError.
_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zipfile.LargeZipFile,
                NotImplementedError, RuntimeError, zlib.error, lzma.LZMAError, struct.error,
                SyntaxError, tokenize.TokenError)


def collect(params: Any, *objects: Any) -> list[Parameter]:
    """The Parameters of `params` and of each object's `.parameters()`, each once, with
    distinct names."""
    if isinstance(params, Mapping):
        items = list(params.values())
    elif isinstance(params, Parameter):
        items = [params]
    else:
        try:
            items = list(params)
        except TypeError:
            raise CheckpointError(f"checkpoint: params must be a Parameter, a list of them or "
                                  f"a dict by name, got {type(params).__name__}") from None
    for obj in objects:
        if not hasattr(obj, "parameters"):
            raise CheckpointError(f"cannot checkpoint a {type(obj).__name__}: it has no "
                                  f".parameters()")
        items += obj.parameters()
    out: dict[str, Parameter] = {}
    for p in items:
        if not isinstance(p, Parameter):
            raise CheckpointError(f"checkpoint: {p!r} is not a graphopt.Parameter")
        if out.get(p.name, p) is not p:
            raise CheckpointError(f"checkpoint: two different Parameters are named '{p.name}'")
        out[p.name] = p
    return list(out.values())


# -- saving ---------------------------------------------------------------------------------------
def save(path: str | os.PathLike, params: Any, *objects: Any) -> None:
    """Write every Parameter of `params` and `objects` to `path`, atomically: the old
    checkpoint stays whole until the new one is complete, and a failed save leaves it as it
    was (a CheckpointError says why). One process writes an .npz file; a job of several
    ranks, every rank calling save, a directory (graphopt/checkpoint/sharded.py).

    `params` is a list of Parameters or a dict by name; `objects` are anything with
    `.parameters()`: optimizers, `Accumulate`, loss scalers."""
    from .logical import plan, whole
    path = _path(path, "save")
    _refuse_in_trace("save", path)
    world = comm.group("world")
    if world.size > 1:
        from . import sharded
        agreed = functools.partial(_agreed, world, unchanged="the previous checkpoint is "
                                                             "unchanged")
        planned = agreed(lambda: plan(collect(params, *objects), path), share=False)
        sharded.save(path, *planned, world, agreed)
        return
    ps = collect(params, *objects)
    if any(p.name == _META for p in ps):
        raise CheckpointError(f"{path}: a Parameter is named '{_META}', the name of the "
                              f"checkpoint's metadata entry; rename it")
    if os.path.isdir(path):
        raise CheckpointError(f"{path}: is a directory; save writes a file (a name such as "
                              f"{os.path.join(path, 'run.npz')})")
    holdings, types = plan(ps, path)
    arrays = {n: _raw(a) for n, a in whole(holdings, types, path).items()}
    meta = {"format": FORMAT, "dtypes": {n: t.dtype.name for n, t in types.items()}}
    arrays[_META] = np.array(json.dumps(meta))
    # Next to the target (a rename stays in one file system), one name per process and thread.
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:  # a file object: numpy adds no ".npz" to the name
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())  # a full disk may only say so here, or at close
        os.replace(tmp, path)  # a crash mid-write leaves the old checkpoint whole
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise CheckpointError(f"{path}: the checkpoint could not be written "
                                  f"({e.strerror or e}); no file was changed") from None
        raise


def _raw(a: np.ndarray) -> np.ndarray:
    """An array npz can store: bf16 as its uint16 bit patterns."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _stored(d: DType) -> np.dtype:
    """The numpy dtype an array of graphopt dtype d is stored as."""
    return np.dtype(np.uint16) if d == bf16 else d.np_dtype


# -- loading --------------------------------------------------------------------------------------
def load(path: str | os.PathLike, params: Any, *objects: Any) -> None:
    """Restore every Parameter of `params` and `objects` (as `save` takes them) from
    `path`: an .npz or a sharded checkpoint's directory, saved at any world size and zero
    stage. Checks the file (a regular file, an .npz of .npy arrays, no pickle; or the
    manifest and the CRC-32 of every block read), its metadata, every name, shape and dtype,
    and the values as the objects' constructors check them, before changing anything; any
    problem is a CheckpointError that names the file and the entry (in a job of several
    ranks, on every rank, naming the rank that found it)."""
    from .logical import assemble, plan
    path = _path(path, "load")
    _refuse_in_trace("load", path)

    def read() -> tuple[list[Parameter], dict[str, np.ndarray]]:
        targets = collect(params, *objects)
        holdings, types = plan(targets, path)
        with _source(path, types) as part:
            values = {h.param.name: assemble(h, part) for h in holdings}
        return targets, _checked(targets, values, path, objects)

    targets, values = _agreed(comm.group("world"), read, share=False,
                              unchanged="nothing was loaded on any rank")
    for p in targets:
        assign(p, values[p.name])


@contextlib.contextmanager
def _source(path: str, types: Mapping[str, TensorType]):
    """The checkpoint at `path` checked against the logical tensors `types`: read(name,
    start, stop), flat elements of one."""
    if not os.path.isdir(path):
        with _open_regular(path) as f:
            arrays = _read(f, path, types)
        yield lambda name, start, stop: arrays[name].reshape(-1)[start:stop]
        return
    from . import sharded
    if not os.path.exists(os.path.join(path, sharded.MANIFEST)):
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file (nor a sharded "
                              f"checkpoint: it has no {sharded.MANIFEST})")
    source = sharded.Source(path, _open_regular)
    try:
        check_types(types, {n: (t.dtype, t.shape) for n, t in source.types.items()}, path)
        yield source.read
    finally:
        source.close()


def _agreed(world: Any, action: Callable[[], Any], on_failure: Callable[[], None] | None = None,
            *, unchanged: str, share: bool = True) -> Any:
    """action() on every rank of `world`, then a collective: if it raised a CheckpointError
    on any rank, it raises one on every rank (after `on_failure`), naming the rank. Returns
    every rank's result (`share`) or this rank's."""
    if world.size == 1:
        return [action()] if share else action()
    try:
        result, error = action(), None
    except CheckpointError as e:
        result, error = None, e.message
    got = world.gather_objects((error, result if share else None))
    failed = [r for r, (e, _) in enumerate(got) if e is not None]
    if failed:
        if on_failure is not None:
            on_failure()
            world.gather_objects(None)  # every rank returns once it is done
        where = f"rank {failed[0]}" if len(failed) == 1 else \
            f"ranks {', '.join(map(str, failed))}"
        raise CheckpointError(f"{got[failed[0]][0]} (on {where} of {world.size}); {unchanged}")
    return [r for _, r in got] if share else result


def restore(params: Iterable[Parameter], arrays: Mapping[str, Any], source: str,
            objects: Iterable[Any] = ()) -> None:
    """Copy arrays[p.name] into each Parameter, after checking all of them: same names (no
    missing, no extra), shapes and dtypes, and values each object accepts (its
    `check_loaded(values)`, if it has one). Nothing changes if any check fails."""
    _refuse_in_trace("restore", source)
    params = list(params)
    values = _checked(params, arrays, source, objects)
    for p in params:
        assign(p, values[p.name])


def _checked(params: list[Parameter], arrays: Mapping[str, Any], source: str,
             objects: Iterable[Any]) -> dict[str, np.ndarray]:
    """The arrays, by name, once restore's checks pass."""
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"{source}: the arrays must be a dict by Parameter name, got "
                              f"{type(arrays).__name__}")
    values: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        if not isinstance(name, str):
            raise CheckpointError(f"{source}: entry {name!r}: names are strings")
        try:
            values[name] = np.asarray(a)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{source}: entry '{name}' is not an array ({e})") from None
    check_entries(params, {n: (a.dtype, a.shape) for n, a in values.items()}, source)
    for obj in objects:
        check = getattr(obj, "check_loaded", None)
        if check is not None:
            try:
                check(values)
            except OptimizerError as e:
                raise CheckpointError(f"{source}: {e.message}") from None
    return values


def check_entries(params: Iterable[Parameter], entries: Mapping[str, tuple[Any, tuple]],
                  source: str) -> None:
    """The entries (name -> (dtype, shape); a graphopt or a numpy dtype) are exactly the
    Parameters' names, each with its Parameter's shape and dtype."""
    check_types({p.name: p.type for p in params}, entries, source)


def check_types(expected: Mapping[str, TensorType], entries: Mapping[str, tuple[Any, tuple]],
                source: str) -> None:
    """The entries (name -> (dtype, shape)) are exactly the expected tensors' names, each with
    its type."""
    missing = [n for n in expected if n not in entries]
    extra = sorted(set(entries) - set(expected))
    if missing or extra:
        parts = ([f"missing {missing}"] if missing else []) + \
            ([f"unexpected {extra}"] if extra else [])
        raise CheckpointError(f"{source}: {'; '.join(parts)}")
    for name, t in expected.items():
        dtype, shape = entries[name]
        d = dtype if isinstance(dtype, DType) else _graphopt_dtype(dtype)
        if d != t.dtype or tuple(shape) != t.shape:
            raise CheckpointError(f"{source}: '{name}' is {_describe(dtype, shape)}, the "
                                  f"parameter is {t}")


def _read(f: IO[bytes], path: str, types: Mapping[str, TensorType]) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint file, checked against its metadata and against the logical
    tensors `types` (names, shapes and dtypes from each array's header, before its data is
    read)."""
    head = f.read(8)
    f.seek(0)
    if not head:
        raise CheckpointError(f"{path}: the file is empty (not a graphopt checkpoint)")
    if head.startswith(b"\x93NUMPY"):
        raise CheckpointError(f"{path}: a single .npy array, not a graphopt checkpoint (an "
                              f".npz written by graphopt.save)")
    if head[:1] == b"\x80":
        raise CheckpointError(f"{path}: a pickle, not a graphopt checkpoint; graphopt never "
                              f"unpickles (loading a pickle can run any code)")
    try:
        archive = zipfile.ZipFile(f)
        infos = archive.infolist()
    except _READ_ERRORS as e:
        raise CheckpointError(f"{path}: not a readable .npz archive ({e}): truncated, "
                              f"damaged, or not written by graphopt.save") from None
    with archive:
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise CheckpointError(f"{path}: not a graphopt checkpoint: it holds "
                                      f"'{info.filename}', which is not a .npy array")
            name = info.filename[:-len(".npy")]
            if name in members:
                raise CheckpointError(f"{path}: the entry '{name}' is there twice")
            members[name] = info
        if _META not in members:
            raise CheckpointError(f"{path}: not a graphopt checkpoint (it has no '{_META}' "
                                  f"entry: an .npz of other arrays?)")
        dtypes = _metadata(archive, members.pop(_META), path)
        unlisted = sorted(set(members) - set(dtypes))
        if unlisted:
            raise CheckpointError(f"{path}: the entries {unlisted} have no dtype in the "
                                  f"metadata")
        absent = sorted(set(dtypes) - set(members))
        if absent:
            raise CheckpointError(f"{path}: the metadata lists {absent}, which the file does "
                                  f"not hold (missing arrays)")
        shapes = {}
        for name, info in members.items():  # headers first: nothing large is read yet
            with _npy(archive, info, path, name) as (_, shape, _, dtype):
                want = _stored(dtypes[name])
                if dtype != want:
                    raise CheckpointError(f"{path}: entry '{name}' is stored as {dtype.str} "
                                          f"({_describe(dtype, shape)}) where the metadata "
                                          f"says {dtypes[name]} ({want.str}); graphopt does "
                                          f"not reinterpret bits")
                shapes[name] = shape
        check_types(types, {n: (dtypes[n], shapes[n]) for n in members}, path)
        return {name: _data(archive, info, path, name, dtypes[name])
                for name, info in members.items()}


def _metadata(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> dict[str, DType]:
    """The metadata entry: {"format": 1, "dtypes": {name: "f32", ...}}, checked."""
    with _npy(archive, info, path, _META) as (_, shape, _, dtype):
        if dtype.kind != "U" or shape != ():
            raise CheckpointError(f"{path}: the metadata ('{_META}') is "
                                  f"{_describe(dtype, shape)}, expected a string")
    try:
        meta = json.loads(str(_data(archive, info, path, _META, None)))
    except ValueError as e:
        raise CheckpointError(f"{path}: the metadata ('{_META}') is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: the metadata ('{_META}') is a JSON "
                              f"{type(meta).__name__}, expected an object with 'format' and "
                              f"'dtypes'")
    if set(meta) != {"format", "dtypes"}:
        raise CheckpointError(f"{path}: the metadata ('{_META}') has the keys {sorted(meta)}, "
                              f"expected ['dtypes', 'format']")
    fmt = meta["format"]
    if type(fmt) is not int or fmt != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {fmt!r}, this graphopt reads "
                              f"format {FORMAT}")
    dtypes = meta["dtypes"]
    if not isinstance(dtypes, dict):
        raise CheckpointError(f"{path}: the metadata's 'dtypes' is a JSON "
                              f"{type(dtypes).__name__}, expected an object (name -> dtype)")
    for name, d in dtypes.items():
        if not isinstance(d, str) or d not in DTYPES:
            raise CheckpointError(f"{path}: the metadata gives '{name}' the dtype {d!r}; "
                                  f"graphopt's dtypes are {', '.join(DTYPES)}")
    return {name: DTYPES[d] for name, d in dtypes.items()}


@contextlib.contextmanager
def _npy(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, name: str):
    """One .npy entry opened, its header read: (file, shape, fortran_order, dtype). Whatever
    reading it raises, here or in the caller's block, is a CheckpointError naming it."""
    try:
        with archive.open(info) as fp:
            version = np.lib.format.read_magic(fp)
            if version not in ((1, 0), (2, 0)):
                raise CheckpointError(f"{path}: entry '{name}' is in .npy format version "
                                      f"{version} (graphopt writes 1.0)")
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(fp)
            yield fp, shape, fortran, dtype
    except CheckpointError:
        raise
    except _READ_ERRORS as e:
        raise CheckpointError(f"{path}: entry '{name}' is damaged or not a .npy array "
                              f"({e})") from None


def _data(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, name: str,
          dtype: DType | None) -> np.ndarray:
    """The array of one entry (its header checked already), exactly its header's bytes; a bf16
    one viewed as bf16 (`dtype`, what the metadata records)."""
    with _npy(archive, info, path, name) as (fp, shape, fortran, stored):
        size = stored.itemsize * math.prod(shape)
        data = fp.read(size)
        if len(data) != size:
            raise CheckpointError(f"{path}: entry '{name}' is truncated ({len(data)} of {size} "
                                  f"bytes of data)")
        if fp.read(1):  # also where zipfile checks the entry's CRC
            raise CheckpointError(f"{path}: entry '{name}' holds more data than its header's "
                                  f"{_describe(stored, shape)}")
        a = np.frombuffer(data, stored).reshape(shape, order="F" if fortran else "C")
    return a.view(dtype.np_dtype) if dtype == bf16 else a


# -- small helpers --------------------------------------------------------------------------------
def _path(path: Any, what: str) -> str:
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        raise CheckpointError(f"{what}: the path must be a str or an os.PathLike, got "
                              f"{type(path).__name__}") from None
    if not p:
        raise CheckpointError(f"{what}: the path is empty")
    return p


def _refuse_in_trace(what: str, path: str) -> None:
    if current_trace() is not None:
        raise CheckpointError(f"{what}({path!r}) inside a traced step (@jit): it would run "
                              f"once, while the step is traced, never when it runs; call "
                              f"{what} between steps, outside the jitted function")


@contextlib.contextmanager
def _open_regular(path: str):
    """The file at `path` opened for reading, if it is a regular file (never blocks on a FIFO
    or a device: it is opened without blocking, then checked)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be opened ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else \
                "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise CheckpointError(f"{path}: is {kind}, not a checkpoint file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def _graphopt_dtype(d: Any) -> DType | None:
    try:
        return to_dtype(d)
    except TypeError:
        return None


def _describe(dtype: Any, shape: tuple) -> str:
    d = dtype if isinstance(dtype, DType) else _graphopt_dtype(dtype)
    return str(TensorType(shape, d)) if d is not None else f"{np.dtype(dtype)}{list(shape)}"


__all__ = ["save", "load", "restore", "collect", "check_entries", "check_types"]
