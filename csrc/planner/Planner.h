#pragma once

// The per-step planner: which sequences run under which layout, in which order, packed into
// which micro-batches, so that the step's predicted time — phases plus every switch — is
// smallest and no rank runs out of memory.
//
// The objective. An assignment puts every sequence (piece, see below) on one candidate
// layout that holds it (its length is at most the layout's micro-batch budget B_l). The
// sequences of one layout form one phase. The assignment's predicted step time is
//
//   J = sum over used layouts l of (E_l(S_l) + g_l)  +  C(used layouts other than home)
//
// E_l(S), the phase estimate of the sequence set S under layout l (dp, pp, terms u, v, o of
// CostModel.h), from the set's aggregates W = sum u(s), U = max u(s), V = max v(s),
// M = sum m(s):
//
//   E_l(S) = max(W / dp, U)                                 the slowest replica's work
//          + o * max(1, M / dp)                             fixed cost per micro-batch
//          + (pp - 1) * (max(V, min(W / dp, tau)) + o + 2 * p2p latency)   the 1F1B bubble
//
// It reads the packing policy of the Packer: with pp == 1, micro-batches are filled to the
// token budget, so a replica runs about its tokens / B micro-batches (m(s) = s / B); with
// pp > 1, micro-batches of about tau seconds, the smallest that keep the fixed cost o at most
// `microBatchOverheadShare` of their time (tau = min(alpha * B, o / share); tau = 0 when o is
// 0: one sequence per micro-batch), so m(s) = min(1, u(s) / tau) and the largest micro-batch
// takes max(V, min(W / dp, tau)). max(W / dp, U) is the least time in which any split of the
// work over dp replicas can finish. LPT packing comes close to it when a phase has many
// sequences per replica, the case of most phases of a long-tailed batch; with a few sequences
// per replica it can exceed it by up to one sequence's time, which the Packer's exchanges
// after LPT mostly close (Packer.h). (The list-
// scheduling bound W / dp + (1 - 1 / dp) * U, tried instead, overcharged the phases of many
// short sequences and gave slower plans in simulation.) Reported phase times come from the
// exact packing.
//
// g_l, the phase's gradients into the home accumulator (GradMethod): for the home layout its
// own reduction over the data group ("local"); otherwise the cheaper of reducing over l's
// data group and switching the reduced gradients home ("reduce"), and switching the unreduced
// summands home, summed during the switch ("partial"). C, the parameter switches: the cheapest cycle home -> each used
// non-home layout once -> home (exact over orders for up to kMaxOrderedLayouts layouts). The
// home phase, when used, runs first (first or last cost the same).
//
// The dynamic program. Sequences sorted by length are cut into contiguous buckets at
// candidate positions: all n + 1 when n <= boundaryCandidates, otherwise quantiles by count
// and by attention work (sum s^2), plus every position where a layout's budget stops holding
// the sequences. Over (cut, layout of the last bucket) it finds the exact minimum of
//
//   J_DP = sum over buckets b of (E_l(b)(S_b) + g_l(b)) + sum of params[l(b-1)][l(b)],
//
// buckets in increasing length, starting from and ending in the home layout, over those
// cuts, in O(cuts^2 * layouts) constant-time bucket estimates (prefix sums of tokens,
// squares and counts). Before it runs, layouts dominated for this step are dropped: l is
// dominated by l' when l' holds every length l holds up to the step's longest, costs no more
// for every length of the step (per replica and per sequence, bubble and fixed cost
// included), moves its gradients home no slower, and no switch into or out of l' costs more
// than into or out of l; replacing l by l' in any bucketing never raises J_DP, so the
// program's optimum is unchanged. The plan then merges buckets of one layout into one phase
// and orders the phases by the cheapest cycle; neither raises J (E is subadditive, g is paid
// once, and the length order is one of the orders C minimises over), so J(plan) <= J_DP.
// Every phase is then packed exactly (Packer) and timed by the cost model (CostModel::phase);
// under CUDA graph buckets (CostModel.h, 12) each bucket below the memory budget that holds
// the phase's longest piece is tried as the token budget too, and the packing priced lowest,
// its padding and the launches it saves weighed per micro-batch, is the phase's. E sees the
// graphs too: for a layout that runs them (pp == 1), E_l(S) is the lesser of the form above
// and, for each graph bucket b that holds the longest piece (CandidateModel::graphBuckets),
//
//   max(W / dp, U) + c * (o - graph saving + graph tp cost of b) + padding(c * b - N / dp)
//
// with N the set's tokens and c = max(1, ceil(N / (dp b))) micro-batches per replica filled
// to b, the last padded (its work priced as CostModel::graphAdded prices padding). Such a
// layout is never pruned as dominated: its fixed cost per micro-batch depends on the set.
// Last, by those exact times, the plan is compared with running the whole step as one phase
// under the home layout or under the best static layout (switched into from home and back),
// and the program's plan is kept only when it is predicted faster than the better of the two
// by at least `minGain` (singlePhaseFallback otherwise; off with exactFallback = false; a
// program's plan that is one of those two single phases is compared with the other as it is): the
// estimate decides the buckets, never at a predicted loss, or a gain within the model's error,
// against the layouts a user would otherwise run. StepPlan::programPlanSeconds and
// onePhaseSeconds give both sides of that choice.
//
// Recomputation. Each candidate layout is weighed once per recompute mode the options allow
// (`recompute`, Megatron-LM's granularities): a variant (layout, recompute) is a candidate of
// the program like any other, with its own terms and micro-batch budget, and switching
// between two variants of one layout costs nothing. Each step weighs a variant only where
// no cheaper variant of its layout (no dearer per token, sequence or micro-batch) holds the
// pieces it holds up to the step's longest: a step the plain layout holds never weighs its
// recomputing variants, so a bucket of short sequences runs without recomputation and only a
// bucket the plain layouts cannot hold, or hold only with more model-parallel ranks, pays
// for it. (This drops more than exact dominance would: a recomputing variant's larger
// micro-batches can save fixed costs per micro-batch, in the cost model's regimes far less
// than the forward it adds.) Every phase reports the
// mode it runs with (PlannedPhase::recompute); candidate indices stay indices into the
// candidate layouts.
//
// Sequences longer than `maxContext` (when set) are rejected, truncated to it, or split into
// pieces of at most maxContext tokens (`longSequences`); the plan lists its pieces and all
// indices refer to them. Deterministic: equal inputs give equal plans.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/CostModel.h"
#include "planner/Packer.h"
#include "planner/StepPlan.h"

