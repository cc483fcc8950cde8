"""Data-parallel steps that fail on one rank: an error on every rank, no hang, and every
Parameter unchanged everywhere (scripts/ddp_failures.py)."""
from __future__ import annotations

from pathlib import Path

from support import needs_mpi, run_mpi

pytestmark = needs_mpi
SCRIPT = Path(__file__).parent / "scripts" / "ddp_failures.py"


def test_ranks_that_compiled_different_steps_all_refuse_to_run():
    """Rank 1 traced another batch size: before any collective of the step, every rank
    raises the same CollectiveError, saying who differs and how; nothing changed."""
    job = run_mpi(3, SCRIPT, "mismatch", timeout=120)
    assert job.returncode == 0, job.output
    messages = {r["message"] for r in job.results}
    assert all(r["error"] == "CollectiveError" and r["unchanged"] for r in job.results), \
        job.results
    assert len(messages) == 1, messages
    (message,) = messages
    assert "rank 1" in message and "i64[6]" in message and "i64[4]" in message, message


def test_a_step_that_fails_on_one_rank_changes_nothing_anywhere():
    """Rank 1's step fails before its first collective; rank 0 waits for it in the
    gradient all_reduce until the timeout. Each raises, and no rank changed a Parameter."""
    job = run_mpi(2, SCRIPT, "raise", timeout=120, env={"GRAPHOPT_TEST_TIMEOUT": "3"})
    errors = [r and r["error"] for r in job.results]
    assert errors == ["CollectiveTimeout", "ExecutionError"], (errors, job.output)
    assert all(r["unchanged"] for r in job.results), job.results
    assert "gather failed" in job.results[1]["message"], job.results
