"""graphopt.distributed's parts that need no MPI job, in this process: fingerprints and what
check_same says about them (with a stand-in communicator), and the failure hook (with a
stand-in abort). The MPI side is tested in real jobs: test_distributed_jobs.py."""
import sys
import threading

import numpy as np
import pytest

import graphopt as go
from graphopt import comm
from graphopt.distributed import check_same, failure, fingerprint
from graphopt.errors import CollectiveError
from graphopt.ir import Graph, TensorType, f32


class Recorded:
    """A group whose gather_objects returns the given fingerprints (one per rank)."""

    def __init__(self, fingerprints):
        self.fingerprints, self.rank, self.size = fingerprints, 0, len(fingerprints)

    def gather_objects(self, obj):
        return [obj] + self.fingerprints[1:]


@pytest.fixture
def group():
    """Register a Recorded group "test" of the given ranks' fingerprints."""
    def register(*fingerprints):
        comm.set_group("test", Recorded(list(fingerprints)))
    yield register
    comm._GROUPS.pop("test", None)


def collectives(ops, n=8):
    """A hand-made step with collective nodes (the IR's own collectives are other work's: the
    nodes carry their types and attributes, which is all a fingerprint reads)."""
    g = Graph("step")
    x = g.add_input("arg", "x", TensorType((n,), f32))
    for op in ops:
        x = g.add_node(op, [x], {"group": "world", "ranks": 2, "reduce": "sum"},
                       out_types=[TensorType((n,), f32)]).out
    g.outputs[:] = [x]
    return g


def doubled(x):
    return (x * 2).sum()


def step(shape=(32, 2)):
    return go.trace(doubled, np.zeros(shape, np.float32))


def test_a_fingerprint():
    fp = fingerprint(collectives(["all_reduce", "all_gather", "all_reduce"]))
    assert fp["name"] == "step" and fp["inputs"] == [("arg", "x", "f32[8]")]
    assert fp["ops"] == {"all_gather": 1, "all_reduce": 2}
    assert fp["collectives"] == [
        'all_reduce f32[8] {group="world", ranks=2, reduce="sum"} : f32[8]',
        'all_gather f32[8] {group="world", ranks=2, reduce="sum"} : f32[8]',
        'all_reduce f32[8] {group="world", ranks=2, reduce="sum"} : f32[8]']
    assert fp["outputs"] == ["f32[8]"] and len(fp["text"]) == 64
    import pickle
    assert pickle.loads(pickle.dumps(fp)) == fp
    assert fingerprint(step()) == fingerprint(step())  # two traces of one step agree


@pytest.mark.parametrize("rank1, says", [
    (collectives(["all_reduce"] * 3), "rank 1: rank 1 has 3 all_reduce, rank 0 has 2"),
    (collectives(["all_gather", "all_reduce"]),
     'rank 1: collective 0 is `all_gather f32[8] {group="world", ranks=2, reduce="sum"} : '
     'f32[8]` on rank 1, `all_reduce f32[8] {group="world", ranks=2, reduce="sum"} : f32[8]` '
     'on rank 0'),
    (collectives(["all_reduce"] * 2, n=4), "rank 1: input %x is f32[4] on rank 1, f32[8] on "
                                           "rank 0"),
])
def test_what_differs_in_collectives(group, rank1, says):
    base = collectives(["all_reduce", "all_gather"] if "collective 0" in says else
                       ["all_reduce"] * 2)
    group(fingerprint(base), fingerprint(rank1))
    with pytest.raises(CollectiveError) as info:
        check_same(base, "the step 'step'", group="test")
    assert str(info.value) == (f"the step 'step' differs between the ranks of group 'test': "
                               f"rank 1 differs from rank 0, so their collectives would not "
                               f"match:\n  {says}")


