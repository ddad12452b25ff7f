"""Switches between real gloo processes, checked against plain PyTorch slicing."""

import itertools

import pytest

import hotswitch as hs
from hotswitch.testing.harness import run_world

from tests.python.switch import workers as w


def _layouts(world):
    return [l.name for l in hs.Layout.enumerate(world)]


def test_every_ordered_pair_world4():
    names = _layouts(4)
    pairs = [(a, "sharded", b, "sharded") for a, b in itertools.product(names, names)]
    pairs += [(a, "sharded", b, "zero") for a, b in itertools.product(names, names)]
    pairs += [(a, "zero", b, "sharded") for a, b in itertools.product(names, ["tp4", "dp2pp2"])]
    assert len(names) == 6
    for failures in run_world(4, w.every_pair, pairs, False, timeout=300):
        assert failures == []


def test_every_ordered_pair_two_nodes_balancing_send_time():
    names = _layouts(4)
    pairs = [(a, "sharded", b, "sharded") for a, b in itertools.product(names, names)]
    pairs += [(a, "sharded", b, "zero") for a, b in itertools.product(names, ["dp4", "dp2tp2"])]
    for failures in run_world(4, w.every_pair, pairs, False, 2, (200e9, 25e9), timeout=300):
        assert failures == []


def test_every_ordered_pair_world8_tied_embedding():
    names = _layouts(8)
    pairs = [(a, "sharded", b, "sharded") for a, b in itertools.product(names, names)]
    pairs += [("dp2tp4", "sharded", "dp2tp4/dp-tp-cp-pp", "sharded"),
              ("tp8", "sharded", "dp2tp4/dp-tp-cp-pp", "sharded")]
    assert len(names) == 10
    for failures in run_world(8, w.every_pair, pairs, True, timeout=400):
        assert failures == []


@pytest.mark.parametrize("src,dst,dst_kind,tied", [("dp4", "dp4", "zero", False),
                                                   ("dp2tp2", "tp4", "sharded", False),
                                                   ("dp2pp2", "tp2pp2", "zero", False),
                                                   ("dp2pp2", "dp4", "sharded", True)])
def test_partial_to_sharded_sums_the_summands(src, dst, dst_kind, tied):
    for ok, moved in run_world(4, w.partial_sum, src, dst, dst_kind, tied):
        assert ok
        assert moved > 0


def test_bounded_memory_runs_in_rounds():
    for ok, rounds in run_world(4, w.bounded_memory, 4096):
        assert ok
        assert rounds > 1


@pytest.mark.parametrize("case,needle", [
    ("shape", "rank 1"),
    ("missing", "head.weight"),
    ("dtype", "final_norm.weight"),
    ("disagree", "layers.0.proj.weight"),
    ("layout_world", "!= world(4)"),
    ("layout_disagree", "rank 2"),
    ("kind", "'sharded_zero'"),
    ("bound", "max_buffer_bytes"),
    ("bad_bound", "-5"),
    ("timeout_inf", "inf"),
    ("topology_type", "topology must be a hotswitch.Topology"),
    ("topology_disagree", "ranks_per_node=2"),
    ("uneven", "is not divisible by tp("),
    ("bandwidth_disagree", "link bandwidths"),
    ("bandwidth_one", "got intra-node 0 and inter-node 2.5e+10"),
    ("bandwidth_type", "intra_node_bandwidth must be a number of bytes/s, got 'fast'"),
])
def test_bad_input_raises_value_error_everywhere_and_changes_nothing(case, needle):
    for message, intact, recovered in run_world(4, w.bad_input, case):
        assert message is not None and needle in message, message
        assert intact
        assert recovered


@pytest.mark.parametrize("mode", ["die", "stall"])
def test_faulty_peer_raises_within_timeout_and_keeps_old_shards(mode):
    timeout = 3.0
    results = run_world(4, w.peer_fault, mode, 3, timeout, allow_exit=(3,), timeout=60)
    for rank, result in enumerate(results[:3]):
        outcome, seconds, intact = result
        assert outcome.startswith("Switch"), outcome
        assert "rank" in outcome
        assert seconds < timeout + 5, seconds
        assert intact


def test_donated_shards_are_reused_but_never_while_referenced():
    for intact, reused, note in run_world(4, w.donated_ping_pong):
        assert note == "ok"
        assert intact
        assert reused > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_tensor_sets_switch_bit_for_bit(dtype):
    names = _layouts(4)
    pairs = [(a, "sharded", b, "sharded") for a, b in itertools.product(names, names)]
    pairs += [(a, "sharded", b, "zero") for a, b in itertools.product(names, ["dp4", "dp2tp2"])]
    pairs += [("dp4", "zero", b, "sharded") for b in names]
    for failures in run_world(4, w.every_pair_16bit, pairs, dtype, True, timeout=300):
        assert failures == []
