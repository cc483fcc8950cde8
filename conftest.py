"""Test set-up for the whole checkout: the kernel cache of a test run, and the pages as tests."""
import os
import tempfile

# Compiled kernels go to a cache of this test run, not to the user's ~/.cache/graphopt;
# subprocesses started by tests (and by the pages' console blocks) inherit it.
os.environ.setdefault("GRAPHOPT_CACHE_DIR", tempfile.mkdtemp(prefix="graphopt-test-cache-"))

from tests.docblocks import DOCS  # noqa: E402  (after the cache is chosen)

# Every fenced block of README.md and docs/*.md is a test item (tests/docblocks.py).
pytest_collect_file = DOCS.pytest()
