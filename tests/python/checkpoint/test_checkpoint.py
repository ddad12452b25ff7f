"""Layout-independent checkpoints: resume bit for bit, resume under another world and home
layout, refuse bad checkpoints, survive a failed save."""

import json
import os

import numpy as np
import pytest

from hotswitch.testing.harness import run_world

from tests.python.checkpoint import workers as w


def _equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _max_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _saved(tmp_path_factory, world, home):
    """(checkpoint root, rank 0's (weights at the save, losses after it, final weights))."""
    root = str(tmp_path_factory.mktemp("ckpt"))
    return root, run_world(world, w.save_then_continue, root, home, False, timeout=600)[0]


def _expect_resumed(run, resumed, bitwise=False):
    """A resumed run (``w.resume``'s result) loaded the saved step and weights exactly and
    continued as the uninterrupted ``run`` did: bit for bit, or to fp32 rounding."""
    weights_at_save, losses, final = run
    info, loaded, resumed_losses, resumed_final = resumed
    assert info["step"] == 2 and info["data_state"] == {"position": 2}
    assert _equal(loaded, weights_at_save)  # loading only copies: exact
    if bitwise:
        assert resumed_losses == losses
        assert _equal(resumed_final, final)
    else:
        assert np.allclose(resumed_losses, losses, rtol=1e-5, atol=0)
        assert _max_diff(resumed_final, final) <= 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _saved(tmp_path_factory, 4, "dp2tp2")


def test_resume_same_world_is_bitwise(saved):
    root, run = saved
    _expect_resumed(run, run_world(4, w.resume, root, "dp2tp2", False, timeout=600)[0], bitwise=True)


@pytest.mark.parametrize("world,home,zero", [(2, "tp2", True), (4, "pp4", True)])
def test_resume_under_another_world_or_home_layout(saved, world, home, zero):
    root, run = saved
    _expect_resumed(run, run_world(world, w.resume, root, home, zero, timeout=600)[0])


@pytest.fixture(scope="module")
def saved_world2(tmp_path_factory):
    return _saved(tmp_path_factory, 2, "tp2")


def test_resume_into_a_larger_world(saved_world2):
    root, run = saved_world2
    _expect_resumed(run, run_world(4, w.resume, root, "dp2tp2", True, timeout=600)[0])


def _corrupt(root, tmp_path, how):
    import shutil
    src = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
    dst = str(tmp_path / "bad")
    shutil.copytree(src, dst)
    meta = json.load(open(os.path.join(dst, "metadata.json")))
    entry = next(e for e in meta["manifest"] if e["tensor"] == "layers.1.qkv.weight" and e["state"] == "exp_avg")
    target = os.path.join(dst, entry["file"])
    if how == "flip":
        data = bytearray(open(target, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(target, "wb").write(bytes(data))
        return dst, [entry["file"], "layers.1.qkv.weight", "CRC-32"]
    if how == "truncate":
        data = open(target, "rb").read()
        open(target, "wb").write(data[:-4])
        return dst, [entry["file"], "layers.1.qkv.weight", "truncated"]
    if how == "missing":
        meta["manifest"] = [e for e in meta["manifest"] if e is not entry]
        json.dump(meta, open(os.path.join(dst, "metadata.json"), "w"))
        return dst, ["layers.1.qkv.weight", "missing tensor data"]
    if how == "rng":
        target = os.path.join(dst, "rng", "rank_00001.pt")
        data = bytearray(open(target, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(target, "wb").write(bytes(data))
        return dst, [os.path.join("rng", "rank_00001.pt"), "RNG states of rank 1 are corrupt"]
    if how == "metadata":
        open(os.path.join(dst, "metadata.json"), "w").write("{ not json")
        return dst, ["metadata.json", "not valid JSON"]
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["flip", "truncate", "missing", "metadata", "rng"])
def test_bad_checkpoints_are_refused_everywhere_with_nothing_changed(saved, tmp_path, how):
    root, _ = saved
    path, needles = _corrupt(root, tmp_path, how)
    # RNG states are restored (and checked) when the world is the one that saved them.
    world = 4 if how == "rng" else 2
    for rank, (message, unchanged, step) in enumerate(run_world(world, w.refuse, path, None, timeout=300)):
        assert message is not None and unchanged and step == 0
        for needle in needles:
            # Every rank refuses; the rank that read the bad file names it.
            assert needle in message or (how == "rng" and rank != 1), (needle, message)


def test_a_checkpoint_of_another_model_is_refused(saved):
    root, _ = saved
    for message, unchanged, _ in run_world(2, w.refuse, root, 64, timeout=300):
        assert message is not None and unchanged
        assert "embedding.weight" in message and "[128, 32]" in message


@pytest.mark.parametrize("ckpt_format", ["hotswitch", "torch_dist"])
def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, ckpt_format):
    root = str(tmp_path / "ckpt")
    out = run_world(2, w.failed_save, root, ckpt_format, timeout=300)
    for first, message, latest, entries in out:
        assert message is not None and "rank 0" in message
        assert latest == first and first.endswith("step_00000001")
        assert "step_00000002" not in entries
        assert not [e for e in entries if e.startswith(".")], entries  # the partial save is removed


@pytest.fixture(scope="module")
def saved_cp2(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ckpt_cp2"))
    return root, run_world(2, w.save_then_continue, root, "cp2", False, True, timeout=600)[0]


@pytest.mark.parametrize("world,layout,zero", [(2, "dp2", False), (1, "dp1", False), (4, "dp2cp2", True)])
def test_a_context_parallel_checkpoint_loads_under_any_layout(saved_cp2, world, layout, zero):
    root, run = saved_cp2
    _expect_resumed(run, run_world(world, w.resume, root, layout, zero, True, timeout=600)[0])


def test_weights_only_and_finetune_loads_follow_megatron(saved):
    root, _ = saved
    out = run_world(4, w.load_parts, root, timeout=600)[0]
    step, data, after, moments, loaded, trained = out["all"]
    assert step == 2 and data == {"position": 2} and after == 3 and moments > 0
    step, data, after, moments, loaded_w, trained_w = out["no_optim"]
    assert step == 2 and data == {"position": 2} and after == 3 and moments == 0  # Adam starts afresh
    assert all(np.array_equal(loaded[k], loaded_w[k]) for k in loaded)
    assert any(not np.array_equal(trained[k], trained_w[k]) for k in trained)  # no moments: another update
    step, data, after, _, loaded_f, trained_f = out["finetune"]
    assert step == 0 and data is None and after == 1
    assert all(np.array_equal(loaded[k], loaded_f[k]) for k in loaded)
    assert all(np.array_equal(trained_w[k], trained_f[k]) for k in trained_w)  # same weights, fresh Adam
