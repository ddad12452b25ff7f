import hotswitch as hs
from hotswitch import planner as planning
from hotswitch.analysis.simulate import simulate
from hotswitch.data import load_lengths
from hotswitch.hardware import load_hardware
from benchmarks.planner import OPTIONS, MAX_CONTEXT, SEQUENCES_PER_GPU
if __name__ == "__main__":
    hw = load_hardware("a800"); model = hs.ModelConfig.preset("llama-7b")
    graphs = dict(graph_buckets=[1024, 2048, 4096, 8192, 16384], graph_copy_param_bytes=2, graph_layer_overhead_seconds=0.1 * hw.layer_overhead_seconds)
    lengths = load_lengths("../shared/data/wikipedia.lengths")
    topo = hs.Topology(8, 8); cands = planning.auto_candidates(model, 8, 1); n = len(cands)
    probe = hs.Planner(hs.CostModel(model, hw, topo, zero=True, **graphs), cands, 0, [[0.0]*n for _ in range(n)], [0.0]*n, **OPTIONS)
    home = probe.plan([MAX_CONTEXT] * SEQUENCES_PER_GPU).best_static_candidate
    costs = planning.switch_costs(model, hw, topo, cands, home)
    p = planning.build_planner(model, hw, topo, cands, home, costs=costs, graphs=graphs, **OPTIONS)
    r = simulate(p, lengths, 3, 128, seed=1, static_run=dict(OPTIONS))
    print(cands[home].name, {k: v for k, v in r.items() if k != "plan_ms"})
    names = [c.name for c in cands]
    print(names, [p.candidate_model(i).budget for i in range(n)])
    sub = [hs.Layout.parse(x) for x in ("dp2tp4", "dp4tp2")]
    costs2 = planning.switch_costs(model, hw, topo, sub, 0)
    p2 = planning.build_planner(model, hw, topo, sub, 0, costs=costs2, graphs=graphs, **OPTIONS)
    r2 = simulate(p2, lengths, 3, 128, seed=1, static_run=dict(OPTIONS))
    print("two candidates", {k: v for k, v in r2.items() if k != "plan_ms"}, [p2.candidate_model(i).budget for i in range(2)])
    p3 = planning.build_planner(model, hw, topo, cands, home, costs=costs, **OPTIONS)
    r3 = simulate(p3, lengths, 3, 128, seed=1, static_run=dict(OPTIONS))
    print("no graphs", {k: v for k, v in r3.items() if k != "plan_ms"})
