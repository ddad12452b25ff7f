// Fuzz target: the step planner.
//
// From the fuzz bytes: a model (small shapes or a LLaMA preset; sometimes malformed), a
// hardware profile (any scale; sometimes invalid), a topology, candidate layouts and a home,
// switch costs, planner options and the step's sequence lengths. Bad input must raise
// InvalidArgument, nothing else; an input is rejected exactly when it is infeasible (an empty
// batch, a length < 1, a sequence over the max context under "reject", or a piece no
// candidate holds). A plan must place every piece exactly once, in one phase and one
// micro-batch; keep every phase's predicted peak memory within the device's memory and every
// micro-batch within its layout's token budget; state the objective of its own assignment;
// and come out the same from the same planner and from a fresh one.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "FuzzInput.h"
#include "PlanDump.h"
#include "common/Check.h"
#include "planner/Planner.h"

namespace hotswitch {
namespace fuzz {
namespace {

double maybeBad(FuzzInput& in, double value) {
  if (!in.chance(3)) return value;
  switch (in.range(0, 3)) {
    case 0: return -value - 1;
    case 1: return std::numeric_limits<double>::quiet_NaN();
    case 2: return std::numeric_limits<double>::infinity();
    default: return 0;
  }
}

ModelConfig model(FuzzInput& in) {
  if (in.chance(24)) {
    const std::vector<std::string> names = ModelConfig::presetNames();
    return ModelConfig::preset(names[in.range(0, static_cast<int64_t>(names.size()) - 1)]);
  }
  ModelConfig m;
  m.name = "fuzz";
  m.numLayers = static_cast<int>(in.range(1, 8));
  m.numAttentionHeads = 1 << in.range(0, 3);
  m.numQueryGroups = m.numAttentionHeads >> in.range(0, 3);
  m.hiddenSize = m.numAttentionHeads * in.range(1, 8);
  m.ffnHiddenSize = 8 * in.range(1, 8);
  m.vocabSize = in.range(1, 512);
  m.paramBytes = in.flag() ? 2 : 4;
  m.recompute = in.flag() ? Recompute::kFull : Recompute::kNone;
  if (in.chance(6)) m.numQueryGroups = static_cast<int>(in.range(0, 3));
  if (in.chance(4)) m.hiddenSize = in.range(-1, 7);
  if (in.chance(4)) m.paramBytes = in.range(0, 8);
  if (in.chance(4)) m.numLayers = static_cast<int>(in.range(-1, 0));
  return m;
}

HardwareProfile hardware(FuzzInput& in) {
  HardwareProfile h;
  h.name = "fuzz";
  h.peakFlops = maybeBad(in, std::pow(10.0, in.real(3, 15)));
  h.efficiency = in.chance(4) ? in.real(-1, 2) : in.real(0.01, 1);
  h.attentionEfficiency = in.real(0.01, 1);
  h.memoryBytes = in.chance(8) ? in.range(-1, 1 << 20) : in.range(int64_t{1} << 12, int64_t{1} << in.range(13, 62));
  h.intraNodeBandwidth = maybeBad(in, std::pow(10.0, in.real(2, 12)));
  h.interNodeBandwidth = std::pow(10.0, in.real(1, 11));
  h.intraNodeLatency = in.real(0, 1e-4);
  h.interNodeLatency = maybeBad(in, in.real(0, 1e-3));
  h.layerOverheadSeconds = in.flag() ? 0 : in.real(0, 1e-3);
  h.sequenceOverheadSeconds = in.flag() ? 0 : in.real(0, 1e-4);
  return h;
}

bool shards(const ModelConfig& m, const Layout& l) {
  return m.numAttentionHeads % l.tp() == 0 && m.numQueryGroups > 0 && m.numQueryGroups % l.tp() == 0 &&
         m.ffnHiddenSize % l.tp() == 0 && m.numLayers % l.pp() == 0;
}

struct Input {
  ModelConfig model;
  HardwareProfile hardware;
  int world = 1, ranksPerNode = 1;
  CostOptions costOptions;
  std::vector<Layout> candidates;
  int home = 0;
  SwitchCosts switches;
  PlannerOptions options;
  std::vector<int64_t> lengths;
};

Input input(FuzzInput& in) {
  Input x;
  x.model = model(in);
  x.hardware = hardware(in);
  x.world = static_cast<int>(in.range(1, 8));
  const int nodes = static_cast<int>(in.range(1, x.world));
  x.ranksPerNode = x.world % nodes == 0 ? x.world / nodes : x.world;
  x.costOptions.zero = in.flag();
  x.costOptions.gradBytes = in.chance(4) ? 3 : (in.flag() ? 2 : 4);
  x.costOptions.optimizerBytesPerParam = in.range(in.chance(4) ? -1 : 0, 16);

  const std::vector<Layout> all = Layout::enumerate(x.world);
  std::vector<Layout> usable;
  for (const Layout& l : all) {
    if (shards(x.model, l)) usable.push_back(l);
  }
  const bool any = usable.empty() || in.chance(8);
  const std::vector<Layout>& pool = any ? all : usable;
  const int n = static_cast<int>(in.range(in.chance(4) ? 0 : 1, 6));
  for (int i = 0; i < n; ++i) {
    const Layout& l = pool[in.range(0, static_cast<int64_t>(pool.size()) - 1)];
    Layout::Order o = l.order();
    if (in.flag()) std::swap(o[in.range(0, 3)], o[in.range(0, 3)]);
    x.candidates.push_back(in.chance(4) ? Layout(l.dp() * 2, l.tp(), l.pp()) : Layout(l.dp(), l.tp(), l.pp(), 1, o));
  }
  x.home = static_cast<int>(in.chance(4) ? in.range(-1, n + 1) : in.range(0, std::max(0, n - 1)));

  const double scale = std::pow(10.0, in.real(-6, 1));
  const int rows = n + (in.chance(4) ? 1 : 0);
  x.switches.params.assign(rows, std::vector<double>(n, 0.0));
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) x.switches.params[i][j] = in.chance(32) ? 0 : in.real(0, scale);
    }
  }
  if (n > 0 && in.chance(4)) x.switches.params[in.range(0, n - 1)][in.range(0, n - 1)] = maybeBad(in, 1);
  for (int i = 0; i < n; ++i) x.switches.reducedGrads.push_back(in.real(0, scale));
  if (in.flag()) {
    for (int i = 0; i < n; ++i) x.switches.partialGrads.push_back(in.real(0, scale));
  }
  if (in.chance(4)) x.switches.reducedGrads.push_back(0);

