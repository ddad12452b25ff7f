#include "redistribute/PlanCache.h"

#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/Check.h"
#include "common/Logging.h"

namespace hotswitch {

namespace {

// A double's exact bits: keys of plans for different bandwidths never collide.
uint64_t bitsOf(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

}  // namespace

std::string PlanCache::key(const TensorSet& set, const Layout& from, PlacementKind fromKind,
                           const Layout& to, PlacementKind toKind, const Topology& topology,
                           const PlanOptions& options) {
  return str(set.fingerprint(), "|", from.name(), ":", placementKindName(fromKind), "|", to.name(),
             ":", placementKindName(toKind), "|", topology.world(), "/", topology.ranksPerNode(),
             "|", static_cast<int>(options.senderPolicy), "|", bitsOf(options.intraNodeBandwidth), "/",
             bitsOf(options.interNodeBandwidth));
}

std::shared_ptr<const CachedPlan> PlanCache::get(const TensorSet& set, const Layout& from,
                                                 PlacementKind fromKind, const Layout& to,
                                                 PlacementKind toKind, const Topology& topology,
                                                 const PlanOptions& options, bool* hit) {
  const std::string k = key(set, from, fromKind, to, toKind, topology, options);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(k);
    if (it != plans_.end()) {
      if (hit) *hit = true;
      return it->second;
    }
  }
  if (hit) *hit = false;
  from.validate(topology.world());
  to.validate(topology.world());
  const auto start = std::chrono::steady_clock::now();
  Placement a = Placement::make(set, from, fromKind);
  Placement b = Placement::make(set, to, toKind);
  RedistributionPlan plan = RedistributionPlan::build(set, a, b, topology, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto made = std::make_shared<const CachedPlan>(CachedPlan{std::move(a), std::move(b), std::move(plan), seconds});
  HS_LOG_INFO("planner", "built plan ", from.name(), ":", placementKindName(fromKind), " -> ",
              to.name(), ":", placementKindName(toKind), " in ", seconds * 1e3, " ms: ",
              made->plan.summary());
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.emplace(k, made).first->second;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
}

}  // namespace hotswitch
