// Time to build a redistribution plan for a LLaMA-7B-shaped tensor set.

#include <benchmark/benchmark.h>

#include "TestModels.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace {

using testing::llama7b;

void BM_PlanLlama7b(benchmark::State& state, const char* from, const char* to) {
  TensorSet set = llama7b();
  Topology topo(16, 8);
  Placement a = Placement::make(set, Layout::parse(from));
  Placement b = Placement::make(set, Layout::parse(to));
  for (auto _ : state) {
    benchmark::DoNotOptimize(RedistributionPlan::build(set, a, b, topo));
  }
}

BENCHMARK_CAPTURE(BM_PlanLlama7b, dp16_to_tp8dp2, "dp16", "dp2tp8")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLlama7b, tp8dp2_to_pp4tp4, "dp2tp8", "tp4pp4")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hotswitch