def test_what_differs_first_in_words(group):
    base = fingerprint(step())
    other = dict(base, name="other")
    param = dict(base, inputs=[("param", "x", "f32[32,2]")])
    more = dict(base, inputs=base["inputs"] + [("arg", "y", "f32[]")])
    outs = dict(base, outputs=["f32[2]"])
    fewer = dict(base, outputs=[])
    text = dict(base, text="0" * 64)
    group(base, other, param, more, outs, fewer, text, base)
    with pytest.raises(CollectiveError) as info:
        check_same(step(), "s", group="test")
    assert str(info.value).splitlines()[1:] == [
        "  rank 1: the step is 'other' on rank 1, 'doubled' on rank 0",
        "  rank 2: input 0 is @x: f32[32,2] on rank 2, %x: f32[32,2] on rank 0",
        "  rank 3: rank 3 has 2 inputs, rank 0 has 1",
        "  rank 4: output 0 is f32[2] on rank 4, f32[] on rank 0",
        "  rank 5: rank 5 returns 0 values, rank 0 returns 1",
        "  rank 6: the step's text differs"]
    assert "ranks 1, 2, 3, 4, 5 and 6 differ from rank 0" in str(info.value)


def test_many_differing_ranks_are_counted(group):
    base = fingerprint(step())
    group(base, *[dict(base, text=str(r)) for r in range(1, 12)])
    with pytest.raises(CollectiveError) as info:
        check_same(step(), "s", group="test")
    lines = str(info.value).splitlines()
    assert len(lines) == 1 + 8 + 1 and lines[-1] == "  and 3 more ranks"


def test_one_rank_does_not_communicate(group):
    class Alone:
        rank, size = 0, 1

        def gather_objects(self, obj):
            raise AssertionError("a group of one communicated")
    comm.set_group("test", Alone())
    assert check_same(step(), "s", group="test") is None
    assert check_same(step(), "s") is None  # the world before init: one process


# -- the failure hook --------------------------------------------------------------------------
@pytest.fixture
def hooks(monkeypatch):
    """failure.install with a stand-in abort (the statuses it was called with); the hooks are
    put back after the test."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # (not pytest's)
    aborts = []
    failure.install(3, 4, aborts.append)
    return aborts


def _raise(kind, *args):
    try:
        raise kind(*args)
    except BaseException:
        return sys.exc_info()


def test_an_uncaught_exception_is_printed_with_the_rank_and_aborts(hooks, capsys):
    sys.excepthook(*_raise(ValueError, "bad batch"))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[rank 3] Traceback (most recent call last):"
    assert "[rank 3] ValueError: bad batch" in err
    assert err[-1] == "[rank 3] graphopt.distributed: uncaught ValueError on rank 3: aborting " \
                      "all 4 ranks"
    assert all(line.startswith("[rank 3] ") for line in err)
    sys.excepthook(*_raise(KeyboardInterrupt))
    assert hooks == [1, 130]  # 130: a KeyboardInterrupt, as python -m mpi4py says


def test_the_previous_hook_prints_and_a_broken_one_does_not_stop_the_abort(monkeypatch,
                                                                         capsys):
    monkeypatch.setattr(sys, "excepthook", lambda *a: print("mine:", a[1], file=sys.stderr))
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    aborts = []
    failure.install(0, 2, aborts.append)
    sys.excepthook(*_raise(ValueError, "x"))
    assert capsys.readouterr().err.splitlines()[0] == "[rank 0] mine: x"

    def broken(*args):
        raise RuntimeError("the hook fails")
    monkeypatch.setattr(sys, "excepthook", broken)
    failure.install(0, 2, aborts.append)
    sys.excepthook(*_raise(ValueError, "y"))
    assert "[rank 0] ValueError: y" in capsys.readouterr().err.splitlines()  # Python's own
    assert aborts == [1, 1]


def test_a_thread_exception_gets_the_rank_and_no_abort(hooks, capsys):
    t = threading.Thread(target=lambda: 1 / 0, name="worker")
    t.start()
    t.join()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[rank 3] Exception in thread worker:"
    assert "[rank 3] ZeroDivisionError: division by zero" in err
    assert hooks == []


def test_a_timeout_in_check_same_names_the_step(group):
    from graphopt.errors import CollectiveTimeout

    class Late(Recorded):
        def gather_objects(self, obj):
            raise CollectiveTimeout("rank 0: gather_objects of 300 bytes (their sizes) waited "
                                    "5.0 s for the other ranks (...)")
    comm.set_group("test", Late([None, None]))
    with pytest.raises(CollectiveTimeout, match=r"waited 5\.0 s .* \(checking that the ranks "
                                                r"agree on the step 'f'\)$"):
        check_same(step(), "the step 'f'", group="test")
