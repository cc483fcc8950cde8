"""A slice of the differential fuzzing campaign (benchmarks/fuzz.py): a few hundred small
random programs, each run eagerly, on the interpreter and on the LLVM backend at every CPU
level this host runs, on two worker processes. No program may differ from the interpreter
beyond what docs/llvm.md allows, and none may crash.

The slice steers clear of the bugs listed in fuzz.KNOWN_BUGS (each has a strict-xfail test of
its own in test_fuzz_regressions.py); the full campaign (`python benchmarks/fuzz.py`) does not.
A failure names the seeds: `python benchmarks/fuzz.py --replay SEED` prints the program.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import fuzz  # noqa: E402

PROGRAMS = 200
FIRST_SEED = 1_000_000  # apart from the campaign's seeds (0, 1, ...)


@pytest.fixture(scope="module")
def levels():
    probed = fuzz.probe(list(fuzz.DEFAULT_LEVELS), None)
    ran = [lv for lv in fuzz.DEFAULT_LEVELS if not probed[lv]["skipped"]]
    assert "host" in ran, probed
    return ran


def test_generated_programs_are_python_and_deterministic():
    """Every program is Python (the campaign's first 2,000 too), the same for the same seed."""
    for small, seeds in ((True, range(FIRST_SEED, FIRST_SEED + 500)), (False, range(2000))):
        for seed in seeds:
            a = fuzz.generate(seed, small=small)
            compile(a.source, f"program {seed}", "exec")
            if seed % 50 == 0:
                assert fuzz.generate(seed, small=small).source == a.source
                compile(fuzz.standalone(a), f"program {seed}", "exec")


def test_a_slice_of_random_programs_agrees_in_every_mode(levels):
    avoid = frozenset(fuzz.KNOWN_BUGS)
    results = fuzz.campaign(list(range(FIRST_SEED, FIRST_SEED + PROGRAMS)), levels, workers=2,
                            avoid=avoid, small=True)  # (no disk cache: see fuzz.worker_main)
    assert len(results) == PROGRAMS
    bad = [r for r in results if r["status"] in ("mismatch", "crash")]
    message = "\n".join(f"seed {r['seed']} ({r['status']}): {r['problems'][0] if r['problems'] else ''}"
                        for r in bad)
    assert not bad, f"{len(bad)} of {PROGRAMS} programs failed (replay one with " \
                    f"`python benchmarks/fuzz.py --replay SEED --small`):\n{message}"
    ran = sum(r["status"] == "ok" for r in results)
    assert ran >= PROGRAMS * 0.8  # most programs are valid and really run
    assert set(results[0]["modes"]) == set(fuzz.modes_for(levels))


def test_the_harness_sees_a_difference_and_a_native_crash(tmp_path):
    """The comparison catches one flipped bit; a worker that dies is a crash, not a hang."""
    import numpy as np
    want = np.array([1.0, 2.0, np.nan], np.float32)
    got = want.copy()
    assert not fuzz.differ(got, want, None).any()  # NaN equals NaN
    got.view(np.uint32)[1] ^= 1
    assert fuzz.differ(got, want, None).tolist() == [False, True, False]
    assert not fuzz.differ(got, want, 1e-6).any()
    assert fuzz.differ(np.array([0.0]), np.array([-0.0]), None).all()  # the sign of zero
    results = fuzz.campaign([-1], ["host"], workers=1, cache_dir=str(tmp_path))
    assert results[0]["status"] == "crash" and "SIGSEGV" in results[0]["problems"][0]