namespace hotswitch {

enum class LongSequences { kReject = 0, kTruncate, kSplit };
// "reject", "truncate", "split"; InvalidArgument otherwise.
LongSequences parseLongSequences(const std::string& name);
const char* longSequencesName(LongSequences mode);

struct PlannerOptions {
  int boundaryCandidates = 128;
  int64_t maxContext = 0;  // 0: no limit
  LongSequences longSequences = LongSequences::kReject;
  double microBatchOverheadShare = 0.1;
  bool pruneDominated = true;
  // E weighs the micro-batches of a layout that runs CUDA graphs packed to its graph buckets
  // (false: as without graphs until the exact packing, the form before graphs; for comparison).
  bool graphEstimate = true;
  bool exactFallback = true;  // compare with one phase under home / best static, exactly
  // With exactFallback: the program's plan is kept only when it is predicted at least this
  // fraction faster than the best one-phase alternative (0.01: 1%); otherwise the step runs
  // as that one phase. >= 0.
  double minGain = 0.01;
  // Tokens one micro-batch may hold at most, whatever memory allows (Megatron's
  // micro-batch size times the sequence length); 0: memory alone decides.
  int64_t maxTokensPerMicroBatch = 0;
  // The recompute modes the planner may give a phase, each layout weighed with each; the
  // first is the one candidateModel(i) and objective() assume by default. Non-empty, no
  // mode twice.
  std::vector<Recompute> recompute = {Recompute::kNone};
};

// Seconds of the switches between candidates, from redistribution plans (see plan.py).
struct SwitchCosts {
  std::vector<std::vector<double>> params;  // [from][to], 0 on the diagonal
  // Per candidate: its phase's gradients, reduced over its data group, into the home
  // accumulator (0 for the home layout).
  std::vector<double> reducedGrads;
  // Per candidate: the unreduced summands into the home accumulator; empty: not offered.
  std::vector<double> partialGrads;
};

// What the objective knows of one candidate (see above). Bound as hotswitch._C.CandidateModel,
// with the names of StepPlan.h's rule (terms -> LayoutTerms).
struct CandidateModel {
  Layout layout{1, 1, 1};
  LayoutTerms terms;
  int dp = 1;
  int pp = 1;
  int64_t budget = 0;         // B: most tokens per micro-batch; 0: the weights do not fit
  double target = 0;          // tau (pp > 1)
  double gradSeconds = 0;     // g
  GradMethod gradMethod = GradMethod::kLocal;
  double reduceSeconds = 0;   // its own reduction over the data group
  Recompute recompute = Recompute::kNone;

  // The graph buckets (CostModel.h, 12) E weighs this variant's micro-batches packed to:
  // those within the budget whose attention is static, where the graphs save a fixed cost;
  // empty for a layout that runs no graphs.
  std::vector<int64_t> graphBuckets;

  // m(s): the micro-batches one sequence accounts for.
  double microBatchShare(int64_t s) const;
  // E from the aggregates of a non-empty set: `tokens` its tokens, `longest` its longest piece.
  double estimate(double work, double maxU, double maxV, double microBatches, double tokens, int64_t longest) const;
};

// J of one assignment, with its parts. Bound as hotswitch._C.ObjectiveValue (StepPlan.h's rule).
struct ObjectiveValue {
  double totalSeconds = 0;
  double switchSeconds = 0;           // C
  std::vector<double> phaseSeconds;   // per variant (see objective()): E + g, 0 when unused
  std::vector<int> order;             // used variants in run order
};

// One entry of a fixed plan, the bucket bounds and layouts a HotSPa user writes by hand:
// pieces of at most upperBound tokens (and longer than the previous entry's bound) run under
// candidate `candidate` with `recompute`.
struct FixedPlanEntry {
  int64_t upperBound = 0;
  int candidate = 0;
  Recompute recompute = Recompute::kNone;
};

class Planner {
 public:
  static constexpr int kMaxOrderedLayouts = 12;

