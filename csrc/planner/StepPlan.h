#pragma once

// The step plan: what Planner::plan returns for one step (see Planner.h for how it is
// chosen). Plain data, no behaviour.
//
// Names across the binding. hotswitch._C binds each struct here as a class of the same name
// with read-only properties; every field keeps its name, in snake_case
// (switchInSeconds -> switch_in_seconds, bestStaticCandidate -> best_static_candidate), a
// nested struct is its own class (PlannedPhase::cost -> PhaseCost, ::packing -> Packing), a
// const method without arguments is a property (PhaseCost::runSeconds() -> run_seconds) and
// a GradMethod is its name (gradMethodName: "local", "reduce", "partial"), as is a Recompute
// (recomputeName: "none", "selective", "full"). So
//   C++ plan.phases[k].cost.peakBytes  ==  Python plan.phases[k].cost.peak_bytes.
// Seconds end in Seconds (Python: _seconds); "candidate" is always an index into the
// planner's candidate layouts.

#include <cstdint>
#include <vector>

#include "layout/Layout.h"
#include "planner/CostModel.h"
#include "planner/Packer.h"

namespace hotswitch {

// How a phase's gradients reach the home layout's accumulator.
enum class GradMethod {
  kLocal = 0,  // the home layout's own reduction (reduce-scatter under ZeRO): nothing switched
  kReduce,     // reduce over the phase's data group, then switch the result home
  kPartial,    // switch the unreduced summands home, summed during the switch
};

// "local", "reduce", "partial": the words Python uses (RuntimeConfig.grad_method).
inline const char* gradMethodName(GradMethod method) {
  switch (method) {
    case GradMethod::kLocal: return "local";
    case GradMethod::kReduce: return "reduce";
    case GradMethod::kPartial: return "partial";
  }
  return "?";
}

// A sequence or a piece of one: tokens [offset, offset + length) of sequence `sequence`.
struct SequencePiece {
  int sequence = 0;
  int64_t offset = 0;
  int64_t length = 0;

  bool operator==(const SequencePiece& o) const {
    return sequence == o.sequence && offset == o.offset && length == o.length;
  }
};

// One bucket's work: its pieces under one layout, packed into micro-batches.
struct PlannedPhase {
  int candidate = 0;
  Layout layout{1, 1, 1};
  std::vector<int> sequences;  // indices into StepPlan::pieces
  Packing packing;             // indices into StepPlan::pieces
  // cu_seqlens of every micro-batch, [replica][k]: [0, l0, l0 + l1, ...] over its pieces.
  std::vector<std::vector<std::vector<int64_t>>> cuSeqlens;
  PhaseCost cost;              // exact packing; cost.runSeconds() is the phase's run time
  // graphTokens[replica][k]: the CUDA graph bucket micro-batch k runs padded to, 0 where it
  // runs as it is (CostModel::graphTokens; CostModel.h, 12).
  std::vector<std::vector<int64_t>> graphTokens;
  double estimateSeconds = 0;  // E
  double switchInSeconds = 0;  // parameters from the previous phase's layout (home first)
  double switchOutSeconds = 0;  // parameters to the next phase's layout (home after the last)
  double gradSeconds = 0;       // gradients into the home accumulator
  GradMethod gradMethod = GradMethod::kLocal;
  Recompute recompute = Recompute::kNone;  // activation recomputation of the phase's layers
};

struct StepPlan {
  std::vector<SequencePiece> pieces;
  std::vector<PlannedPhase> phases;  // in run order
  double switchBackSeconds = 0;      // parameters back into the home layout
  // sum over phases of (switch in + run + grad) + switch back, from the exact packing.
  double totalSeconds = 0;
  double objectiveSeconds = 0;  // J of the plan's assignment
  double programSeconds = 0;    // J_DP of the dynamic program's optimum (>= objectiveSeconds)
  int candidatesUsed = 0;       // (layout, recompute) candidates left after dropping dominated ones
  bool singlePhaseFallback = false;  // one phase under home or best static beat the program's plan
  // The choice between the program's plan and one phase (Planner.h): the program's plan's
  // total (exact packing, switches included) and the best one-phase alternative's, under home
  // or the best static layout with the switches into it and back; 0 where not compared.
  double programPlanSeconds = 0;
  double onePhaseSeconds = 0;
  // The single layout that holds the longest piece and is fastest over the whole batch, run
  // as its own home (no switches; its own gradient reduction): what a Megatron-LM user runs.
  int bestStaticCandidate = -1;
  Recompute bestStaticRecompute = Recompute::kNone;
  double bestStaticSeconds = 0;           // exact packing
  double bestStaticObjectiveSeconds = 0;  // E + its reduction
};

}  // namespace hotswitch
