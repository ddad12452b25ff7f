"""Checkpoints in torch.distributed.checkpoint (DCP) format: resume bit for bit, load under
another world, home layout and ZeRO, open with DCP's own reader, refuse another model or a
partial checkpoint on every rank with nothing changed."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from hotswitch.testing.harness import run_world

from tests.python.checkpoint import workers as w


def _equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dcp"))
    return root, run_world(4, w.save_dcp_then_continue, root, "dp2tp2", False, timeout=600)[0]


def test_a_dcp_checkpoint_is_dcp_and_resumes_bit_for_bit(saved):
    root, (weights, losses, final, path) = saved
    files = os.listdir(path)
    assert ".metadata" in files and "hotswitch.json" in files and any(f.endswith(".distcp") for f in files)
    assert open(os.path.join(root, "latest")).read().strip() == os.path.basename(path)
    info, loaded, resumed, resumed_final = run_world(4, w.resume_any, root, "dp2tp2", False, timeout=600)[0]
    assert info["step"] == 2 and info["data_state"] == {"position": 2}
    assert _equal(loaded, weights)
    assert resumed == losses and _equal(resumed_final, final)


@pytest.mark.parametrize("world,home,zero", [(2, "tp2", True), (1, None, False), (4, "tp2pp2", True)])
def test_a_dcp_checkpoint_loads_under_another_world_home_and_zero(saved, world, home, zero):
    root, (weights, losses, final, _) = saved
    info, loaded, resumed, resumed_final = run_world(world, w.resume_any, root, home, zero, timeout=600)[0]
    assert info["step"] == 2 and _equal(loaded, weights)  # loading only copies: exact
    assert np.allclose(resumed, losses, rtol=1e-5, atol=0)
    assert max(float(np.abs(resumed_final[k] - final[k]).max()) for k in final) <= 1e-5


def test_dcps_own_reader_opens_it_without_hotswitch(saved):
    _, (weights, _, _, path) = saved
    metadata = dcp.FileSystemReader(path).read_metadata()
    keys = set(metadata.state_dict_metadata)
    assert {f"model/{k}" for k in weights} <= keys and "optim/exp_avg/embedding.weight" in keys
    state = {f"model/{k}": torch.empty(v.shape, dtype=torch.float32) for k, v in weights.items()}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    assert all(np.array_equal(state[f"model/{k}"].numpy(), v) for k, v in weights.items())


def test_another_model_or_a_partial_dcp_checkpoint_is_refused_everywhere(saved, tmp_path):
    _, (_, _, _, path) = saved
    for message, unchanged, step in run_world(2, w.refuse, path, 64, timeout=300):
        assert message is not None and unchanged and step == 0
        assert "embedding.weight" in message and "[128, 32]" in message and "another model" in message
    partial = str(tmp_path / "partial")
    shutil.copytree(path, partial)
    victim = sorted(f for f in os.listdir(partial) if f.endswith(".distcp"))[0]
    os.remove(os.path.join(partial, victim))
    for message, unchanged, step in run_world(2, w.refuse, partial, None, timeout=300):
        assert message is not None and unchanged and step == 0
        assert "DCP could not read it" in message, message
    meta = json.load(open(os.path.join(partial, "hotswitch.json")))
    meta["format"] = "something-else"
    json.dump(meta, open(os.path.join(partial, "hotswitch.json"), "w"))
    for message, unchanged, _ in run_world(2, w.refuse, partial, None, timeout=300):
        assert "hotswitch.json is not a hotswitch-dcp-1 checkpoint" in message and unchanged


def test_converting_between_the_formats_keeps_everything(saved, tmp_path):
    from hotswitch.cli import convert
    root, (weights, losses, final, path) = saved
    ours, back = str(tmp_path / "ours"), str(tmp_path / "back")
    assert convert.main(["--load", path, "--save", ours, "--ckpt-format", "hotswitch"]) == 0
    assert os.path.isfile(os.path.join(ours, "step_00000002", "metadata.json"))
    assert convert.main(["--load", ours, "--save", back, "--ckpt-format", "torch_dist"]) == 0
    for converted in (ours, back):
        info, loaded, resumed, resumed_final = run_world(4, w.resume_any, converted, "dp2tp2", False, timeout=600)[0]
        assert info["step"] == 2 and info["data_state"] == {"position": 2} and _equal(loaded, weights)
        assert resumed == losses and _equal(resumed_final, final)  # optimizer state kept bit for bit
