#pragma once

// What one device and its links can do, as the cost model needs it.

#include <cstdint>
#include <string>
#include <vector>

namespace hotswitch {

struct HardwareProfile {
  std::string name;
  double peakFlops = 312e12;           // dense 16-bit tensor FLOP/s of one device
  double efficiency = 0.5;             // achieved fraction of peak on the linear layers (and head)
  double attentionEfficiency = 0.5;    // achieved fraction of peak on causal attention
  int64_t memoryBytes = 80LL << 30;    // device memory (a per-rank budget; may be set lower)
  double intraNodeBandwidth = 300e9;   // bytes/s one device sends within a node (one direction)
  double interNodeBandwidth = 25e9;    // bytes/s one device sends to another node
  double intraNodeLatency = 5e-6;      // seconds per message
  double interNodeLatency = 10e-6;
  // Fixed seconds per layer, forward and backward together: for every micro-batch (kernel
  // launches, synchronisation), and for every sequence of a micro-batch (per-sequence work of
  // a packed attention kernel).
  double layerOverheadSeconds = 0;
  double sequenceOverheadSeconds = 0;

  // a100, a800, h100, h200 (dense bf16 peak, memory, NVLink per direction and one
  // InfiniBand NIC per device, from the vendors' data sheets; a per-layer overhead of
  // 100 us per micro-batch for forward and backward, an assumption until calibrated);
  // InvalidArgument otherwise.
  static HardwareProfile preset(const std::string& name);
  static std::vector<std::string> presetNames();

  double achievedFlops() const { return peakFlops * efficiency; }
  double achievedAttentionFlops() const { return peakFlops * attentionEfficiency; }
  // Throws InvalidArgument naming the first non-finite, non-positive or out-of-range field.
  void validate() const;
};

}  // namespace hotswitch
