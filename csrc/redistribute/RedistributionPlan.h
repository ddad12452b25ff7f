#pragma once

// The transfers that take a tensor set from one placement to another over the same world.
//
// Every destination element arrives exactly once (for a kPartial source: once per summand,
// and the destination is their sum); an element the destination rank already holds is a
// local copy. An element is sent by an owner on the receiver's node whenever there is one
// (the fewest inter-node bytes), otherwise by any owner; among those, senders are chosen
// for the smallest largest per-rank send, then the fewest messages. All transfers between
// one (src, dst) pair fuse into one message.
//
// Given the links' bandwidths (PlanOptions), the balance is in time rather than bytes: the
// slowest rank's send, intra-node bytes / intra-node bandwidth + inter-node bytes /
// inter-node bandwidth, is made as small as the rule allows.
//
// Same-node-first is a rule, not an optimum over all plans: where far owners sit idle,
// letting them send can lower the largest send (by 2x for dp4 tp2 -> tp8 on two nodes of 4)
// at the price of inter-node bytes. hotswitch.analysis.switch_lp solves the send load
// without the rule, in bytes or in seconds.
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
  // Lower bounds over every plan: the bytes not already on their destination, and the
  // inter-node bytes of elements with no replica on the destination's node.
  int64_t lowerBoundBytes = 0;
  int64_t lowerBoundInterNodeBytes = 0;
  // The smallest largest per-rank send among plans whose senders are owners on the
  // receiver's node whenever there is one (exact: the minimum T for which a flow from
  // demands to those senders, of capacity T each, carries every byte). Not a lower bound
  // over all plans: see the note at the top. The flow is in bytes and transfers are whole
  // elements, so maxSendBytes can exceed it by less than one element per class of demands
  // sharing the same senders.
  int64_t sameNodeFirstMaxSendBytes = 0;
  // Given link bandwidths (else 0): the slowest rank's send seconds, and the least possible
  // under same-node-first (exact up to the time units of the flow, 1/512 relative).
  double maxSendSeconds = 0;
  double sameNodeFirstMaxSendSeconds = 0;
};

enum class SenderPolicy {
  kBalanced = 0,  // same-node-first, then min largest send (max flow), then few messages
  kGreedy,        // baseline: tensors in order, sender = the same-node owner that sent least
};

struct PlanOptions {
  SenderPolicy senderPolicy = SenderPolicy::kBalanced;
  // Bytes/s one rank sends within its node and to another node. Both 0: kBalanced balances
  // bytes; both > 0 (within a factor 1000 of each other): it balances send time.
  double intraNodeBandwidth = 0;
  double interNodeBandwidth = 0;
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

  // Throws InvalidArgument when the placements are over different worlds, the destination
  // is kPartial, or the options' bandwidths are not both 0 or both > 0.
  static RedistributionPlan build(const TensorSet& set, const Placement& from,
                                  const Placement& to, const Topology& topology,
                                  const PlanOptions& options = {});

  int64_t segmentBytes(const Segment& s) const { return s.numel() * elementSizes[s.tensor]; }
  std::string summary() const;
};

}  // namespace hotswitch
