"""What the checkpoint fault modules share: a run with every kind of state, a snapshot of all
its Parameters' bytes, the fixtures `good` (a checkpoint) and `run` (a run to load it into),
and the pieces of an .npz written by hand (entries, metadata)."""
import io
import json
import zipfile

import ml_dtypes
import numpy as np
import pytest

import graphopt as go
from graphopt import amp, optim

BF16 = np.dtype(ml_dtypes.bfloat16)


class Run:
    """f32 and bf16 weights (an f32 master), Adam with amsgrad, accumulation, a dynamic loss
    scale: 16 Parameters of every dtype a checkpoint holds (f32, bf16, f64, i64)."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.params = [go.Parameter(rng.standard_normal((3, 4)).astype(np.float32), name="fc.w"),
                       go.Parameter(rng.standard_normal(4).astype(BF16), name="fc.b")]
        self.opt = optim.Adam(self.params, lr=1e-2, amsgrad=True)
        self.acc = optim.Accumulate(self.opt, steps=2)
        self.scaler = amp.DynamicLossScaler(init_scale=8.0, growth_interval=5)
        self.step = go.jit(lambda gs: self.scaler.step(self.acc, gs), backend="interpreter")

    @property
    def objects(self):
        return (self.acc, self.scaler)

    def all_parameters(self):
        return go.checkpoint.collect(self.params, *self.objects)

    def train(self, n, seed=1):
        rng = np.random.default_rng(seed)
        for _ in range(n):
            self.step([rng.standard_normal(p.shape).astype(p.dtype.np_dtype) * 8
                       for p in self.params])

    def snapshot(self):
        return {p.name: p.numpy().tobytes() for p in self.all_parameters()}

    def assert_unchanged(self, snapshot):
        now = self.snapshot()
        changed = [name for name in snapshot if now[name] != snapshot[name]]
        assert not changed, f"changed by a failed load: {changed}"

    def load(self, path):
        go.load(path, self.params, *self.objects)

    def save(self, path):
        go.save(path, self.params, *self.objects)


@pytest.fixture
def good(tmp_path):
    """A checkpoint of a run 3 steps in (seed 0)."""
    saved = Run(seed=0)
    saved.train(3)
    path = tmp_path / "good.npz"
    saved.save(path)
    return path


@pytest.fixture
def run():
    """Another run (seed 5, 2 other steps): what a checkpoint is loaded into."""
    r = Run(seed=5)
    r.train(2, seed=7)
    return r


def npy(a, version=None):
    """The bytes of one .npy entry."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(a), version=version, allow_pickle=True)
    return buf.getvalue()


def entries_of(path):
    """A checkpoint's entries: [(file name in the zip, bytes)], in order."""
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def write_zip(path, entries, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name) if isinstance(name, str) else name, data)
    return path


def metadata(path):
    """The checkpoint's metadata, as a dict."""
    return json.loads(str(np.load(path)["__graphopt__"]))


def with_entries(good, out, replace=None, drop=(), add=(), meta=None):
    """A copy of the checkpoint `good` at `out` with entries replaced ({name: bytes}), dropped
    (names), added ([(file name, bytes)]), or the metadata replaced (a JSON-able object, or a
    str written as it is)."""
    replace = dict(replace or {})
    if meta is not None:
        text = meta if isinstance(meta, str) else json.dumps(meta)
        replace["__graphopt__"] = npy(np.array(text))
    entries = [(n, replace.get(n[:-4], d)) for n, d in entries_of(good) if n[:-4] not in drop]
    return write_zip(out, entries + list(add))