  // candidates: layouts of the cost model's world; home: index of the home layout among
  // them. Throws InvalidArgument for mismatched sizes, negative or non-finite costs, or a
  // layout the model cannot use.
  Planner(CostModel cost, std::vector<Layout> candidates, int home, SwitchCosts switches,
          PlannerOptions options = {});

  // Throws InvalidArgument for an empty batch, a length < 1, a sequence longer than the max
  // context under kReject, or a piece no candidate holds (naming it and the longest that
  // fits).
  StepPlan plan(const std::vector<int64_t>& lengths) const;

  // The plan that a fixed bucketing gives (FixedPlanEntry), with the same pieces, packing,
  // phase order, switches and best static layout as plan(), never replaced by one phase
  // (singlePhaseFallback false; programSeconds and objectiveSeconds are J of its assignment).
  // Throws InvalidArgument naming the entry for no entries, bounds that do not increase, a
  // candidate outside the candidates, a recompute mode the options do not allow, or a bound
  // the layout cannot hold within the memory budget; and naming the length for a piece longer
  // than the last bound.
  StepPlan planFixed(const std::vector<int64_t>& lengths, const std::vector<FixedPlanEntry>& entries) const;
  void checkFixedPlan(const std::vector<FixedPlanEntry>& entries) const;

  // The pieces the plan cuts the lengths into (identity unless sequences exceed maxContext).
  std::vector<SequencePiece> pieces(const std::vector<int64_t>& lengths) const;

  // J of an arbitrary assignment of pieces (by length) to candidates, each run with the
  // recompute mode `recompute` gives it (empty: the options' first mode for all). Throws
  // InvalidArgument for mismatched sizes, an index outside the candidates, a mode the options
  // do not allow, a piece its layout cannot hold, or more than kMaxOrderedLayouts layouts
  // besides the home layout. phaseSeconds and order index the variants: candidate *
  // recompute modes + the mode's position in the options.
  ObjectiveValue objective(const std::vector<int64_t>& pieceLengths, const std::vector<int>& assignment,
                           const std::vector<Recompute>& recompute = {}) const;

  const std::vector<Layout>& candidates() const { return candidates_; }
  int home() const { return home_; }
  const CostModel& costModel() const { return cost_; }
  const SwitchCosts& switchCosts() const { return switches_; }
  const PlannerOptions& options() const { return options_; }
  // Candidate i under the options' first recompute mode, or under `recompute` (InvalidArgument
  // when the options do not allow it or i is outside the candidates).
  const CandidateModel& candidateModel(int i) const;
  const CandidateModel& candidateModel(int i, Recompute recompute) const;
  // The most tokens one micro-batch may hold under candidate i with any allowed recompute mode
  // (0 when even the weights do not fit).
  int64_t microBatchBudget(int i) const;

 private:
  // Variants: candidate layout i under the options' recompute mode r is variant
  // i * modes + r; the program and the objective run over variants.
  int modes() const { return static_cast<int>(options_.recompute.size()); }
  int layoutOf(int variant) const { return variant / modes(); }
  int variant(int candidate, Recompute recompute) const;
  int64_t computeBudget(const Layout& layout, const LayoutTerms& terms) const;
  // The cheapest cycle home -> layouts -> home and its order (exact up to
  // kMaxOrderedLayouts; beyond, the given order).
  double cycle(std::vector<int>& layouts) const;
  std::vector<bool> undominated(int64_t shortest, int64_t longest) const;
  bool dominates(int better, int worse, int64_t shortest, int64_t longest) const;
  // Whether variant w, of the same layout as v, costs no more per token, sequence and
  // micro-batch and holds what v holds up to `longest` (equal terms: the one holding more,
  // then the earlier).
  bool cheaperVariant(int w, int v, int64_t longest) const;
  // Phases (pieces per variant, first-seen order), switches, totals and the best static
  // layout of a plan; with `fallback`, one phase under home or the best static layout
  // replaces the phases unless they win by minGain. `order`: the pieces by length.
  void finish(StepPlan& out, const std::vector<std::vector<int>>& perLayout, const std::vector<int>& firstSeen,
              const std::vector<int64_t>& len, const std::vector<int>& order, int64_t longest, bool fallback) const;
  PlannedPhase makePhase(int candidate, std::vector<int> sequences, const std::vector<int64_t>& lengths) const;

  CostModel cost_;
  std::vector<Layout> candidates_;
  int home_;
  SwitchCosts switches_;
  PlannerOptions options_;
  std::vector<CandidateModel> models_;     // per variant
  std::vector<std::vector<double>> switchVariants_;  // params switches between variants
  int homeVariant_ = 0;                    // the home layout under the first mode
};

}  // namespace hotswitch
