#pragma once

// Plans cached per (tensor set, from placement, to placement, topology, options): a switch
// between two layouts seen before costs a map lookup.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "redistribute/RedistributionPlan.h"

namespace hotswitch {

struct CachedPlan {
  Placement from;
  Placement to;
  RedistributionPlan plan;
  double buildSeconds = 0;
};

class PlanCache {
 public:
  // Returns the cached plan or builds it (throws what Placement::make and
  // RedistributionPlan::build throw; nothing is cached then). Thread-safe; *hit tells
  // whether the plan was cached.
  std::shared_ptr<const CachedPlan> get(const TensorSet& set, const Layout& from,
                                        PlacementKind fromKind, const Layout& to,
                                        PlacementKind toKind, const Topology& topology,
                                        const PlanOptions& options = {}, bool* hit = nullptr);

  size_t size() const;
  void clear();

  static std::string key(const TensorSet& set, const Layout& from, PlacementKind fromKind,
                         const Layout& to, PlacementKind toKind, const Topology& topology,
                         const PlanOptions& options);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const CachedPlan>> plans_;
};

}  // namespace hotswitch
