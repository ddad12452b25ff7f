#pragma once

// Text dumps of every field of a redistribution plan and a step plan, for tests that compare
// plans byte for byte (determinism) and for the fuzz targets. Doubles print with 17
// significant digits, so equal dumps mean bit-equal values.

#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "planner/Planner.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace testing {

namespace detail {

inline void dumpShape(std::ostream& os, const Shape& s) {
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
}

inline void dumpSegment(std::ostream& os, const Segment& s) {
  os << "  seg t" << s.tensor << " k" << s.summand << ' ' << s.box.toString() << " src b" << s.srcBuffer
     << '@' << s.srcOffset;
  dumpShape(os, s.srcStrides);
  os << " dst b" << s.dstBuffer << '@' << s.dstOffset;
  dumpShape(os, s.dstStrides);
  os << '\n';
}

inline void dumpBuffers(std::ostream& os, const char* what, const std::vector<std::vector<BufferSpec>>& buffers) {
  for (size_t r = 0; r < buffers.size(); ++r) {
    os << what << " rank " << r << ':';
    for (const BufferSpec& b : buffers[r]) {
      os << " t" << b.tensor << ' ' << dtypeName(b.dtype);
      dumpShape(os, b.shape);
    }
    os << '\n';
  }
}

inline void dumpPacking(std::ostream& os, const Packing& packing) {
  for (size_t r = 0; r < packing.microBatches.size(); ++r) {
    os << "    replica " << r << " cost " << packing.replicaCost[r] << ':';
    for (const auto& mb : packing.microBatches[r]) {
      os << " (";
      for (size_t i = 0; i < mb.size(); ++i) os << (i ? "," : "") << mb[i];
      os << ')';
    }
    os << '\n';
  }
}

inline void dumpCost(std::ostream& os, const PhaseCost& c) {
  os << "    cost compute " << c.computeSeconds << " tp " << c.tpSeconds << " pp " << c.ppSeconds << " dp "
     << c.dpSeconds << " total " << c.totalSeconds << " static " << c.staticBytes << " act "
     << c.activationBytes << " peak " << c.peakBytes << " fits " << c.fits << '\n';
}

}  // namespace detail

inline std::string dumpPlan(const RedistributionPlan& plan) {
  std::ostringstream os;
  os << std::setprecision(17);
  os << "world " << plan.world << " sums " << plan.sumsSummands << '\n';
  os << "dtypes";
  for (size_t t = 0; t < plan.dtypes.size(); ++t) os << ' ' << dtypeName(plan.dtypes[t]) << '/' << plan.elementSizes[t];
  os << '\n';
  detail::dumpBuffers(os, "src", plan.srcBuffers);
  detail::dumpBuffers(os, "dst", plan.dstBuffers);
  for (size_t r = 0; r < plan.dstFullyCovered.size(); ++r) {
    os << "covered rank " << r << ':';
    for (bool b : plan.dstFullyCovered[r]) os << ' ' << b;
    os << '\n';
  }
  for (const Message& m : plan.messages) {
    os << "message " << m.src << " -> " << m.dst << ' ' << m.bytes << " B\n";
    for (const Segment& s : m.segments) detail::dumpSegment(os, s);
  }
  for (size_t r = 0; r < plan.localCopies.size(); ++r) {
    os << "local " << r << '\n';
    for (const Segment& s : plan.localCopies[r]) detail::dumpSegment(os, s);
  }
  for (size_t r = 0; r < plan.sendBytes.size(); ++r) {
    os << "rank " << r << " send " << plan.sendBytes[r] << " recv " << plan.recvBytes[r] << '\n';
  }
  os << plan.summary() << '\n';
  os << "lower bounds " << plan.stats.lowerBoundBytes << ' ' << plan.stats.lowerBoundInterNodeBytes
     << " same-node-first max send " << plan.stats.sameNodeFirstMaxSendBytes << " B "
     << plan.stats.sameNodeFirstMaxSendSeconds << " s, max send " << plan.stats.maxSendSeconds << " s\n";
  return os.str();
}

inline std::string dumpStepPlan(const StepPlan& plan) {
  std::ostringstream os;
  os << std::setprecision(17);
  os << "pieces";
  for (const SequencePiece& p : plan.pieces) os << ' ' << p.sequence << '+' << p.offset << ':' << p.length;
  os << '\n';
  for (const PlannedPhase& phase : plan.phases) {
    os << "phase " << phase.candidate << ' ' << phase.layout.name() << " in " << phase.switchInSeconds << " out "
       << phase.switchOutSeconds << " grad " << phase.gradSeconds << ' ' << gradMethodName(phase.gradMethod)
       << " estimate " << phase.estimateSeconds << '\n';
    os << "  sequences";
    for (int i : phase.sequences) os << ' ' << i;
    os << '\n';
    detail::dumpPacking(os, phase.packing);
    detail::dumpCost(os, phase.cost);
  }
  os << "back " << plan.switchBackSeconds << " total " << plan.totalSeconds << " objective " << plan.objectiveSeconds
     << " program " << plan.programSeconds << " used " << plan.candidatesUsed << " fallback "
     << plan.singlePhaseFallback << " static " << plan.bestStaticCandidate << ' ' << plan.bestStaticSeconds << ' '
     << plan.bestStaticObjectiveSeconds << '\n';
  return os.str();
}

}  // namespace testing
}  // namespace hotswitch
