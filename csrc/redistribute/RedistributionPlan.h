#pragma once

// The transfers that take a tensor set from one placement to another over the same world.
//
// Every destination element arrives exactly once (for a kPartial source: once per summand,
// and the destination is their sum); an element the destination rank already holds is a
// local copy. Among the replicas that hold an element, senders are chosen, in this order
// of priority, for the fewest inter-node bytes, then the smallest largest per-rank send,
// then the fewest messages. All transfers between one (src, dst) pair fuse into one message.
//
// Plans are pure functions of their inputs: every rank builds the same plan.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layout/Placement.h"
#include "layout/Topology.h"

namespace hotswitch {

// One strided box copied from a source buffer view to a destination buffer view. Both views
// enumerate the box in row-major order of its logical coordinates.
struct Segment {
  int tensor = 0;
  int summand = -1;
  Box box;
  int srcBuffer = 0;
  int64_t srcOffset = 0;
  Shape srcStrides;
  int dstBuffer = 0;
  int64_t dstOffset = 0;
  Shape dstStrides;
  int64_t numel() const { return box.numel(); }
};

// All segments from src to dst, packed back to back in this order into one buffer.
struct Message {
  int src = 0;
  int dst = 0;
  std::vector<Segment> segments;
  int64_t bytes = 0;
};

struct PlanStats {
  int64_t bytesMoved = 0;
  int64_t interNodeBytes = 0;
  int64_t maxSendBytes = 0;
  int64_t maxRecvBytes = 0;
  int64_t numMessages = 0;
  int64_t localCopyBytes = 0;
  // Lower bounds the plan is judged against: the bytes not already on their destination;
  // the inter-node bytes of elements with no replica on the destination's node; and the
  // smallest achievable largest per-rank send given those inter-node bytes (exact: the
  // minimum T for which a flow from demands to senders of capacity T carries every byte).
  // The flow is in bytes and transfers are whole elements, so maxSendBytes can exceed the
  // last bound by less than one element per class of demands sharing the same senders.
  int64_t lowerBoundBytes = 0;
  int64_t lowerBoundInterNodeBytes = 0;
  int64_t lowerBoundMaxSendBytes = 0;
};

enum class SenderPolicy {
  kBalanced = 0,  // min inter-node bytes, then min largest send (max flow), then few messages
  kGreedy,        // baseline: tensors in order, sender = the same-node owner that sent least
};

struct PlanOptions {
  SenderPolicy senderPolicy = SenderPolicy::kBalanced;
};

struct RedistributionPlan {
  int world = 0;
  bool sumsSummands = false;           // source is kPartial: destinations add what arrives
  std::vector<DType> dtypes;           // per tensor
  std::vector<int64_t> elementSizes;   // per tensor
  std::vector<std::vector<BufferSpec>> srcBuffers;  // per rank
  std::vector<std::vector<BufferSpec>> dstBuffers;  // per rank
  std::vector<std::vector<bool>> dstFullyCovered;   // per rank, per buffer: no padding
  std::vector<Message> messages;                    // sorted by (src, dst)
  std::vector<std::vector<Segment>> localCopies;    // per rank
  std::vector<int64_t> sendBytes;                   // per rank
  std::vector<int64_t> recvBytes;                   // per rank
  PlanStats stats;

  // Throws InvalidArgument when the placements are over different worlds or the
  // destination is kPartial.
  static RedistributionPlan build(const TensorSet& set, const Placement& from,
                                  const Placement& to, const Topology& topology,
                                  const PlanOptions& options = {});

  int64_t segmentBytes(const Segment& s) const { return s.numel() * elementSizes[s.tensor]; }
  std::string summary() const;
};

}  // namespace hotswitch
