#pragma once

// A model and hardware small enough to price by hand, shared by the cost model and planner
// tests.

#include <cstdint>

#include "planner/HardwareProfile.h"
#include "planner/ModelConfig.h"

namespace hotswitch {
namespace testing {

// 2 layers, hidden 8, 2 heads over `queryGroups` K/V groups, FFN 16, vocab 10, bf16.
inline ModelConfig tinyModel(int64_t queryGroups = 2) {
  ModelConfig m;
  m.name = "tiny";
  m.numLayers = 2;
  m.hiddenSize = 8;
  m.numAttentionHeads = 2;
  m.numQueryGroups = queryGroups;
  m.ffnHiddenSize = 16;
  m.vocabSize = 10;
  return m;
}

// 1e6 FLOP/s at full efficiency, 1 MiB, 1e3 B/s inside a node and 1e2 across, no latency
// and no fixed overheads.
inline HardwareProfile unitHardware() {
  HardwareProfile h;
  h.name = "unit";
  h.peakFlops = 1e6;
  h.efficiency = 1.0;
  h.attentionEfficiency = 1.0;
  h.memoryBytes = 1 << 20;
  h.intraNodeBandwidth = 1e3;
  h.interNodeBandwidth = 1e2;
  h.intraNodeLatency = 0;
  h.interNodeLatency = 0;
  return h;
}

}  // namespace testing
}  // namespace hotswitch
