import pytest

# The optimizers are checked against reference formulas bit for bit, on the reference backend;
# tests/test_llvm.py runs them on the llvm backend with stated tolerances.


@pytest.fixture(autouse=True)
def _reference(reference_backend):
    yield
