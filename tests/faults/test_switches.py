"""Family 7: one parser for switches.

`GRAPHOPT_CACHE_MAX_BYTES=` (empty) and `GRAPHOPT_THREADS=abc`, `1.5`, `0x2` raised raw
IndexError or ValueError. Every GRAPHOPT_* switch is now parsed in one place, by the parser in
its row of graphopt/envvars.py's table: an empty value is the default, and a value the switch
does not take is a SwitchError (a GraphoptError) naming the switch, the value, where it was
set and what the switch takes, wherever the switch is read; valid values mean what they meant.

Parsing itself cannot crash or hang, so every bad value is parsed in this process; steps run
under the bad values in a child process with a timeout, one per switch (a wrong thread count,
say, could leave a step's threads waiting for each other forever).
"""
import os
import re
from pathlib import Path

import pytest

from graphopt import envvars
from graphopt.errors import GraphoptError, SwitchError

GRAPHOPT = Path(envvars.__file__).parent
CORES = os.cpu_count() or 1

# Values each switch does not take (GRAPHOPT_CPU and _CPU_FEATURES are LLVM's to judge: below).
BAD = {
    "GRAPHOPT_CACHE": ["maybe", "2", "-", "offf"],
    "GRAPHOPT_CACHE_DIR": ["/tmp/a\0b"],  # only settable in code: environ holds no NUL
    "GRAPHOPT_CACHE_MAX_BYTES": ["lots", "-1", "nan", "inf", "1e3", "M", "12 parsecs", "0x10",
                                 "\u0661\u0660"],  # Arabic-Indic 10: not ASCII digits
    "GRAPHOPT_LOG": ["cahce", "cache,everything", "CACHE;"],
    "GRAPHOPT_BACKEND": ["gpu", "numpy", "llvm,interpreter"],
    "GRAPHOPT_THREADS": ["abc", "1.5", "0x2", "0", "-2", "+2", "1_000", "2 threads",
                         "\u0663"],
    "GRAPHOPT_VERIFY": ["every", "1", "last,each"],
    "GRAPHOPT_DEBUG": ["verbose", "2"],
    "GRAPHOPT_COLLECTIVE_TIMEOUT": ["0", "-5", "0.0", "inf", "nan", "1e3", "5s", "five",
                                    "\u0665"],  # Arabic-Indic 5: not ASCII digits
}
CASES = [(name, value) for name, values in BAD.items() for value in values]


def _id(case) -> str:
    return f"{case[0]}={case[1]!r}"


@pytest.fixture(autouse=True)
def clean_switches(monkeypatch):
    for name in envvars.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield
    for name in envvars.VARIABLES:
        envvars.set_var(name, None)


def _check_message(e: SwitchError, name: str, value: str, where: str) -> None:
    assert isinstance(e, GraphoptError) and isinstance(e, ValueError)
    text = str(e)
    assert text.startswith(f"{name}={value!r} ({where}): "), text
    assert f"expected {envvars.VARIABLES[name].allowed}" in text
    assert (e.name, e.value) == (name, value)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_bad_value_is_a_switch_error(case, monkeypatch):
    name, value = case
    if "\0" not in value:
        monkeypatch.setenv(name, value)
        with pytest.raises(SwitchError) as info:
            envvars.value(name)
        _check_message(info.value, name, value, "from the environment")
        with pytest.raises(SwitchError):
            envvars.check()  # what the graphopt command asks before anything
        monkeypatch.delenv(name)
    # Set in code: refused at once, and nothing is set.
    before = envvars.get(name)
    with pytest.raises(SwitchError) as info:
        envvars.set_var(name, value)
    _check_message(info.value, name, value, "set in code")
    assert envvars.get(name) == before
    good = ("GRAPHOPT_BACKEND", "interpreter") if name != "GRAPHOPT_BACKEND" else \
        ("GRAPHOPT_VERIFY", "each")
    with pytest.raises(SwitchError):  # all or nothing: the good one is not left set either
        with envvars.override(**{good[0]: good[1], name: value}):
            pass
    assert envvars.get(good[0]) == envvars.VARIABLES[good[0]].default
    assert envvars.get(name) == before


