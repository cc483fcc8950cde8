"""docs/optim.md lists every optimizer and schedule (its blocks are tests of their own)."""
import re
from pathlib import Path

from graphopt import optim

DOC = Path(__file__).parent.parent.parent / "docs" / "optim.md"


def test_every_optimizer_and_schedule_is_documented():
    text = DOC.read_text()
    for name in ["SGD", "Adagrad", "RMSprop", "Adam", "AdamW", "NAdam", "Adamax", "LAMB",
                 "Lion"]:
        assert f"`{name}(params" in text  # its row in the table
        assert re.search(rf"^\*\*.*\b{name}\b.*\*\*", text, flags=re.M)  # its update rule
    for name in optim.schedules.__all__[1:]:
        assert f"`{name}(" in text
