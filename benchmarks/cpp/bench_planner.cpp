// Time to plan one step: LLaMA-7B on A800s, every (dp, tp, pp) layout the model divides,
// long-tailed lengths (log-normal, capped at 32K), switch costs proportional to the layouts'
// difference in tensor and pipeline degree (the planner's speed does not depend on them).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/Check.h"
#include "planner/Planner.h"

namespace hotswitch {
namespace {

Planner makePlanner(int world) {
  ModelConfig model = ModelConfig::preset("llama-7b");
  CostModel cost(model, HardwareProfile::preset("a800"), Topology(world, 8), CostOptions{true, 4, 12});
  std::vector<Layout> layouts;
  for (const Layout& l : Layout::enumerate(world)) {
    try {
      model.validate(l);
      layouts.push_back(l);
    } catch (const InvalidArgument&) {
    }
  }
  const size_t n = layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) sw[i][j] = 0.02 * (1 + std::abs(std::log2(double(layouts[i].tp()) / layouts[j].tp())) +
                                     std::abs(std::log2(double(layouts[i].pp()) / layouts[j].pp())));
    }
  }
  std::vector<double> grads(n, 0.05), partial(n, 0.08);
  grads[0] = partial[0] = 0;
  PlannerOptions options;
  options.maxContext = 32768;
  options.longSequences = LongSequences::kTruncate;
  return Planner(cost, layouts, 0, SwitchCosts{sw, grads, partial}, options);
}

std::vector<int64_t> lengths(int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::lognormal_distribution<double> dist(6.0, 1.4);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(gen)), 1, 200000));
  return out;
}

void BM_Plan(benchmark::State& state) {
  const int sequences = static_cast<int>(state.range(0)), world = static_cast<int>(state.range(1));
  Planner planner = makePlanner(world);
  std::vector<int64_t> batch = lengths(sequences, 1);
  for (auto _ : state) benchmark::DoNotOptimize(planner.plan(batch));
}

BENCHMARK(BM_Plan)->Args({1024, 32})->Args({4096, 256})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hotswitch
