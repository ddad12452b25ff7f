"""Hardware profiles as JSON files: ``HardwareProfile.save(path)`` and ``HardwareProfile.load(path)``.

A profile file holds one JSON object with the fields of ``HardwareProfile.to_dict()``:
``name``, ``peak_flops`` (FLOP/s), ``efficiency`` and ``attention_efficiency`` (fractions of
peak on large matrix products and on long causal attention), ``attention_half_length``
(tokens at which attention runs at half its efficiency), ``memory_bytes`` (per-rank budget),
``memory_bandwidth`` (device memory bytes/s; 0: memory traffic not modelled) and
``memory_efficiency`` (achieved fraction of it), ``intra_node_bandwidth`` /
``inter_node_bandwidth`` (bytes/s one rank sends), ``intra_node_latency`` /
``inter_node_latency`` (seconds per message), ``layer_overhead_seconds`` (per layer and
micro-batch, forward and backward), ``sequence_overhead_seconds`` (per layer and sequence) and
``step_overhead_seconds`` (per training step). ``attention_half_length``,
``memory_bandwidth``, ``memory_efficiency`` and ``step_overhead_seconds`` may be left out
(files written before they existed): they default to leaving their terms out. Calibrated
profiles (``hotswitch.calibrate``, ``python -m hotswitch.calibration``, ``python -m hotswitch.costmodel fit``) and presets load and
plan alike.
"""

import json
from typing import Optional

from hotswitch._C import HardwareProfile
from hotswitch._checks import read_json_object

__all__ = ["load_hardware", "load_profile", "preset_for_device", "save_profile"]


def save_profile(profile: HardwareProfile, path: str) -> None:
    """Writes the profile to ``path`` as JSON; ValueError naming the path when it cannot."""
    try:
        with open(path, "w") as f:
            json.dump(profile.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
    except OSError as e:
        raise ValueError(f"cannot write hardware profile {path!r}: {e.strerror}") from None


def load_profile(path: str) -> HardwareProfile:
    """Reads a profile written by ``save_profile``; ValueError naming the path and the field."""
    fields = read_json_object(path, "hardware profile")
    try:
        return HardwareProfile.from_dict(fields)
    except ValueError as e:
        raise ValueError(f"hardware profile {path!r}: {e}") from None


def load_hardware(spec: str) -> HardwareProfile:
    """A hardware preset by name (``a800``) or a profile saved as JSON (``FILE.json``)."""
    if spec.endswith(".json"):
        return load_profile(spec)
    return HardwareProfile.preset(spec)


def preset_for_device(device_name: str) -> Optional[str]:
    """The preset whose name is part of a CUDA device's name (``NVIDIA H100 80GB HBM3`` ->
    ``h100``), or None."""
    lowered = device_name.lower()
    for name in HardwareProfile.preset_names():
        if name in lowered:
            return name
    return None


HardwareProfile.save = save_profile
HardwareProfile.load = staticmethod(load_profile)
