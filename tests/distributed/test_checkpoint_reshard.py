"""Checkpoints that reshard: a run saved at 4 ranks, loaded at 2, then 1 (this process),
then 4 again, under zero 0, 1 and 2 and stages that change between saves, continues the
trajectory of one process that never stopped (f64: to the rounding of the reduction order);
each rank's load reads exactly the bytes of the logical tensors its Parameters take. And a
save killed on one rank leaves the previous checkpoint loadable; damaged checkpoints and
saves that cannot be made are a CheckpointError on every rank, with nothing changed
(scripts/ckpt_faults.py)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from support import needs_mpi, run_mpi
from test_data_parallel import ddp

import graphopt as go
from graphopt.checkpoint import sharded

pytestmark = needs_mpi
SCRIPTS = Path(__file__).parent / "scripts"
STEPS = 3  # per stage
# Each case's optimizer:zero[:late] in each stage (4, 2, 1, 4 ranks).
CASES = {
    "z0": ["adam:0"] * 4,
    "z1": ["adam:1"] * 4,
    "z2": ["lamb:2", "lamb:2:late", "lamb:2", "lamb:2"],
    "mixed": ["adamw:1", "adamw:0", "adamw:2", "adamw:1:late"],
}
WORLDS = [4, 2, 1, 4]


def _reshard():
    """scripts/reshard.py, imported (it imports ddp_train beside it)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("reshard", SCRIPTS / "reshard.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


reshard = _reshard()


@pytest.fixture(scope="module")
def trip(tmp_path_factory):
    """Each stage's results: per rank, per case."""
    at = tmp_path_factory.mktemp("reshard")
    paths = [str(at / f"{{case}}.{i}.{'npz' if n == 1 else 'ckpt'}") for i, n in enumerate(WORLDS)]
    stages = []
    for i, n in enumerate(WORLDS):
        cases = [f"{name}={specs[i]}" for name, specs in CASES.items()]
        load, save = paths[i - 1] if i else None, paths[i] if i < 3 else None
        if n == 1:  # this process: the world of one
            stages.append([reshard.stage(cases, STEPS, load, save)])
            continue
        args = [*cases, "--steps", str(STEPS), "--block", "8"] + \
            (["--load", load] if load else []) + (["--save", save] if save else [])
        job = run_mpi(n, SCRIPTS / "reshard.py", *args, timeout=600)
        assert job.returncode == 0, job.output
        stages.append(job.results)
    return stages


def test_a_resharded_run_continues_the_uninterrupted_trajectory(trip):
    for name, specs in CASES.items():
        opt = specs[0].split(":")[0]
        params, _, losses, _ = ddp.train(opt, STEPS * len(WORLDS), False)
        for i, ranks in enumerate(trip):
            mean = np.mean([r[name]["losses"] for r in ranks], axis=0)
            np.testing.assert_allclose(mean, losses[i * STEPS:(i + 1) * STEPS], rtol=1e-11,
                                       err_msg=f"{name}, stage {i} ({WORLDS[i]} ranks)")
        last = trip[-1]
        for k, p in params.items():
            got = [np.array(r[name]["params"][k]) for r in last]
            for rank, g in enumerate(got[1:], 1):
                np.testing.assert_array_equal(g, got[0], err_msg=f"{name} {k}: rank {rank}")
            np.testing.assert_allclose(got[0], p.numpy(), rtol=1e-11, atol=1e-13,
                                       err_msg=f"{name} {k}")


def test_each_rank_reads_only_what_its_parameters_take(trip):
    """From a sharded checkpoint (stages 2 and 3), with a CRC-32 per element: the bytes read
    are exactly those of the parts taken; under ZeRO with the shards made before the load,
    the ranks' state parts add up to the state once."""
    weights = sum(np.array(v).nbytes for v in trip[0][0]["z1"]["params"].values())
    for i in (1, 2):
        for name in CASES:
            for r in trip[i]:
                assert r[name]["read"] == r[name]["needed"], (i, name, r[name])
        whole = trip[i][0]["z0"]["needed"]  # every rank: weights, scalars, Adam's 2 states
        replicated = whole - 2 * weights
        n = len(trip[i])
        assert sum(r["z1"]["needed"] for r in trip[i]) == n * replicated + 2 * weights, i


def _fault_job(tmp_path, kill: str, *more: str):
    job = run_mpi(2, SCRIPTS / "ckpt_faults.py", str(tmp_path), kill, *more, timeout=300)
    assert job.returncode != 0 and "the save was not killed" not in job.stdout, job.output
    assert all(r is not None for r in job.results), job.output
    for rank, r in enumerate(job.results):
        assert not r["failures"], (rank, r["failures"])
    return job.results


def _loads_as_saved(path: Path, saved: dict) -> None:
    """The checkpoint loads in this process (zero=0) and holds what the ranks saved."""
    params = ddp.init(np.float64)
    opt = ddp.OPTIMIZERS["adam"](params)
    go.load(path, params, opt)
    assert int(opt.step_count.numpy()) == saved["step"]
    for k, p in params.items():
        np.testing.assert_array_equal(p.numpy(), np.array(saved["weights"][k]), err_msg=k)


@pytest.mark.parametrize("kill", ["write", "commit"])
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path, kill):
    """Rank 1 killed once its data file is written, or rank 0 as it commits the manifest:
    the previous checkpoint loads, whole. (With `write`, also every check of a damaged
    checkpoint and of a save that must fail.)"""
    results = _fault_job(tmp_path, kill, *(["checks"] if kill == "write" else []))
    if kill == "write":
        assert results[0]["checks"] > 15
        odd, want = reshard.odd_parameters(), reshard.odd_parameters()
        for p in odd:
            go.assign(p, np.ones(p.shape, p.numpy().dtype))
        go.load(tmp_path / "odd.ckpt", odd)  # in this process, as 2 ranks saved them
        for p, q in zip(odd, want):
            assert p.numpy().dtype == q.numpy().dtype and np.array_equal(p.numpy(), q.numpy())
    good = tmp_path / "good.ckpt"
    _loads_as_saved(good, results[0])
    manifest = json.loads((good / sharded.MANIFEST).read_text())
    left = sorted(e.name for e in good.iterdir()
                  if e.name not in (sharded.MANIFEST, manifest["data"]))
    assert len(left) == (1 if kill == "write" else 2), left  # the killed save's, for the next

