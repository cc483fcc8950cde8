"""docs/optim.md: its quick start runs as it is, and it lists every optimizer."""
import re
from pathlib import Path

from graphopt import optim

DOC = Path(__file__).parent.parent.parent / "docs" / "optim.md"


def test_quick_start_runs(capsys):
    first = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    exec(compile(first, "optim.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "1"


def test_every_optimizer_and_schedule_is_documented():
    text = DOC.read_text()
    for name in ["SGD", "Adagrad", "RMSprop", "Adam", "AdamW", "NAdam", "Adamax", "LAMB",
                 "Lion"]:
        assert f"`{name}(params" in text  # its row in the table
        assert re.search(rf"^\*\*.*\b{name}\b.*\*\*", text, flags=re.M)  # its update rule
    for name in optim.schedules.__all__[1:]:
        assert f"`{name}(" in text
