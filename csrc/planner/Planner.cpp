#include "planner/Planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "common/Check.h"
#include "common/Logging.h"

namespace hotswitch {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
__extension__ typedef __int128 Wide;  // exact sums of squared lengths
// The best static layout is packed exactly among those whose estimate is this close to the
// best estimate.
constexpr double kStaticShortlist = 1.05;

// a + b * s + c * s^2 >= 0 for every s in [lo, hi].
bool nonNegativeOn(double a, double b, double c, double lo, double hi) {
  auto f = [&](double s) { return a + b * s + c * s * s; };
  if (f(lo) < 0 || f(hi) < 0) return false;
  if (c > 0) {
    const double s = -b / (2 * c);
    if (s > lo && s < hi && f(s) < 0) return false;
  }
  return true;
}

// Aggregates of a set of pieces under one candidate.
struct Aggregate {
  double work = 0, maxU = 0, maxV = 0, microBatches = 0, tokens = 0;
  int64_t longest = 0;
  bool empty = true;
  void add(const CandidateModel& m, int64_t s) {
    work += m.terms.u(s);
    maxU = std::max(maxU, m.terms.u(s));
    maxV = std::max(maxV, m.terms.v(s));
    microBatches += m.microBatchShare(s);
    tokens += static_cast<double>(s);
    longest = std::max(longest, s);
    empty = false;
  }
  double estimate(const CandidateModel& m) const {
    return m.estimate(work, maxU, maxV, microBatches, tokens, longest);
  }
};

}  // namespace

LongSequences parseLongSequences(const std::string& name) {
  if (name == "reject") return LongSequences::kReject;
  if (name == "truncate") return LongSequences::kTruncate;
  if (name == "split") return LongSequences::kSplit;
  HS_CHECK(false, "long_sequences '", name, "' is not one of reject, truncate, split");
  return LongSequences::kReject;
}

const char* longSequencesName(LongSequences mode) {
  switch (mode) {
    case LongSequences::kReject: return "reject";
    case LongSequences::kTruncate: return "truncate";
    case LongSequences::kSplit: return "split";
  }
  return "?";
}

double CandidateModel::microBatchShare(int64_t s) const {
  if (pp == 1) return static_cast<double>(s) / static_cast<double>(budget);
  return target > 0 ? std::min(1.0, terms.u(s) / target) : 1.0;
}

double CandidateModel::estimate(double work, double maxU, double maxV, double microBatches, double tokens,
                                int64_t longest) const {
  const double perReplica = work / dp;
  const double o = terms.microBatchSeconds;
  double e = std::max(perReplica, maxU) + o * std::max(1.0, microBatches / dp);
  if (pp > 1) e += (pp - 1) * (std::max(maxV, std::min(perReplica, target)) + o + 2.0 * terms.p2pLatency);
  // Micro-batches filled to a graph bucket, run from the graphs (Planner.h).
  const double replicaTokens = tokens / dp;
  for (int64_t bucket : graphBuckets) {
    if (bucket < longest) continue;
    const double b = static_cast<double>(bucket);
    const double count = std::max(1.0, std::ceil(replicaTokens / b));
    const double pad = std::max(0.0, count * b - replicaTokens);
    const double padding = terms.alpha() * pad + terms.beta * pad * pad + (pad > 0 ? terms.gamma : 0.0);
    const double fixed = o - terms.graphSavedSeconds + terms.graphTpAlpha * b + terms.graphTpMicroBatchSeconds;
    e = std::min(e, std::max(perReplica, maxU) + padding + count * fixed);
  }
  return e;
}

