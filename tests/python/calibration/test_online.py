"""Online re-calibration on synthetic phase times: the fit recovers the coefficients that
produced them, and is deterministic."""

import numpy as np
import pytest

import hotswitch as hs
from hotswitch import _C
from hotswitch.calibration import online
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


def test_a_layout_slower_than_the_shared_coefficients_explain_gets_its_own_factor():
    # pp4's phases ran twice as long as the truth's coefficients say: no shared coefficient
    # explains one layout alone, so the refit leaves the others near 1 and gives pp4 a factor.
    truth = _truth()
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    cost = hs.CostModel(cfg, truth, topology, layout_scale={"pp4": 2.0})
    assert cost.layout_scale == {"pp4": 2.0}
    cal = OnlineCalibration(cfg, topology, zero=False)
    for name, batches in BATCHES * 3:
        layout = hs.Layout.parse(name)
        cal.observe_phase(layout, batches, cost.phase(layout, batches).run_seconds)
    fit = cal.fit(truth)
    assert set(fit.layout_scale) == {"dp4", "dp2tp2", "pp4", "tp2pp2"}
    # Three pp4 phases at 2x, shrunk by half an observation: 2 ** (3 / 3.5) = 1.81 if the
    # shared coefficients stayed; the refit moves them a little towards pp4.
    assert 1.5 < fit.layout_scale["pp4"] < 2.0, fit.layout_scale
    others = [fit.layout_scale[n] for n in ("dp4", "dp2tp2", "tp2pp2")]
    assert all(0.8 < k < 1.2 for k in others), fit.layout_scale
    measured = np.array([m for _, _, m, _ in cal.phases])
    fields = online._fields(fit.hardware)
    with_factors = np.abs(cal._predict(fields, fit.layout_scale) - measured) / measured
    without = np.abs(cal._predict(fields) - measured) / measured
    assert with_factors.max() < 0.1 and without.max() > 0.3, (with_factors.max(), without.max())
    assert fit.error_after == pytest.approx(float(np.median(with_factors)))


def test_a_cost_models_layout_factor_scales_that_layouts_times_alone():
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    plain = hs.CostModel(cfg, _truth(), topology)
    scaled = hs.CostModel(cfg, _truth(), topology, layout_scale={"pp4": 1.5, "dp4": 0.5})
    for name, batches in BATCHES:
        layout = hs.Layout.parse(name)
        factor = {"pp4": 1.5, "dp4": 0.5}.get(name, 1.0)
        a, b = plain.phase(layout, batches), scaled.phase(layout, batches)
        assert b.run_seconds == pytest.approx(factor * a.run_seconds, rel=1e-12)
        assert b.peak_bytes == a.peak_bytes  # memory is not time
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="layout_scale of pp4 must be a finite factor > 0"):
            hs.CostModel(cfg, _truth(), topology, layout_scale={"pp4": bad})