def test_the_values_of_the_issue_say_what_is_allowed(monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_MAX_BYTES", "")  # empty: the default, as if unset
    assert envvars.cache_max_bytes() == 512 << 20
    for value in ("abc", "1.5", "0x2"):
        monkeypatch.setenv("GRAPHOPT_THREADS", value)
        with pytest.raises(SwitchError, match=f"GRAPHOPT_THREADS='{re.escape(value)}' .*: "
                                              f"expected a whole number of threads, 1 or more"):
            envvars.threads()
    monkeypatch.setenv("GRAPHOPT_LOG", "cache,cahce")
    with pytest.raises(SwitchError, match="unknown topic cahce; expected .*topics: cache"):
        envvars.log_topics()


# What valid values meant before, and still mean: (switch, value, its function, the result).
GOOD = [
    ("GRAPHOPT_CACHE", v, envvars.cache_enabled, True) for v in ("1", "true", "Yes", "ON", "")
] + [
    ("GRAPHOPT_CACHE", v, envvars.cache_enabled, False) for v in ("0", "false", "No", " off ")
] + [
    ("GRAPHOPT_CACHE_DIR", "/some/where", envvars.cache_dir, Path("/some/where")),
    ("GRAPHOPT_CACHE_DIR", "~/x", envvars.cache_dir, Path.home() / "x"),
    ("GRAPHOPT_CACHE_MAX_BYTES", "1024", envvars.cache_max_bytes, 1024),
    ("GRAPHOPT_CACHE_MAX_BYTES", "64M", envvars.cache_max_bytes, 64 << 20),
    ("GRAPHOPT_CACHE_MAX_BYTES", "2G", envvars.cache_max_bytes, 2 << 30),
    ("GRAPHOPT_CACHE_MAX_BYTES", "512MiB", envvars.cache_max_bytes, 512 << 20),
    ("GRAPHOPT_CACHE_MAX_BYTES", "1.5k", envvars.cache_max_bytes, 1536),
    ("GRAPHOPT_CACHE_MAX_BYTES", " 100B ", envvars.cache_max_bytes, 100),
    ("GRAPHOPT_CACHE_MAX_BYTES", "0", envvars.cache_max_bytes, 0),
    ("GRAPHOPT_CACHE_MAX_BYTES", "", envvars.cache_max_bytes, 512 << 20),
    ("GRAPHOPT_LOG", "cache", envvars.log_topics, frozenset({"cache"})),
    ("GRAPHOPT_LOG", " Cache , ", envvars.log_topics, frozenset({"cache"})),
    ("GRAPHOPT_LOG", "", envvars.log_topics, frozenset()),
    ("GRAPHOPT_BACKEND", "interpreter", envvars.backend, "interpreter"),
    ("GRAPHOPT_BACKEND", " LLVM ", envvars.backend, "llvm"),
    ("GRAPHOPT_BACKEND", "", envvars.backend, "llvm"),
    ("GRAPHOPT_THREADS", "1", envvars.threads, 1),
    ("GRAPHOPT_THREADS", " 2 ", envvars.threads, min(2, CORES)),
    ("GRAPHOPT_THREADS", str(CORES + 3), envvars.threads, CORES),  # at most the cores
    ("GRAPHOPT_THREADS", "", envvars.threads, CORES),
    ("GRAPHOPT_VERIFY", "each", envvars.verify_each, True),
    ("GRAPHOPT_VERIFY", "EACH", envvars.verify_each, True),
    ("GRAPHOPT_VERIFY", "last", envvars.verify_each, False),
    ("GRAPHOPT_VERIFY", "", envvars.verify_each, False),
    ("GRAPHOPT_CPU", "", envvars.cpu, "host"),
    ("GRAPHOPT_CPU", " x86-64-v3 ", envvars.cpu, "x86-64-v3"),
    ("GRAPHOPT_CPU_FEATURES", "+avx2, ,-fma,", envvars.cpu_features, "+avx2,-fma"),
    ("GRAPHOPT_CPU_FEATURES", "", envvars.cpu_features, ""),
    ("GRAPHOPT_DEBUG", "1", envvars.debug, True),
    ("GRAPHOPT_DEBUG", "", envvars.debug, False),
    ("GRAPHOPT_COLLECTIVE_TIMEOUT", "", envvars.collective_timeout, 300.0),
    ("GRAPHOPT_COLLECTIVE_TIMEOUT", " 30 ", envvars.collective_timeout, 30.0),
    ("GRAPHOPT_COLLECTIVE_TIMEOUT", "0.5", envvars.collective_timeout, 0.5),
    ("GRAPHOPT_COLLECTIVE_TIMEOUT", ".25", envvars.collective_timeout, 0.25),
]


@pytest.mark.parametrize("name, value, read, expected", GOOD,
                         ids=[f"{n}={v!r}" for n, v, _, _ in GOOD])
def test_valid_values_keep_their_meaning(name, value, read, expected, monkeypatch):
    monkeypatch.setenv(name, value)
    assert read() == expected
    monkeypatch.delenv(name)
    with envvars.override(**{name: value}):  # the same when set in code
        assert read() == expected


def test_every_switch_is_declared_once_with_its_parser():
    """Every GRAPHOPT_* name in graphopt's code is a row of the table, with a parser and what
    it takes; none is read from os.environ anywhere but envvars.py; the choices in the
    table are the backends and log topics that exist."""
    from graphopt.backends import BACKENDS
    for var in envvars.VARIABLES.values():
        assert callable(var.parse) and var.allowed and var.doc
        var.parse(var.default)  # every default is a value its switch takes
    named, topics = set(), set()
    for path in GRAPHOPT.rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"\bGRAPHOPT_[A-Z][A-Z_]*[A-Z]\b", text))
        topics |= set(re.findall(r"topic_logger\(\"(\w+)\"\)", text))
        if path.name != "envvars.py":
            assert not re.search(r"environ[^\n]*GRAPHOPT_|getenv\(\s*[\"']GRAPHOPT_", text), path
    assert named <= set(envvars.VARIABLES), named - set(envvars.VARIABLES)
    assert set(envvars.BACKENDS) == set(BACKENDS)
    assert topics and topics <= set(envvars.TOPICS)