Planner::Planner(CostModel cost, std::vector<Layout> candidates, int home, SwitchCosts switches,
                 PlannerOptions options)
    : cost_(std::move(cost)), candidates_(std::move(candidates)), home_(home), switches_(std::move(switches)),
      options_(options) {
  const int n = static_cast<int>(candidates_.size());
  HS_CHECK(n >= 1, "the planner needs at least one candidate layout");
  HS_CHECK(std::isfinite(options_.minGain) && options_.minGain >= 0, "min_gain must be a fraction >= 0, got ",
           options_.minGain);
  HS_CHECK(home >= 0 && home < n, "home layout index ", home, " outside [0, ", n, ")");
  auto checkCost = [](double s, const char* what) {
    HS_CHECK(std::isfinite(s) && s >= 0, what, " entries must be finite and >= 0, got ", s);
  };
  HS_CHECK(static_cast<int>(switches_.params.size()) == n, "switch_seconds has ", switches_.params.size(),
           " rows, expected one per candidate (", n, ")");
  for (int i = 0; i < n; ++i) {
    const auto& row = switches_.params[i];
    HS_CHECK(static_cast<int>(row.size()) == n, "switch_seconds row ", i, " has ", row.size(),
             " entries, expected ", n);
    for (double s : row) checkCost(s, "switch_seconds");
    HS_CHECK(row[i] == 0, "switch_seconds[", i, "][", i, "] must be 0, got ", row[i]);
  }
  HS_CHECK(static_cast<int>(switches_.reducedGrads.size()) == n, "grad_seconds has ",
           switches_.reducedGrads.size(), " entries, expected ", n);
  for (double s : switches_.reducedGrads) checkCost(s, "grad_seconds");
  HS_CHECK(switches_.partialGrads.empty() || static_cast<int>(switches_.partialGrads.size()) == n,
           "grad_partial_seconds has ", switches_.partialGrads.size(), " entries, expected ", n, " or none");
  for (double s : switches_.partialGrads) checkCost(s, "grad_partial_seconds");
  HS_CHECK(options_.boundaryCandidates >= 2, "boundary_candidates must be >= 2, got ",
           options_.boundaryCandidates);
  HS_CHECK(options_.maxContext >= 0, "max_context must be >= 0 (0: no limit), got ", options_.maxContext);
  HS_CHECK(options_.maxTokensPerMicroBatch >= 0, "max_tokens_per_micro_batch must be >= 0 (0: no cap), got ",
           options_.maxTokensPerMicroBatch);
  HS_CHECK(options_.microBatchOverheadShare > 0 && options_.microBatchOverheadShare <= 1,
           "micro_batch_overhead_share must be in (0, 1], got ", options_.microBatchOverheadShare);
  HS_CHECK(!options_.recompute.empty(), "recompute must list at least one mode of none, selective, full");
  for (size_t a = 0; a < options_.recompute.size(); ++a) {
    for (size_t b = 0; b < a; ++b) {
      HS_CHECK(options_.recompute[a] != options_.recompute[b], "recompute lists '",
               recomputeName(options_.recompute[a]), "' twice");
    }
  }

  // The graph copies of every candidate that runs graphs stay while the others run (12).
  std::set<std::string> seen;
  int64_t copies = 0;
  for (const Layout& l : candidates_) {
    if (seen.insert(l.name()).second) copies += cost_.graphCopyBytes(l);
  }
  if (copies != cost_.options().graphCopiesHeldBytes) cost_ = cost_.withGraphCopiesHeld(copies);

  const int variants = n * modes();
  homeVariant_ = home_ * modes();
  switchVariants_.assign(variants, std::vector<double>(variants, 0.0));
  for (int v = 0; v < variants; ++v) {
    for (int w = 0; w < variants; ++w) switchVariants_[v][w] = switches_.params[layoutOf(v)][layoutOf(w)];
  }
  for (int v = 0; v < variants; ++v) {
    const int i = layoutOf(v);
    const Layout& l = candidates_[i];
    CandidateModel m;
    m.layout = l;
    m.recompute = options_.recompute[v % modes()];
    m.terms = cost_.terms(l, m.recompute);  // validates the layout against the model and world
    m.dp = l.dp();
    m.pp = l.pp();
    m.budget = computeBudget(l, m.terms);
    if (options_.maxTokensPerMicroBatch > 0) m.budget = std::min(m.budget, options_.maxTokensPerMicroBatch);
    if (m.pp > 1 && m.terms.microBatchSeconds > 0) {
      m.target = std::min(m.terms.alpha() * static_cast<double>(m.budget),
                          m.terms.microBatchSeconds / options_.microBatchOverheadShare);
    }
    if (options_.graphEstimate && m.terms.graphs && m.terms.graphSavedSeconds > 0) {
      for (int64_t bucket : cost_.options().graphBuckets) {
        if (bucket <= m.budget && bucket <= m.terms.graphMaxTokens) m.graphBuckets.push_back(bucket);
      }
    }
    m.reduceSeconds = m.terms.dpSeconds;
    if (i == home_) {
      m.gradSeconds = m.reduceSeconds;
      m.gradMethod = GradMethod::kLocal;
    } else {
      m.gradSeconds = m.reduceSeconds + switches_.reducedGrads[i];
      m.gradMethod = GradMethod::kReduce;
      if (!switches_.partialGrads.empty() && switches_.partialGrads[i] < m.gradSeconds) {
        m.gradSeconds = switches_.partialGrads[i];
        m.gradMethod = GradMethod::kPartial;
      }
    }
    models_.push_back(m);
  }
}

int Planner::variant(int candidate, Recompute recompute) const {
  const int n = static_cast<int>(candidates_.size());
  HS_CHECK(candidate >= 0 && candidate < n, "candidate ", candidate, " outside [0, ", n, ")");
  for (int r = 0; r < modes(); ++r) {
    if (options_.recompute[r] == recompute) return candidate * modes() + r;
  }
  HS_CHECK(false, "recompute '", recomputeName(recompute), "' is not among the planner's recompute modes");
  return 0;
}

const CandidateModel& Planner::candidateModel(int i) const { return models_[variant(i, options_.recompute[0])]; }

const CandidateModel& Planner::candidateModel(int i, Recompute recompute) const {
  return models_[variant(i, recompute)];
}

