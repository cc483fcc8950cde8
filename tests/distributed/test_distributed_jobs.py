"""graphopt.distributed in real MPI jobs (mpiexec, 1, 2 and 4 ranks on this machine): every
collective against numpy, the watchdog, check_same, and what happens when a rank fails. Each
launch costs about a second, so each job runs many checks (scripts/checks.py) and reports
them; the failure jobs each test one way to fail."""
import re
from pathlib import Path

import pytest

from support import needs_mpi, run_mpi

pytestmark = needs_mpi
SCRIPTS = Path(__file__).parent / "scripts"
# Generous: another test run may share the machine's two cores.
ENDS_WITHIN = 60.0  # seconds from a failure to the end of the job (measured: 1 to 2; 20 s
# was passed at a load average of 9), well short of the collective timeout (300 s)


@pytest.mark.parametrize("n, via", [(1, "python"), (2, "mpiexec"), (4, "mpi4py")],
                         ids=["1-python", "2-mpiexec", "4-mpi4py"])
def test_a_healthy_job(n, via):
    """init (twice, with and without mpi4py), the world's size and rank, every collective
    against numpy over every dtype (sum and max), refusals that leave the communicator
    usable, a timeout that breaks it, check_same, an exception in a thread."""
    job = run_mpi(n, SCRIPTS / "checks.py", str(n), via=via)
    assert job.returncode == 0, job.output
    assert all(job.results), job.output
    for r, result in enumerate(job.results):
        assert (result["rank"], result["size"]) == (r, n)
        assert result["checks"] > 200 and not result["failures"], result["failures"]
    if n > 1:
        # check_same raised on every rank, the same error.
        assert all(res["errors"] == job.results[0]["errors"] for res in job.results)
        assert set(job.results[0]["errors"]) == {"shape", "ops", "text"}
        # The thread's traceback, marked with each rank; the job went on.
        for r in range(n):
            assert f"[rank {r}] Exception in thread failing-worker:" in job.stderr, job.output
            assert f"[rank {r}] ZeroDivisionError: division by zero" in job.stderr
    else:
        assert "[rank" not in job.stderr  # one process: Python's own hooks
        assert "Exception in thread failing-worker" in job.stderr


def _failed_job(n: int, mode: str, via: str = "mpiexec", **env: str):
    job = run_mpi(n, SCRIPTS / "fail.py", mode, via=via, env=env)
    assert job.returncode != 0, job.output
    assert "reached the end" not in job.stdout, job.output
    assert job.results[1] is not None, job.output
    took = job.ended_at - job.results[1]["failed_at"]
    return job, took


@pytest.mark.parametrize("n, via", [(2, "mpiexec"), (4, "mpi4py")])
def test_an_exception_on_one_rank_aborts_the_job(n, via):
    """Without init's hook a plain mpiexec job whose rank raises never ends (test_harness);
    with it, the rank's traceback is printed, marked with its rank, and the job ends."""
    job, took = _failed_job(n, "raise", via)
    assert took < ENDS_WITHIN, (took, job.output)
    for line in ["[rank 1] Traceback (most recent call last):",
                 "[rank 1] RuntimeError: rank 1 gives up",
                 f"[rank 1] graphopt.distributed: uncaught RuntimeError on rank 1: aborting "
                 f"all {n} ranks"]:
        assert line in job.stderr.splitlines(), job.output


def test_a_killed_rank_ends_the_job():
    """MPICH's mpiexec sees a rank killed by a signal and ends the job."""
    job, took = _failed_job(2, "kill")
    assert took < ENDS_WITHIN, (took, job.output)


def test_a_stuck_rank_is_a_timeout_on_the_others_then_the_end():
    job, took = _failed_job(4, "stuck", GRAPHOPT_COLLECTIVE_TIMEOUT="3")
    assert 3 <= took < 3 + ENDS_WITHIN, (took, job.output)
    said = re.findall(r"^\[rank (\d)\] graphopt\.errors\.CollectiveTimeout: rank (\d): "
                      r"all_reduce of f32\[1000\] waited 3\.\d s for the other ranks "
                      r"\(GRAPHOPT_COLLECTIVE_TIMEOUT=3\): a rank is lost, stuck, or running "
                      r"a different step$", job.stderr, re.M)
    assert said and all(a == b != "1" for a, b in said), job.output