  x.options.boundaryCandidates = static_cast<int>(in.flag() ? in.range(in.chance(4) ? 0 : 2, 12) : 128);
  x.options.maxContext = in.flag() ? 0 : in.range(in.chance(4) ? -1 : 1, 256);
  x.options.longSequences = static_cast<LongSequences>(in.range(0, 2));
  x.options.microBatchOverheadShare = in.chance(4) ? in.real(-0.5, 1.5) : in.real(0.01, 1);
  x.options.pruneDominated = in.flag();
  x.options.exactFallback = in.flag();

  const int count = static_cast<int>(in.range(in.chance(8) ? 0 : 1, 96));
  int64_t longest = int64_t{1} << in.range(1, in.chance(16) ? 40 : 14);
  if (x.options.maxContext > 0) longest = std::min(longest, 64 * x.options.maxContext);  // pieces to plan, not to count
  for (int i = 0; i < count; ++i) x.lengths.push_back(in.chance(2) ? in.range(-1, 0) : in.range(1, longest));
  // Recompute modes, drawn last so that earlier inputs keep their meaning: usually distinct,
  // sometimes none or one twice (refused).
  if (in.flag()) {
    x.options.recompute.clear();
    const int modes = static_cast<int>(in.range(in.chance(8) ? 0 : 1, 3));
    for (int i = 0; i < modes; ++i) {
      const auto mode = static_cast<Recompute>(in.range(0, 2));
      const bool twice = std::find(x.options.recompute.begin(), x.options.recompute.end(), mode) !=
                         x.options.recompute.end();
      if (!twice || in.chance(8)) x.options.recompute.push_back(mode);
    }
  }
  return x;
}

