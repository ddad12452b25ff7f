#pragma once

// The per-step planner: which sequences run under which layout, in which order, packed into
// which micro-batches, so that the step's predicted time — phases plus every switch — is
// smallest and no rank runs out of memory.
//
// Sequences are sorted by length and cut into contiguous buckets at candidate boundaries
// (every distinct length for small batches, otherwise `boundaryCandidates` length quantiles).
// A dynamic program over (boundary, layout of the last bucket) finds the exact optimum over
// those cuts: a bucket may only use a layout whose micro-batch budget holds its longest
// sequence; its time is the cost model's prediction for the packing the Packer makes; a
// switch costs the caller's switchSeconds[from][to] (parameters) and gradSeconds[layout]
// (moving its gradients home). The step starts and ends in the home layout, and phases run
// from the shortest bucket to the longest.

#include <cstdint>
#include <vector>

#include "planner/CostModel.h"
#include "planner/Packer.h"

namespace hotswitch {

struct PlannerOptions {
  int boundaryCandidates = 32;
};

struct PlannedPhase {
  Layout layout;
  std::vector<int> sequences;  // indices into the step's lengths
  Packing packing;             // indices into the step's lengths
  PhaseCost cost;
  double switchInSeconds = 0;  // parameters into this layout from the previous one
  double gradSeconds = 0;      // its gradients into the home layout
};

struct StepPlan {
  std::vector<PlannedPhase> phases;
  double switchBackSeconds = 0;  // parameters back into the home layout
  double totalSeconds = 0;
  // The single layout that holds the longest sequence and is fastest over the whole batch.
  int bestStaticLayout = -1;  // index into the candidates
  double bestStaticSeconds = 0;
};

class Planner {
 public:
  // candidates: layouts of the cost model's world; home: index of the home layout among
  // them; switchSeconds: candidates x candidates; gradSeconds: one per candidate (0 for the
  // home layout). Throws InvalidArgument for mismatched sizes, negative costs, or a layout
  // the model cannot use.
  Planner(CostModel cost, std::vector<Layout> candidates, int home,
          std::vector<std::vector<double>> switchSeconds, std::vector<double> gradSeconds,
          PlannerOptions options = {});

  // Throws InvalidArgument for an empty batch, a length < 1, or a sequence no candidate
  // holds (naming it and the longest that fits).
  StepPlan plan(const std::vector<int64_t>& lengths) const;

  const std::vector<Layout>& candidates() const { return candidates_; }
  // The most tokens one micro-batch may hold under candidate i (0 when even the weights do
  // not fit).
  int64_t microBatchBudget(int i) const { return budgets_.at(i); }

 private:
  int64_t computeBudget(const Layout& layout) const;
  PlannedPhase makePhase(int layout, std::vector<int> sequences, const std::vector<int64_t>& lengths) const;

  CostModel cost_;
  std::vector<Layout> candidates_;
  int home_;
  std::vector<std::vector<double>> switchSeconds_;
  std::vector<double> gradSeconds_;
  PlannerOptions options_;
  std::vector<int64_t> budgets_;
};

}  // namespace hotswitch
