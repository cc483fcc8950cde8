"""DataParallel in real MPI jobs of 2 and 4 ranks, against one process that sees the whole
batch: after 10 steps every rank holds the same parameters, equal to the one process's to
the rounding of the reduction order (f64, so the tolerance is tight), and under ZeRO each
rank holds 1/N of the optimizer state (plus padding)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from support import needs_mpi, run_mpi
from test_data_parallel import SCRIPT, ddp

pytestmark = needs_mpi
STEPS = 10
CASES = {
    2: [f"{opt}:{zero}" for opt in sorted(ddp.OPTIMIZERS) for zero in (0, 1, 2)] +
       ["adamw:0:clip", "adamw:2:clip", "lamb:2:clip", "lazyadam:0:embed", "sgd:0:embed"],
    4: ["sgd:0", "adam:1", "adamw:2", "lamb:2", "adam:2:clip", "lazyadam:0:clip:embed"],
}
REFERENCE: dict[str, tuple] = {}


def reference(case: str):
    """The one process on the whole batch: parameters, losses, optimizer state bytes."""
    if case not in REFERENCE:
        opt, _, clip, embed = ddp.parse(case)
        params, optimizer, losses, _ = ddp.train(opt, STEPS, clip, embed=embed)
        REFERENCE[case] = ({k: p.numpy() for k, p in params.items()}, losses,
                           ddp.state_bytes(optimizer))
    return REFERENCE[case]


@pytest.fixture(scope="module", params=sorted(CASES))
def job(request):
    n = request.param
    result = run_mpi(n, SCRIPT, *CASES[n], "--steps", str(STEPS), timeout=600)
    assert result.returncode == 0, result.output
    return n, result


def test_every_rank_ends_where_one_process_does(job):
    n, result = job
    for case in CASES[n]:
        params, losses, _ = reference(case)
        ranks = [r[case] for r in result.results]
        for name, want in params.items():
            got = [np.array(r["params"][name]) for r in ranks]
            for i, g in enumerate(got[1:], 1):
                np.testing.assert_array_equal(g, got[0], err_msg=f"{case} {name}: rank {i} "
                                              f"differs from rank 0")
            np.testing.assert_allclose(got[0], want, rtol=1e-11, atol=1e-13,
                                       err_msg=f"{case} {name}")
        # each rank's loss is its slice's mean; their mean is the whole batch's
        np.testing.assert_allclose(np.mean([r["losses"] for r in ranks], axis=0), losses,
                                   rtol=1e-12, err_msg=case)


def test_zero_holds_a_shard_of_the_state(job):
    n, result = job
    for case in CASES[n]:
        _, _, whole = reference(case)
        held = [r[case]["state_bytes"] for r in result.results]
        for rank, r in enumerate(result.results):  # what the memory report says it holds
            report = r[case]["memory_report"]
            assert f"rank {rank} of {n}, zero={case.split(':')[1]}" in report, report
            assert re.search(rf"optimizer state +{held[rank]:,} B", report), report
        if case.split(":")[1] == "0":
            assert held == [whole] * n, (case, held)
        else:  # 1/N, plus under one element of padding per bucket and state tensor
            per_rank = whole / n
            assert all(per_rank <= h < per_rank + 6 * 2 * 8 for h in held), (case, held, whole)


def test_the_collectives_are_those_of_the_stage(job):
    n, result = job
    for case in CASES[n]:
        ops_run = set(result.results[0][case]["collectives"])
        _, stage, clip, embed = ddp.parse(case)
        if stage == 0:  # a row gradient: its rows all gathered
            assert ops_run == ({"all_reduce", "all_gather"} if embed else {"all_reduce"}), \
                (case, ops_run)
        elif not clip:  # zero 1 and 2: nothing but the optimizer reads a whole gradient
            assert "reduce_scatter" in ops_run and "all_reduce" not in ops_run, (case, ops_run)
        else:  # a clip changes the whole gradients: they are all_reduced
            assert {"all_reduce", "all_gather"} <= ops_run, (case, ops_run)


def test_the_example_trains_alike_on_one_and_four_ranks():
    """examples/train_ddp.py: the same losses on 4 ranks (zero=2) as alone, a quarter of the
    state on each rank."""
    example = SCRIPT.parents[3] / "examples" / "train_ddp.py"
    alone = run_mpi(1, example, "--steps", "20", via="python", results=False, timeout=300)
    four = run_mpi(4, example, "--zero", "2", "--steps", "20", via="mpi4py", results=False,
                   timeout=300)
    assert alone.returncode == 0 and four.returncode == 0, alone.output + four.output
    losses = [[float(x) for x in re.findall(r"^step +\d+ +loss ([\d.]+)$", job.stdout, re.M)]
              for job in (alone, four)]
    assert len(losses[0]) == 3 and np.allclose(losses[0], losses[1], atol=2e-4), losses
    states = re.search(r"state bytes per rank: \[([\d, ]+)\] \(one process: (\d+)\)",
                       four.stdout)
    held, whole = [int(x) for x in states.group(1).split(",")], int(states.group(2))
    assert len(held) == 4 and all(whole / 4 <= h < whole / 4 + 64 for h in held), states
    assert "reduce_scatter" in four.stdout and "bucket of" in four.stdout, four.stdout