# --------------------------------------------------------------------------- in a step

STEP = """
import os, sys
import numpy as np, graphopt as go
from graphopt.errors import GraphoptError
for setting in sys.argv[1:]:  # NAME=VALUE, one after another
    name, value = setting.split("=", 1)
    os.environ[name] = value
    w = go.Parameter(np.ones(4, np.float32), name="w")
    try:
        go.jit(lambda g: go.assign(w, w - g))(np.ones(4, np.float32))
        print("ran", flush=True)
    except GraphoptError as e:
        print(type(e).__name__, e, flush=True)
    print("w", w.numpy().tolist(), flush=True)  # a refused step changed nothing
    del os.environ[name]
"""


def _run_steps(child, settings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Run STEP in a child under each NAME=VALUE in turn: what it said and w after, for each
    (a hang fails with what the child printed so far, which names the value)."""
    run = child.run(f"import sys; sys.argv[1:] = {[f'{n}={v}' for n, v in settings]!r}\n" +
                    STEP, timeout=90)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2 * len(settings), run.stdout
    return list(zip(lines[::2], lines[1::2]))


# (A step without collectives never reads GRAPHOPT_COLLECTIVE_TIMEOUT: tests/distributed.)
@pytest.mark.parametrize("name", [n for n in BAD if n not in ("GRAPHOPT_CACHE_DIR",
                                                              "GRAPHOPT_COLLECTIVE_TIMEOUT")])
def test_a_step_under_each_bad_value(child, name):
    for value, (said, w) in zip(BAD[name], _run_steps(child, [(name, v) for v in BAD[name]])):
        if name == "GRAPHOPT_DEBUG":  # the graphopt command's switch: a step does not read it
            assert said == "ran" and w == "w [0.0, 0.0, 0.0, 0.0]"
            continue
        assert said.startswith(f"SwitchError {name}={value!r} (from the environment): "), said
        assert f"expected {envvars.VARIABLES[name].allowed}" in said
        assert w == "w [1.0, 1.0, 1.0, 1.0]"


def test_a_step_under_a_target_llvm_does_not_know(child):
    """GRAPHOPT_CPU and GRAPHOPT_CPU_FEATURES are parsed as text; backends/llvm/target.py asks
    LLVM whether they exist: a TargetError naming the switch, before any code is loaded."""
    cases = [("GRAPHOPT_CPU", "not-a-cpu", "GRAPHOPT_CPU=not-a-cpu: LLVM does not know it"),
             ("GRAPHOPT_CPU_FEATURES", "+nosuchfeature", "GRAPHOPT_CPU_FEATURES=+nosuchfeature"),
             ("GRAPHOPT_CPU_FEATURES", "avx2", "'avx2' is not a feature flag")]
    results = _run_steps(child, [(n, v) for n, v, _ in cases])
    for (_, _, says), (said, w) in zip(cases, results):
        assert said.startswith("TargetError ") and says in said, said
        assert w == "w [1.0, 1.0, 1.0, 1.0]"


def test_a_switch_read_per_call_follows_os_environ(monkeypatch):
    """envvars reads a step's switches (the threads, the target) from os.environ's own
    store: set, changed, removed, a non-ASCII value, and an os.environ replaced by another
    mapping are all seen as os.environ.get sees them."""
    assert envvars.get("GRAPHOPT_CPU") == "host"
    monkeypatch.setenv("GRAPHOPT_CPU", "x86-64-v3")
    assert envvars.get("GRAPHOPT_CPU") == "x86-64-v3"
    monkeypatch.setenv("GRAPHOPT_THREADS", "1")
    assert envvars.threads() == 1
    os.environ["GRAPHOPT_CPU_FEATURES"] = "+avx2,\u00e9"
    assert envvars.get("GRAPHOPT_CPU_FEATURES") == os.environ.get("GRAPHOPT_CPU_FEATURES")
    del os.environ["GRAPHOPT_CPU_FEATURES"]
    monkeypatch.delenv("GRAPHOPT_CPU")
    assert (envvars.get("GRAPHOPT_CPU"), envvars.get("GRAPHOPT_CPU_FEATURES")) == ("host", "")
    monkeypatch.setattr(os, "environ", {"GRAPHOPT_CPU": "x86-64"})
    assert envvars.get("GRAPHOPT_CPU") == "x86-64"