int64_t Planner::microBatchBudget(int i) const {
  const int first = variant(i, options_.recompute[0]);
  int64_t most = 0;
  for (int r = 0; r < modes(); ++r) most = std::max(most, models_[first + r].budget);
  return most;
}

int64_t Planner::computeBudget(const Layout& layout, const LayoutTerms& terms) const {
  // The largest T such that pp micro-batches of T tokens in flight fit (the 1F1B peak).
  auto fits = [&](int64_t tokens) {
    PhaseBatches batches(layout.dp(), std::vector<std::vector<int64_t>>(layout.pp(), {tokens}));
    return cost_.phase(layout, terms, batches).fits;
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

std::vector<SequencePiece> Planner::pieces(const std::vector<int64_t>& lengths) const {
  HS_CHECK(!lengths.empty(), "the step has no sequences; expected at least one");
  std::vector<SequencePiece> out;
  out.reserve(lengths.size());
  const int64_t cap = options_.maxContext;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t s = lengths[i];
    const int seq = static_cast<int>(i);
    HS_CHECK(s >= 1, "sequence ", i, " has length ", s, ", expected >= 1");
    if (cap == 0 || s <= cap) {
      out.push_back({seq, 0, s});
      continue;
    }
    switch (options_.longSequences) {
      case LongSequences::kReject:
        HS_CHECK(false, "sequence ", i, " has length ", s, ", longer than the max context of ", cap,
                 " tokens; truncate or split long sequences");
        break;
      case LongSequences::kTruncate:
        out.push_back({seq, 0, cap});
        break;
      case LongSequences::kSplit:
        for (int64_t offset = 0; offset < s; offset += cap) out.push_back({seq, offset, std::min(cap, s - offset)});
        break;
    }
  }
  return out;
}

double Planner::cycle(std::vector<int>& layouts) const {
  const auto& sw = switchVariants_;
  const int home_ = homeVariant_;
  const int m = static_cast<int>(layouts.size());
  if (m == 0) return 0;
  if (m > kMaxOrderedLayouts) {
    double c = sw[home_][layouts.front()] + sw[layouts.back()][home_];
    for (int k = 1; k < m; ++k) c += sw[layouts[k - 1]][layouts[k]];
    return c;
  }
  // Held-Karp: best[mask][j], the cheapest path from home through mask ending at layouts[j].
  const int full = (1 << m) - 1;
  std::vector<double> best((size_t{1} << m) * m, kInf);
  std::vector<int> prev((size_t{1} << m) * m, -1);
  auto at = [m](int mask, int j) { return static_cast<size_t>(mask) * m + j; };
  for (int j = 0; j < m; ++j) best[at(1 << j, j)] = sw[home_][layouts[j]];
  for (int mask = 1; mask <= full; ++mask) {
    for (int j = 0; j < m; ++j) {
      const double here = best[at(mask, j)];
      if (!(mask >> j & 1) || here == kInf) continue;
      for (int k = 0; k < m; ++k) {
        if (mask >> k & 1) continue;
        const double c = here + sw[layouts[j]][layouts[k]];
        if (c < best[at(mask | 1 << k, k)]) {
          best[at(mask | 1 << k, k)] = c;
          prev[at(mask | 1 << k, k)] = j;
        }
      }
    }
  }
  int last = 0;
  double total = kInf;
  for (int j = 0; j < m; ++j) {
    const double c = best[at(full, j)] + sw[layouts[j]][home_];
    if (c < total) {
      total = c;
      last = j;
    }
  }
  std::vector<int> order;
  for (int mask = full, j = last; j >= 0;) {
    order.push_back(layouts[j]);
    const int p = prev[at(mask, j)];
    mask &= ~(1 << j);
    j = p;
  }
  std::reverse(order.begin(), order.end());
  layouts = order;
  return total;
}

bool Planner::dominates(int better, int worse, int64_t shortest, int64_t longest) const {
  if (worse == homeVariant_ || better == worse) return false;
  const CandidateModel& a = models_[better];
  const CandidateModel& b = models_[worse];
  if (!b.graphBuckets.empty()) return false;  // its fixed cost depends on the set (Planner.h)
  if (a.budget < std::min(b.budget, longest)) return false;
  if (a.gradSeconds > b.gradSeconds) return false;
  const auto& sw = switchVariants_;
  for (int p = 0; p < static_cast<int>(models_.size()); ++p) {
    if (p == better || p == worse) continue;
    if (sw[p][better] > sw[p][worse] || sw[better][p] > sw[worse][p]) return false;
  }
  const double lo = static_cast<double>(shortest);
  const double hi = static_cast<double>(std::min(longest, b.budget));
  const LayoutTerms& ta = a.terms;
  const LayoutTerms& tb = b.terms;
  // Work per replica and the longest sequence, for every length the worse one holds.
  if (!nonNegativeOn(tb.gamma / b.dp - ta.gamma / a.dp, tb.alpha() / b.dp - ta.alpha() / a.dp,
                     tb.beta / b.dp - ta.beta / a.dp, lo, hi)) {
    return false;
  }
  if (!nonNegativeOn(tb.gamma - ta.gamma, tb.alpha() - ta.alpha(), tb.beta - ta.beta, lo, hi)) return false;
  // Fixed cost per micro-batch: any layout's micro-batches number at least tokens / B.
  const double oa = ta.microBatchSeconds, ob = tb.microBatchSeconds;
  if (oa > 0) {
    if (a.pp > 1 || oa > ob) return false;
    if (oa / (a.dp * static_cast<double>(a.budget)) > ob / (b.dp * static_cast<double>(b.budget))) return false;
  }
  if (a.pp > 1) {
    // Then oa == 0 and tau == 0: the bubble is (pp - 1) * (V + 2 * latency).
    if (b.pp < a.pp) return false;
    if (!nonNegativeOn(tb.gamma - ta.gamma, tb.alpha() + 2 * tb.p2pPerToken - ta.alpha() - 2 * ta.p2pPerToken,
                       tb.beta - ta.beta, lo, hi)) {
      return false;
    }
    if (2 * ta.p2pLatency > ob + 2 * tb.p2pLatency) return false;
  }
  return true;
}

std::vector<bool> Planner::undominated(int64_t shortest, int64_t longest) const {
  const int n = static_cast<int>(models_.size());
  std::vector<bool> alive(n);
  for (int l = 0; l < n; ++l) alive[l] = models_[l].budget >= shortest;
  // A variant is weighed only where no cheaper variant of its layout holds what it holds up
  // to the step's longest piece: recomputation buys memory, so a step whose pieces the plain
  // layout holds never pays for it. (Not exact: the larger micro-batches recomputation
  // allows could save fixed costs, never close to an extra forward in the cost model's
  // regimes.) Ties go to the mode listed first.
  for (int v = 0; v < n; ++v) {
    if (v == homeVariant_) continue;
    for (int w = layoutOf(v) * modes(); w < (layoutOf(v) + 1) * modes() && alive[v]; ++w) {
      if (w != v && cheaperVariant(w, v, longest)) alive[v] = false;
    }
  }
  if (!options_.pruneDominated) return alive;
  // One at a time, each against those still alive: dropping a layout some alive layout
  // dominates keeps the optimum of the remaining set, so by induction of the full set.
  for (int l = 0; l < n; ++l) {
    if (!alive[l] || l == homeVariant_) continue;
    for (int k = 0; k < n; ++k) {
      if (alive[k] && dominates(k, l, shortest, longest)) {
        alive[l] = false;
        break;
      }
    }
  }
  return alive;
}

bool Planner::cheaperVariant(int w, int v, int64_t longest) const {
  const CandidateModel& a = models_[w];
  const CandidateModel& b = models_[v];
  const LayoutTerms& ta = a.terms;
  const LayoutTerms& tb = b.terms;
  if (a.budget < std::min(b.budget, longest)) return false;
  if (ta.alpha() > tb.alpha() || ta.beta > tb.beta || ta.gamma > tb.gamma ||
      ta.microBatchSeconds > tb.microBatchSeconds || ta.p2pPerToken > tb.p2pPerToken) {
    return false;
  }
  const bool equal = ta.alpha() == tb.alpha() && ta.beta == tb.beta && ta.gamma == tb.gamma &&
                     ta.microBatchSeconds == tb.microBatchSeconds && ta.p2pPerToken == tb.p2pPerToken;
  if (!equal) return true;
  // Equal terms: the variant holding more stays, then the earlier.
  return a.budget != b.budget ? a.budget > b.budget : w < v;
}

PlannedPhase Planner::makePhase(int candidate, std::vector<int> sequences, const std::vector<int64_t>& lengths) const {
  const Layout& l = candidates_[layoutOf(candidate)];
  const CandidateModel& m = models_[candidate];
  std::vector<int64_t> local;
  local.reserve(sequences.size());
  for (int i : sequences) local.push_back(lengths[i]);
  PackOptions options;
  options.maxTokensPerMicroBatch = m.budget;
  if (m.pp > 1) options.targetMicroBatchCost = m.target > 0 ? m.target : std::numeric_limits<double>::min();
  const auto u = [&](int64_t s) { return m.terms.u(s); };
  Packing packing = Packer::pack(local, l.dp(), options, u);
  if (m.terms.graphs && !local.empty()) {
    // Under CUDA graphs (CostModel.h, 12) micro-batches packed to a bucket's tokens may pad
    // less than the budget's: each bucket below the budget that holds the longest piece is a
    // budget too, and the packing the cost model prices lowest runs.
    const int64_t longest = *std::max_element(local.begin(), local.end());
    double best = cost_.phase(l, m.terms, packing.lengths(local)).totalSeconds;
    for (int64_t bucket : cost_.options().graphBuckets) {
      if (bucket < longest || bucket >= m.budget || bucket > m.terms.graphMaxTokens) continue;
      PackOptions aligned = options;
      aligned.maxTokensPerMicroBatch = bucket;
      Packing other = Packer::pack(local, l.dp(), aligned, u);
      const double seconds = cost_.phase(l, m.terms, other.lengths(local)).totalSeconds;
      if (seconds < best) {
        best = seconds;
        packing = std::move(other);
      }
    }
  }
  for (auto& replica : packing.microBatches) {
    for (auto& mb : replica) {
      for (int& i : mb) i = sequences[i];  // back to piece indices
    }
  }
  Aggregate agg;
  for (int64_t s : local) agg.add(m, s);
  PlannedPhase phase;
  phase.candidate = layoutOf(candidate);
  phase.recompute = m.recompute;
  phase.layout = l;
  phase.sequences = std::move(sequences);
  phase.cost = cost_.phase(l, m.terms, packing.lengths(lengths));
  for (const auto& replica : packing.microBatches) {
    auto& cu = phase.cuSeqlens.emplace_back();
    auto& graphed = phase.graphTokens.emplace_back();
    for (const auto& mb : replica) {
      cu.push_back(Packer::cuSeqlens(lengths, mb));
      std::vector<int64_t> mbLengths;
      mbLengths.reserve(mb.size());
      for (int i : mb) mbLengths.push_back(lengths[i]);
      graphed.push_back(cost_.graphTokens(m.terms, mbLengths));
    }
  }
  phase.packing = std::move(packing);
  phase.estimateSeconds = agg.estimate(m);
  phase.gradSeconds = m.gradSeconds;
  phase.gradMethod = m.gradMethod;
  return phase;
}

ObjectiveValue Planner::objective(const std::vector<int64_t>& pieceLengths, const std::vector<int>& assignment,
                                  const std::vector<Recompute>& recompute) const {
  const int layouts = static_cast<int>(candidates_.size());
  const int n = static_cast<int>(models_.size());
  const int home_ = homeVariant_;
  HS_CHECK(!pieceLengths.empty(), "the objective needs at least one piece");
  HS_CHECK(assignment.size() == pieceLengths.size(), "assignment has ", assignment.size(),
           " entries, expected one per piece (", pieceLengths.size(), ")");
  HS_CHECK(recompute.empty() || recompute.size() == pieceLengths.size(), "recompute has ", recompute.size(),
           " entries, expected none or one per piece (", pieceLengths.size(), ")");
  std::vector<Aggregate> agg(n);
  for (size_t i = 0; i < pieceLengths.size(); ++i) {
    const int c = assignment[i];
    const int64_t s = pieceLengths[i];
    HS_CHECK(c >= 0 && c < layouts, "assignment[", i, "] = ", c, " outside the candidates [0, ", layouts, ")");
    HS_CHECK(s >= 1, "piece ", i, " has length ", s, ", expected >= 1");
    const int l = variant(c, recompute.empty() ? options_.recompute[0] : recompute[i]);
    HS_CHECK(s <= models_[l].budget, "piece ", i, " of length ", s, " does not fit candidate ", c, " (",
             candidates_[c].name(), ", recompute ", recomputeName(models_[l].recompute), "), which holds at most ",
             models_[l].budget, " tokens");
    agg[l].add(models_[l], s);
  }
  ObjectiveValue out;
  out.phaseSeconds.assign(n, 0.0);
  std::vector<int> others;
  for (int l = 0; l < n; ++l) {
    if (agg[l].empty) continue;
    out.phaseSeconds[l] = agg[l].estimate(models_[l]) + models_[l].gradSeconds;
    out.totalSeconds += out.phaseSeconds[l];
    if (l != home_) others.push_back(l);
  }
  HS_CHECK(static_cast<int>(others.size()) <= kMaxOrderedLayouts, "the assignment uses ", others.size(),
           " layouts besides the home layout; the objective orders at most ", kMaxOrderedLayouts);
  out.switchSeconds = cycle(others);
  out.totalSeconds += out.switchSeconds;
  if (!agg[home_].empty) out.order.push_back(home_);
  out.order.insert(out.order.end(), others.begin(), others.end());
  return out;
}

void Planner::finish(StepPlan& out, const std::vector<std::vector<int>>& perLayout, const std::vector<int>& firstSeen,
                     const std::vector<int64_t>& len, const std::vector<int>& order, int64_t longest,
                     bool fallback) const {
  const int L = static_cast<int>(models_.size());  // variants
  const auto& sw = switchVariants_;
  const int home_ = homeVariant_;
  std::vector<int64_t> sorted;  // the pieces' lengths in increasing order
  sorted.reserve(order.size());
  for (int i : order) sorted.push_back(len[i]);
  std::vector<int> others;
  for (int l : firstSeen) {
    if (l != home_) others.push_back(l);
  }
  const double switchCycle = cycle(others);
  std::vector<int> runOrder;
  if (!perLayout[home_].empty()) runOrder.push_back(home_);
  runOrder.insert(runOrder.end(), others.begin(), others.end());

  // Builds the plan's phases, switches and totals from phases in run order.
  auto assemble = [&](std::vector<PlannedPhase> phases, double switchSeconds) {
    out.phases.clear();
    out.objectiveSeconds = switchSeconds;
    out.totalSeconds = 0;
    const auto& layoutSw = switches_.params;  // phases name candidate layouts
    int prev = this->home_;
    for (PlannedPhase& phase : phases) {
      phase.switchInSeconds = layoutSw[prev][phase.candidate];
      if (!out.phases.empty()) out.phases.back().switchOutSeconds = phase.switchInSeconds;
      out.objectiveSeconds += phase.estimateSeconds + phase.gradSeconds;
      out.totalSeconds += phase.switchInSeconds + phase.cost.runSeconds() + phase.gradSeconds;
      prev = phase.candidate;
      out.phases.push_back(std::move(phase));
    }
    out.switchBackSeconds = layoutSw[prev][this->home_];
    out.phases.back().switchOutSeconds = out.switchBackSeconds;
    out.totalSeconds += out.switchBackSeconds;
  };
  {
    std::vector<PlannedPhase> phases;
    for (int l : runOrder) phases.push_back(makePhase(l, perLayout[l], len));
    assemble(std::move(phases), switchCycle);
  }

  // The best static layout: shortlisted by its estimate, decided by its exact packing.
  std::vector<double> staticEstimate(L, kInf);
  double bestEstimate = kInf;
  for (int l = 0; l < L; ++l) {
    const CandidateModel& m = models_[l];
    if (m.budget < longest) continue;
    Aggregate agg;
    for (int64_t s : sorted) agg.add(m, s);
    staticEstimate[l] = agg.estimate(m) + m.reduceSeconds;
    bestEstimate = std::min(bestEstimate, staticEstimate[l]);
  }
  std::vector<PlannedPhase> oneLayout(L);
  std::vector<bool> packed(L, false);
  auto wholeStep = [&](int l) -> const PlannedPhase& {
    if (!packed[l]) {
      oneLayout[l] = makePhase(l, order, len);
      packed[l] = true;
    }
    return oneLayout[l];
  };
  int bestStatic = -1;  // variant
  for (int l = 0; l < L; ++l) {
    if (staticEstimate[l] > bestEstimate * kStaticShortlist) continue;
    const double t = wholeStep(l).cost.totalSeconds;
    if (bestStatic < 0 || t < out.bestStaticSeconds) {
      bestStatic = l;
      out.bestStaticCandidate = layoutOf(l);
      out.bestStaticRecompute = models_[l].recompute;
      out.bestStaticSeconds = t;
      out.bestStaticObjectiveSeconds = staticEstimate[l];
    }
  }

  // The estimate chose the phases; the exact packing decides whether they beat the whole
  // step in one phase under the home layout or the best static layout by minGain.
  // When the program's plan is one of those single phases already, it needs no margin over
  // the other: the two are compared as they are, and the faster one runs.
  out.programPlanSeconds = out.totalSeconds;
  int alternative = -1;
  bool programIsOnePhase = false;
  for (int l : {home_, bestStatic}) {
    if (!fallback || l < 0 || models_[l].budget < longest) continue;
    if (out.phases.size() == 1 && out.phases[0].candidate == layoutOf(l) &&
        out.phases[0].recompute == models_[l].recompute) {
      programIsOnePhase = true;
      continue;  // the program's plan is this one phase already
    }
    const PlannedPhase& single = wholeStep(l);
    const double total = sw[home_][l] + single.cost.runSeconds() + single.gradSeconds + sw[l][home_];
    if (alternative < 0 || total < out.onePhaseSeconds) {
      alternative = l;
      out.onePhaseSeconds = total;
    }
  }
  const double margin = programIsOnePhase ? 0.0 : options_.minGain;
  if (alternative >= 0 && out.programPlanSeconds * (1 + margin) > out.onePhaseSeconds) {
    assemble({wholeStep(alternative)},
             alternative == home_ ? 0.0 : sw[home_][alternative] + sw[alternative][home_]);
    out.singlePhaseFallback = true;
  }
}

void Planner::checkFixedPlan(const std::vector<FixedPlanEntry>& entries) const {
  HS_CHECK(!entries.empty(), "a fixed plan needs at least one entry (upper length bound, layout, recompute)");
  const int layouts = static_cast<int>(candidates_.size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const FixedPlanEntry& e = entries[k];
    HS_CHECK(e.candidate >= 0 && e.candidate < layouts, "fixed plan entry ", k, ": candidate ", e.candidate,
             " outside the candidates [0, ", layouts, ")");
    const std::string what = "fixed plan entry " + std::to_string(k) + " (up to " + std::to_string(e.upperBound) +
                             " tokens under " + candidates_[e.candidate].name() + ", recompute " +
                             recomputeName(e.recompute) + ")";
    HS_CHECK(e.upperBound >= 1, what, ": the upper length bound must be >= 1");
    HS_CHECK(k == 0 || e.upperBound > entries[k - 1].upperBound, what, ": upper length bounds must increase, after ",
             entries[k - 1].upperBound);
    HS_CHECK(std::find(options_.recompute.begin(), options_.recompute.end(), e.recompute) != options_.recompute.end(),
             what, ": the planner's options do not allow recompute ", recomputeName(e.recompute));
    const int64_t budget = models_[variant(e.candidate, e.recompute)].budget;
    HS_CHECK(e.upperBound <= budget, what, ": the layout holds at most ", budget,
             " tokens per micro-batch within the memory budget");
  }
}

StepPlan Planner::planFixed(const std::vector<int64_t>& lengths, const std::vector<FixedPlanEntry>& entries) const {
  checkFixedPlan(entries);
  StepPlan out;
  out.pieces = pieces(lengths);
  const int n = static_cast<int>(out.pieces.size());
  std::vector<int64_t> len(n);
  for (int i = 0; i < n; ++i) len[i] = out.pieces[i].length;
  const int64_t longest = *std::max_element(len.begin(), len.end());
  HS_CHECK(longest <= entries.back().upperBound, "a sequence of length ", longest, " is longer than the fixed "
           "plan's last upper bound (", entries.back().upperBound, " tokens under ",
           candidates_[entries.back().candidate].name(), "): the plan must cover every length");
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len[a] < len[b]; });
  // Each piece to the first entry whose bound holds it; one phase per (layout, recompute).
  std::vector<std::vector<int>> perLayout(models_.size());
  std::vector<int> firstSeen;
  size_t k = 0;
  for (int i : order) {
    while (len[i] > entries[k].upperBound) ++k;
    const int v = variant(entries[k].candidate, entries[k].recompute);
    if (perLayout[v].empty()) firstSeen.push_back(v);
    perLayout[v].push_back(i);
  }
  out.candidatesUsed = static_cast<int>(firstSeen.size());
  finish(out, perLayout, firstSeen, len, order, longest, false);
  out.programSeconds = out.objectiveSeconds;  // no program ran: J of the fixed assignment
  return out;
}

