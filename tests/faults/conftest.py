"""tests/faults: one module per family of bad input or fault; each case must end in a clear
GraphoptError (or the documented result), never a crash, a hang, a raw traceback or a
half-done step. Cases where a crash or a hang is possible run in a child process."""
import os
import subprocess
import sys
import textwrap

import pytest


class Child:
    """A Python script run in a child process, with a timeout: a crash is a negative exit
    status, a hang a timeout, and neither takes the test run down."""

    def __init__(self, tmp_path):
        self.env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"))

    def run(self, script: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                                  env={**self.env, **env}, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the child hung for {timeout} s:\n{e.stdout}\n{e.stderr}")


@pytest.fixture
def child(tmp_path):
    return Child(tmp_path)
