#include "planner/Planner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "common/Check.h"
#include "common/Logging.h"

namespace hotswitch {

Planner::Planner(CostModel cost, std::vector<Layout> candidates, int home,
                 std::vector<std::vector<double>> switchSeconds, std::vector<double> gradSeconds,
                 PlannerOptions options)
    : cost_(std::move(cost)), candidates_(std::move(candidates)), home_(home),
      switchSeconds_(std::move(switchSeconds)), gradSeconds_(std::move(gradSeconds)), options_(options) {
  const int n = static_cast<int>(candidates_.size());
  HS_CHECK(n >= 1, "the planner needs at least one candidate layout");
  HS_CHECK(home >= 0 && home < n, "home layout index ", home, " outside [0, ", n, ")");
  HS_CHECK(static_cast<int>(switchSeconds_.size()) == n, "switch_seconds has ", switchSeconds_.size(),
           " rows, expected one per candidate (", n, ")");
  for (const auto& row : switchSeconds_) {
    HS_CHECK(static_cast<int>(row.size()) == n, "switch_seconds row has ", row.size(), " entries, expected ", n);
    for (double s : row) HS_CHECK(s >= 0, "switch_seconds entries must be >= 0, got ", s);
  }
  HS_CHECK(static_cast<int>(gradSeconds_.size()) == n, "grad_seconds has ", gradSeconds_.size(),
           " entries, expected ", n);
  for (double s : gradSeconds_) HS_CHECK(s >= 0, "grad_seconds entries must be >= 0, got ", s);
  HS_CHECK(options_.boundaryCandidates >= 1, "boundary_candidates must be >= 1, got ",
           options_.boundaryCandidates);
  for (const Layout& l : candidates_) {
    cost_.model().validate(l);
    l.validate(cost_.topology().world());
    budgets_.push_back(computeBudget(l));
  }
}

int64_t Planner::computeBudget(const Layout& layout) const {
  // The largest T such that pp micro-batches of T tokens in flight fit (the 1F1B peak).
  auto fits = [&](int64_t tokens) {
    PhaseBatches batches(layout.dp(), std::vector<std::vector<int64_t>>(layout.pp(), {tokens}));
    return cost_.phase(layout, batches).fits;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi < (int64_t{1} << 40) && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

PlannedPhase Planner::makePhase(int layout, std::vector<int> sequences, const std::vector<int64_t>& lengths) const {
  const Layout& l = candidates_[layout];
  std::vector<int64_t> local;
  for (int i : sequences) local.push_back(lengths[i]);
  PackOptions options{budgets_[layout], l.pp()};
  Packing packing = Packer::pack(local, l.dp(), options, [&](int64_t s) { return cost_.trainingFlops(s); });
  for (auto& replica : packing.microBatches) {
    for (auto& mb : replica) {
      for (int& i : mb) i = sequences[i];  // back to step indices
    }
  }
  PlannedPhase phase{l, std::move(sequences), packing, {}, 0, gradSeconds_[layout]};
  phase.cost = cost_.phase(l, packing.lengths(lengths));
  return phase;
}

StepPlan Planner::plan(const std::vector<int64_t>& lengths) const {
  const int n = static_cast<int>(lengths.size());
  HS_CHECK(n >= 1, "the step has no sequences; expected at least one");
  for (int i = 0; i < n; ++i) HS_CHECK(lengths[i] >= 1, "sequence ", i, " has length ", lengths[i], ", expected >= 1");
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t maxBudget = *std::max_element(budgets_.begin(), budgets_.end());
  HS_CHECK(longest <= maxBudget, "a sequence of length ", longest, " fits no candidate layout; the longest "
           "that fits is ", maxBudget, " tokens");

  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lengths[a] < lengths[b]; });

  // Candidate cut positions in the sorted order: between distinct lengths, thinned to
  // quantiles when there are more than the option allows.
  std::vector<int> cuts{0};
  for (int i = 1; i < n; ++i) {
    if (lengths[order[i]] != lengths[order[i - 1]]) cuts.push_back(i);
  }
  if (static_cast<int>(cuts.size()) > options_.boundaryCandidates) {
    std::vector<int> thinned;
    for (int q = 0; q < options_.boundaryCandidates; ++q) {
      thinned.push_back(cuts[static_cast<size_t>(q) * cuts.size() / options_.boundaryCandidates]);
    }
    cuts = thinned;
  }
  cuts.push_back(n);
  const int K = static_cast<int>(cuts.size());
  const int L = static_cast<int>(candidates_.size());

  auto slice = [&](int a, int b) {
    return std::vector<int>(order.begin() + cuts[a], order.begin() + cuts[b]);
  };
  // best[b][l]: the fastest way to run the first cuts[b] sequences ending in layout l.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(K, std::vector<double>(L, kInf));
  std::vector<std::vector<std::pair<int, int>>> from(K, std::vector<std::pair<int, int>>(L, {-1, -1}));
  best[0][home_] = 0;
  for (int b = 1; b < K; ++b) {
    for (int a = 0; a < b; ++a) {
      const int64_t bucketLongest = lengths[order[cuts[b] - 1]];
      for (int l = 0; l < L; ++l) {
        if (budgets_[l] < bucketLongest) continue;
        double enter = kInf;
        int via = -1;
        for (int p = 0; p < L; ++p) {
          if (best[a][p] == kInf) continue;
          double c = best[a][p] + (p == l ? 0 : switchSeconds_[p][l]);
          if (c < enter) {
            enter = c;
            via = p;
          }
        }
        if (via < 0) continue;
        double total = enter + makePhase(l, slice(a, b), lengths).cost.totalSeconds + gradSeconds_[l];
        if (total < best[b][l]) {
          best[b][l] = total;
          from[b][l] = {a, via};
        }
      }
    }
  }
  int last = -1;
  double bestTotal = kInf;
  for (int l = 0; l < L; ++l) {
    double t = best[K - 1][l] + (l == home_ ? 0 : switchSeconds_[l][home_]);
    if (t < bestTotal) {
      bestTotal = t;
      last = l;
    }
  }
  HS_INTERNAL_CHECK(last >= 0, "no plan found although a layout holds every sequence");

  StepPlan out;
  std::vector<std::pair<int, int>> buckets;  // (cut index b, layout), last first
  for (int b = K - 1, l = last; b > 0;) {
    buckets.push_back({b, l});
    auto [a, p] = from[b][l];
    b = a;
    l = p;
  }
  std::reverse(buckets.begin(), buckets.end());
  int prevCut = 0, prevLayout = home_;
  for (auto [b, l] : buckets) {
    // Adjacent buckets may share a layout: the program found them cheaper apart (e.g. each
    // packs better alone), so they stay separate phases with no switch between.
    PlannedPhase phase = makePhase(l, slice(prevCut, b), lengths);
    phase.switchInSeconds = l == prevLayout ? 0 : switchSeconds_[prevLayout][l];
    out.phases.push_back(std::move(phase));
    prevCut = b;
    prevLayout = l;
  }
  out.switchBackSeconds = last == home_ ? 0 : switchSeconds_[last][home_];
  out.totalSeconds = out.switchBackSeconds;
  for (const PlannedPhase& p : out.phases) {
    out.totalSeconds += p.switchInSeconds + p.cost.totalSeconds + p.gradSeconds;
  }

  std::vector<int> everything(order.begin(), order.end());
  for (int l = 0; l < L; ++l) {
    if (budgets_[l] < longest) continue;
    double t = makePhase(l, everything, lengths).cost.totalSeconds;
    if (out.bestStaticLayout < 0 || t < out.bestStaticSeconds) {
      out.bestStaticLayout = l;
      out.bestStaticSeconds = t;
    }
  }
  HS_LOG_DEBUG("planner", n, " sequences: ", out.phases.size(), " phases, predicted ", out.totalSeconds,
               " s vs best static ", out.bestStaticSeconds, " s");
  return out;
}

}  // namespace hotswitch