std::vector<SequencePiece> expectedPieces(const std::vector<int64_t>& lengths, const PlannerOptions& o) {
  std::vector<SequencePiece> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t s = lengths[i], cap = o.maxContext;
    const int seq = static_cast<int>(i);
    if (cap == 0 || s <= cap) {
      out.push_back({seq, 0, s});
    } else if (o.longSequences == LongSequences::kTruncate) {
      out.push_back({seq, 0, cap});
    } else {
      for (int64_t at = 0; at < s; at += cap) out.push_back({seq, at, std::min(cap, s - at)});
    }
  }
  return out;
}

void checkPlan(const Input& x, const Planner& planner, const StepPlan& plan) {
  const int n = static_cast<int>(plan.pieces.size());
  const int L = static_cast<int>(x.candidates.size());
  std::vector<int> inPhase(n, 0), inBatch(n, 0);
  std::vector<int> phaseOf(n, -1);
  std::vector<std::vector<bool>> used(L, std::vector<bool>(3, false));  // [candidate][recompute]
  std::vector<Recompute> modeOf(n, Recompute::kNone);
  FUZZ_CHECK(!plan.phases.empty(), "a plan without phases");
  double total = plan.switchBackSeconds;
  for (const PlannedPhase& phase : plan.phases) {
    const int c = phase.candidate;
    FUZZ_CHECK(c >= 0 && c < L && phase.layout == x.candidates[c], "phase candidate ", c);
    const int mode = static_cast<int>(phase.recompute);
    FUZZ_CHECK(std::find(x.options.recompute.begin(), x.options.recompute.end(), phase.recompute) !=
                   x.options.recompute.end(), "phase recomputes ", recomputeName(phase.recompute),
               ", which the options do not allow");
    FUZZ_CHECK(!used[c][mode], "two phases under candidate ", c, " recompute ", recomputeName(phase.recompute));
    used[c][mode] = true;
    FUZZ_CHECK(phase.cost.fits && phase.cost.peakBytes <= x.hardware.memoryBytes, "phase under ",
               phase.layout.name(), " peaks at ", phase.cost.peakBytes, " B of ", x.hardware.memoryBytes);
    FUZZ_CHECK(static_cast<int>(phase.packing.microBatches.size()) == phase.layout.dp(), "packing of ",
               phase.packing.microBatches.size(), " replicas under ", phase.layout.name());
    for (int i : phase.sequences) {
      FUZZ_CHECK(i >= 0 && i < n, "piece index ", i);
      ++inPhase[i];
      phaseOf[i] = c;
      modeOf[i] = phase.recompute;
    }
    FUZZ_CHECK(phase.cuSeqlens.size() == phase.packing.microBatches.size(), "cu_seqlens of ",
               phase.cuSeqlens.size(), " replicas under ", phase.layout.name());
    for (size_t r = 0; r < phase.packing.microBatches.size(); ++r) {
      const auto& replica = phase.packing.microBatches[r];
      FUZZ_CHECK(phase.cuSeqlens[r].size() == replica.size(), "cu_seqlens of ", phase.cuSeqlens[r].size(),
                 " micro-batches for ", replica.size());
      for (size_t k = 0; k < replica.size(); ++k) {
        const auto& mb = replica[k];
        const auto& cu = phase.cuSeqlens[r][k];
        FUZZ_CHECK(!mb.empty(), "an empty micro-batch under ", phase.layout.name());
        FUZZ_CHECK(cu.size() == mb.size() + 1 && cu[0] == 0, "cu_seqlens of ", cu.size(), " entries for ",
                   mb.size(), " pieces");
        int64_t tokens = 0;
        for (size_t j = 0; j < mb.size(); ++j) {
          const int i = mb[j];
          FUZZ_CHECK(i >= 0 && i < n && phaseOf[i] == c && modeOf[i] == phase.recompute, "piece ", i,
                     " packed outside its phase");
          ++inBatch[i];
          tokens += plan.pieces[i].length;
          FUZZ_CHECK(cu[j + 1] == tokens, "cu_seqlens ", cu[j + 1], " after ", tokens, " tokens");
        }
        const int64_t budget = planner.candidateModel(c, phase.recompute).budget;
        FUZZ_CHECK(tokens <= budget && budget <= planner.microBatchBudget(c), "micro-batch of ", tokens,
                   " tokens under ", phase.layout.name(), ", budget ", budget);
      }
    }
    total += phase.switchInSeconds + phase.cost.runSeconds() + phase.gradSeconds;
  }
  for (int i = 0; i < n; ++i) {
    FUZZ_CHECK(inPhase[i] == 1 && inBatch[i] == 1, "piece ", i, " in ", inPhase[i], " phases and ", inBatch[i],
               " micro-batches");
  }
  FUZZ_CHECK(std::isfinite(plan.totalSeconds) && plan.totalSeconds >= 0, "total ", plan.totalSeconds);
  FUZZ_CHECK(std::fabs(plan.totalSeconds - total) <= 1e-9 * std::max(1.0, total), "total ", plan.totalSeconds,
             " but its phases add to ", total);
  int others = 0;
  for (int c = 0; c < L; ++c) {
    for (int mode = 0; mode < 3; ++mode) {
      others += used[c][mode] && !(c == x.home && static_cast<Recompute>(mode) == x.options.recompute[0]);
    }
  }
  if (others <= Planner::kMaxOrderedLayouts) {
    std::vector<int64_t> lengths;
    std::vector<int> assignment;
    for (int i = 0; i < n; ++i) {
      lengths.push_back(plan.pieces[i].length);
      assignment.push_back(phaseOf[i]);
    }
    const double j = planner.objective(lengths, assignment, modeOf).totalSeconds;
    FUZZ_CHECK(std::fabs(j - plan.objectiveSeconds) <= 1e-9 * std::max(1.0, j), "objective ",
               plan.objectiveSeconds, " but its assignment's is ", j);
  }
}

