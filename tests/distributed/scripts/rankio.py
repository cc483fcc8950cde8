"""What the rank scripts share: the results directory (their first argument, given by
tests/support.py's run_mpi), a list of checks that records failures instead of stopping at
the first, and each rank's result file (`<dir>/rank<R>.json`)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

OUT = Path(sys.argv[1])
ARGS = sys.argv[2:]


class Checks:
    """Checks of one rank: each one counted, each failure kept with what was seen."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def check(self, name: str, ok: bool, seen: Any = "") -> bool:
        self.count += 1
        if not ok:
            self.failures.append(f"{name}: {seen}")
        return ok

    def same(self, name: str, got: np.ndarray, want: np.ndarray) -> bool:
        """The same dtype, shape and values (NaNs equal)."""
        ok = isinstance(got, np.ndarray) and got.dtype == want.dtype and \
            got.shape == want.shape and np.array_equal(got.astype(np.float64),
                                                       want.astype(np.float64), equal_nan=True)
        return self.check(name, ok, f"got {got!r}, want {want!r}")

    def raises(self, name: str, kind: type[BaseException], fn: Callable[[], Any],
               *parts: str) -> str:
        """fn() raises `kind` with each of `parts` in its message; the message ('' if not)."""
        try:
            fn()
        except kind as e:
            missing = [p for p in parts if p not in str(e)]
            self.check(name, not missing, f"{str(e)!r} lacks {missing}")
            return str(e)
        except Exception as e:
            self.check(name, False, f"raised {type(e).__name__}: {e}")
            return ""
        self.check(name, False, f"raised nothing, expected {kind.__name__}")
        return ""


def save(rank: int, result: dict[str, Any]) -> None:
    """Write this rank's result (JSON), whole or not at all."""
    path = OUT / f"rank{rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(result))
    os.replace(path.with_suffix(".tmp"), path)
