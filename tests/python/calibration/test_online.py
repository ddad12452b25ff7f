"""Online re-calibration on synthetic phase times: the fit recovers the coefficients that
produced them, and is deterministic."""

import hotswitch as hs
from hotswitch import _C
from hotswitch.calibration.online import OnlineCalibration
from hotswitch.testing import scenarios as w

BATCHES = [
    ("dp4", [[[40, 23]], [[17]], [[90]], [[5, 5, 5]]]),
    ("dp2tp2", [[[150, 60]], [[120]]]),
    ("pp4", [[[250], [100], [30, 31]]]),
    ("tp2pp2", [[[200, 50], [256]]]),
    ("dp4", [[[250]], [[3]], [[128]], [[64, 64]]]),
    ("dp2tp2", [[[31, 37, 41]], [[200]]]),
]


def _truth():
    fields = w.hardware().to_dict()
    fields.update(efficiency=0.4, layer_overhead_seconds=3e-4, intra_node_bandwidth=1e8, inter_node_bandwidth=1e8)
    return _C.HardwareProfile.from_dict(fields)


def _calibration(truth):
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    cal = OnlineCalibration(cfg, topology, zero=False)
    cost = hs.CostModel(cfg, truth, topology)
    for name, batches in BATCHES:
        layout = hs.Layout.parse(name)
        cal.observe_phase(layout, batches, cost.phase(layout, batches).run_seconds)
    cal.observe_switch(0.01, 0.03)
    cal.observe_switch(0.02, 0.06)
    cal.observe_overhead(0.005)
    return cal


def test_fit_recovers_the_times_that_produced_the_observations():
    cal = _calibration(_truth())
    fit = cal.fit(w.hardware())
    assert fit.error_before > 0.2, fit
    assert fit.error_after < 0.02, fit
    assert abs(fit.switch_scale - 3.0) < 1e-9 and abs(fit.overhead_s - 0.005) < 1e-12
    again = _calibration(_truth()).fit(w.hardware())
    assert again.hardware == fit.hardware  # deterministic


def test_without_observations_nothing_is_fitted():
    cfg = hs.TransformerConfig(**w.TINY).cost_config()
    assert OnlineCalibration(cfg, hs.Topology(4, 4), zero=False).fit(w.hardware()) is None
