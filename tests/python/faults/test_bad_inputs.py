"""Every public entry point refuses bad input with a ValueError naming the value, and
changes no state."""

import math

import pytest

from hotswitch.testing import bad_inputs as b
from hotswitch.testing.harness import run_world


@pytest.mark.parametrize("name,call,needle", b.LOCAL, ids=[c[0] for c in b.LOCAL])
def test_local_entry_points(name, call, needle):
    assert b.check(call, needle) is None, f"{name}: {b.check(call, needle)}"


def test_check_reads_the_message():
    # A refusal counts only when its message holds the needle, for ValueErrors and usage errors.
    assert b.check(lambda: b.train.parse_args(["--lr", "nan"]), "--lr must be") is None
    assert "does not name" in b.check(lambda: b.train.parse_args(["--lr", "nan"]), "--seed")
    assert "does not name" in b.check(lambda: b.Layout.enumerate(0), "ranks_per_node")
    assert b.check(lambda: None, "anything") == "accepted"


def test_sampler_state_is_unchanged_by_a_refused_state():
    s = b._sampler()
    s.next_batch()
    before = s.state_dict()
    assert b.check(lambda: s.load_state_dict({"seed": 0, "epoch": 0, "position": 99}), "99") is None
    assert s.state_dict() == before


def test_runtime_entry_points():
    cases, unchanged, loss = run_world(1, b.runtime_table, timeout=300)[0]
    failures = [(n, p) for n, p in cases if p is not None]
    assert not failures, failures
    assert unchanged and math.isfinite(loss)
