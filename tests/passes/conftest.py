"""Collect every `.gir` file under tests/passes as a test (see girtest.py for the format)."""
from __future__ import annotations

from pathlib import Path

import pytest

from girtest import GirFailure, run_file

HERE = Path(__file__).parent


def pytest_collect_file(parent, file_path: Path):
    if file_path.suffix == ".gir" and HERE in file_path.parents:
        return GirFile.from_parent(parent, path=file_path)
    return None


class GirFile(pytest.File):
    def collect(self):
        yield GirItem.from_parent(self, name=self.path.stem)


class GirItem(pytest.Item):
    def runtest(self) -> None:
        run_file(self.path)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, GirFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"{self.path.parent.name}/{self.path.name}"