StepPlan Planner::plan(const std::vector<int64_t>& lengths) const {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto msSince = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  StepPlan out;
  out.pieces = pieces(lengths);
  const int n = static_cast<int>(out.pieces.size());
  std::vector<int64_t> len(n);
  for (int i = 0; i < n; ++i) len[i] = out.pieces[i].length;
  const int64_t longest = *std::max_element(len.begin(), len.end());
  const int64_t shortest = *std::min_element(len.begin(), len.end());
  int64_t maxBudget = 0;
  for (const CandidateModel& m : models_) maxBudget = std::max(maxBudget, m.budget);
  HS_CHECK(longest <= maxBudget, "a sequence of length ", longest, " fits no candidate layout; the longest "
           "that fits is ", maxBudget, " tokens");

  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len[a] < len[b]; });
  std::vector<int64_t> sorted(n);
  for (int i = 0; i < n; ++i) sorted[i] = len[order[i]];
  // Exact prefix sums of tokens and squares over the sorted pieces, in 128 bits: a piece may
  // be as long as a budget allows (up to 2^40 tokens), and its square overflows int64.
  std::vector<Wide> tokens(n + 1, 0), squares(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    tokens[i + 1] = tokens[i] + sorted[i];
    squares[i + 1] = squares[i] + static_cast<Wide>(sorted[i]) * sorted[i];
  }

  const std::vector<bool> alive = undominated(shortest, longest);
  std::vector<int> layouts;
  for (int l = 0; l < static_cast<int>(alive.size()); ++l) {
    if (alive[l]) layouts.push_back(l);
  }
  out.candidatesUsed = static_cast<int>(layouts.size());

  // Candidate cut positions in the sorted order.
  std::vector<int> cuts;
  if (n <= options_.boundaryCandidates) {
    cuts.resize(n + 1);
    std::iota(cuts.begin(), cuts.end(), 0);
  } else {
    const int q = options_.boundaryCandidates / 2;
    for (int k = 0; k <= q; ++k) {
      cuts.push_back(static_cast<int>(static_cast<int64_t>(n) * k / q));
      const double work = static_cast<double>(squares[n]) * k / q;
      cuts.push_back(static_cast<int>(std::lower_bound(squares.begin(), squares.end(), work,
                                                       [](Wide a, double b) { return static_cast<double>(a) < b; }) -
                                      squares.begin()));
    }
    for (int l : layouts) {
      cuts.push_back(static_cast<int>(std::upper_bound(sorted.begin(), sorted.end(), models_[l].budget) - sorted.begin()));
    }
    for (int& c : cuts) c = std::clamp(c, 0, n);
    cuts.push_back(0);
    cuts.push_back(n);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  const int K = static_cast<int>(cuts.size());
  const int L = static_cast<int>(models_.size());  // variants
  const auto& sw = switchVariants_;
  const int home_ = homeVariant_;

  // Per layout: where u(s) reaches tau in the sorted order (pp > 1): below it a piece is a
  // share u / tau of a micro-batch, from it on a whole one.
  std::vector<int> whole(L, n);
  for (int l : layouts) {
    const CandidateModel& m = models_[l];
    if (m.pp == 1) continue;
    if (m.target <= 0) {
      whole[l] = 0;
      continue;
    }
    whole[l] = static_cast<int>(std::partition_point(sorted.begin(), sorted.end(),
                                                     [&](int64_t s) { return m.terms.u(s) < m.target; }) -
                                sorted.begin());
  }

  // best[b][l]: the cheapest J_DP of the first cuts[b] pieces with the last bucket under l;
  // enter[b][l]: the cheapest way to have run them and switched into l.
  std::vector<double> best(static_cast<size_t>(K) * L, kInf), enter(static_cast<size_t>(K) * L, kInf);
  std::vector<int> fromCut(static_cast<size_t>(K) * L, -1), enterFrom(static_cast<size_t>(K) * L, -1);
  auto at = [L](int b, int l) { return static_cast<size_t>(b) * L + l; };
  for (int l : layouts) {
    enter[at(0, l)] = sw[home_][l];
    enterFrom[at(0, l)] = home_;
  }
  for (int b = 1; b < K; ++b) {
    const int hi = cuts[b];
    const int64_t last = sorted[hi - 1];
    for (int l : layouts) {
      const CandidateModel& m = models_[l];
      if (m.budget < last) continue;
      const LayoutTerms& t = m.terms;
      const double alpha = t.alpha();
      const double maxU = t.u(last), maxV = t.v(last);
      const double invTarget = m.target > 0 ? 1.0 / m.target : 0.0;
      const double invBudget = 1.0 / static_cast<double>(m.budget);
      double bestHere = kInf;
      int bestCut = -1;
      for (int a = 0; a < b; ++a) {
        const double in = enter[at(a, l)];
        if (in == kInf) continue;
        const int lo = cuts[a];
        const double work = alpha * static_cast<double>(tokens[hi] - tokens[lo]) +
                            t.beta * static_cast<double>(squares[hi] - squares[lo]) + t.gamma * (hi - lo);
        double microBatches;
        if (m.pp == 1) {
          microBatches = static_cast<double>(tokens[hi] - tokens[lo]) * invBudget;
        } else {
          const int mid = std::clamp(whole[l], lo, hi);
          const double partial = alpha * static_cast<double>(tokens[mid] - tokens[lo]) +
                                 t.beta * static_cast<double>(squares[mid] - squares[lo]) + t.gamma * (mid - lo);
          microBatches = partial * invTarget + (hi - mid);
        }
        const double e = m.estimate(work, maxU, maxV, microBatches, static_cast<double>(tokens[hi] - tokens[lo]), last);
        const double total = in + e;
        if (total < bestHere) {
          bestHere = total;
          bestCut = a;
        }
      }
      if (bestCut < 0) continue;
      best[at(b, l)] = bestHere + m.gradSeconds;
      fromCut[at(b, l)] = bestCut;
    }
    if (b == K - 1) break;
    for (int l : layouts) {
      for (int p : layouts) {
        const double c = best[at(b, p)] + sw[p][l];
        if (c < enter[at(b, l)]) {
          enter[at(b, l)] = c;
          enterFrom[at(b, l)] = p;
        }
      }
    }
  }
  int lastLayout = -1;
  out.programSeconds = kInf;
  for (int l : layouts) {
    const double t = best[at(K - 1, l)] + sw[l][home_];
    if (t < out.programSeconds) {
      out.programSeconds = t;
      lastLayout = l;
    }
  }
  HS_INTERNAL_CHECK(lastLayout >= 0, "no plan found although a layout holds every sequence");

  const double programMs = msSince(started);
  // Buckets from the last back, merged per layout.
  std::vector<std::vector<int>> perLayout(L);
  std::vector<int> firstSeen;  // layouts in length order of their first bucket
  {
    std::vector<std::pair<int, int>> buckets;  // (cut index, layout), last first
    for (int b = K - 1, l = lastLayout; b > 0;) {
      buckets.push_back({b, l});
      const int a = fromCut[at(b, l)];
      const int p = enterFrom[at(a, l)];
      b = a;
      l = p;
    }
    std::reverse(buckets.begin(), buckets.end());
    int prevCut = 0;
    for (auto [b, l] : buckets) {
      if (perLayout[l].empty()) firstSeen.push_back(l);
      perLayout[l].insert(perLayout[l].end(), order.begin() + cuts[prevCut], order.begin() + cuts[b]);
      prevCut = b;
    }
  }
  finish(out, perLayout, firstSeen, len, order, longest, options_.exactFallback);
  HS_LOG_DEBUG("planner", n, " pieces, ", K, " cuts, ", layouts.size(), " of ", L, " layouts: ",
               out.phases.size(), " phases, predicted ", out.totalSeconds, " s (objective ", out.objectiveSeconds,
               " s) vs best static ", out.bestStaticSeconds, " s; planned in ", msSince(started), " ms (program ",
               programMs, " ms)");
  return out;
}

}  // namespace hotswitch
