import os
import tempfile

import numpy as np
import pytest

# Compiled kernels go to a cache of this test run, not to the user's ~/.cache/graphopt;
# subprocesses started by tests inherit it.
os.environ.setdefault("GRAPHOPT_CACHE_DIR", tempfile.mkdtemp(prefix="graphopt-test-cache-"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def reference_backend(monkeypatch):
    """jit uses the numpy interpreter: for tests that compare with numpy bit for bit (the
    llvm backend's exp, log and pow come from the C library, its sums are blocked; tests of
    it are in test_llvm.py, with stated tolerances)."""
    monkeypatch.setenv("GRAPHOPT_BACKEND", "interpreter")
