
import numpy as np
import pytest



@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def reference_backend(monkeypatch):
    """jit uses the numpy interpreter: for tests that compare with numpy bit for bit (the
    llvm backend's exp, log and tanh are its own, pow comes from the C library, its sums are
    blocked; tests of it are in test_llvm.py and test_mathfns.py, with stated tolerances)."""
    monkeypatch.setenv("GRAPHOPT_BACKEND", "interpreter")


# -- CPU levels: the LLVM differential tests run for each (the `cpu_level` fixture) ----------
from support import CPU_LEVELS  # noqa: E402  (one list, also for tests that loop over it)
_levels_seen: dict[str, str] = {}  # level -> "ran", or why it was skipped


@pytest.fixture(params=CPU_LEVELS)
def cpu_level(request):
    """GRAPHOPT_CPU for the test; a level this host cannot run is skipped, saying why."""
    from graphopt import envvars
    from graphopt.backends.llvm.target import selected
    from graphopt.errors import TargetError
    with envvars.override(GRAPHOPT_CPU=request.param):
        try:
            target = selected()
        except TargetError as e:
            _levels_seen[request.param] = f"skipped: {e}"
            pytest.skip(str(e))
        _levels_seen.setdefault(request.param, f"ran ({target})")
        yield request.param


def pytest_terminal_summary(terminalreporter):
    if _levels_seen:
        terminalreporter.section("CPU levels of the LLVM tests")
        for level in CPU_LEVELS:
            terminalreporter.line(f"GRAPHOPT_CPU={level}: {_levels_seen.get(level, 'not run')}")