void run(FuzzInput& in) {
  const Input x = input(in);
  std::unique_ptr<Planner> planner;
  try {
    planner = std::make_unique<Planner>(CostModel(x.model, x.hardware, Topology(x.world, x.ranksPerNode), x.costOptions),
                                        x.candidates, x.home, x.switches, x.options);
  } catch (const InvalidArgument&) {
    return;
  }
  // Feasible exactly when every piece exists and fits some candidate.
  bool feasible = !x.lengths.empty();
  for (int64_t s : x.lengths) {
    feasible = feasible && s >= 1 &&
               !(x.options.maxContext > 0 && s > x.options.maxContext && x.options.longSequences == LongSequences::kReject);
  }
  int64_t holds = 0;
  for (size_t c = 0; c < x.candidates.size(); ++c) holds = std::max(holds, planner->microBatchBudget(static_cast<int>(c)));
  std::vector<SequencePiece> pieces;
  if (feasible) {
    pieces = expectedPieces(x.lengths, x.options);
    for (const SequencePiece& p : pieces) feasible = feasible && p.length <= holds;
  }
  std::unique_ptr<StepPlan> plan;
  try {
    plan = std::make_unique<StepPlan>(planner->plan(x.lengths));
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(!feasible, "a feasible step was rejected: ", e.what());
    return;
  }
  FUZZ_CHECK(feasible, "an infeasible step was planned");
  FUZZ_CHECK(plan->pieces.size() == pieces.size(), plan->pieces.size(), " pieces, expected ", pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const SequencePiece& a = plan->pieces[i];
    const SequencePiece& b = pieces[i];
    FUZZ_CHECK(a.sequence == b.sequence && a.offset == b.offset && a.length == b.length, "piece ", i, " is ",
               a.sequence, "+", a.offset, ":", a.length, ", expected ", b.sequence, "+", b.offset, ":", b.length);
  }
  checkPlan(x, *planner, *plan);
  const std::string dump = testing::dumpStepPlan(*plan);
  FUZZ_CHECK(testing::dumpStepPlan(planner->plan(x.lengths)) == dump, "planning again gave another plan");
  const Planner fresh(CostModel(x.model, x.hardware, Topology(x.world, x.ranksPerNode), x.costOptions), x.candidates,
                      x.home, x.switches, x.options);
  FUZZ_CHECK(testing::dumpStepPlan(fresh.plan(x.lengths)) == dump, "a fresh planner gave another plan");
}

}  // namespace
}  // namespace fuzz
}  // namespace hotswitch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hotswitch::fuzz::FuzzInput in(data, size);
  hotswitch::fuzz::run(in);
  return 0;
}
