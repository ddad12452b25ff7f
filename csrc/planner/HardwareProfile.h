#pragma once

// What one device and its links can do, as the cost model needs it (see CostModel.h for how
// each field enters the time).

#include <cstdint>
#include <string>
#include <vector>

namespace hotswitch {

struct HardwareProfile {
  std::string name;
  double peakFlops = 312e12;           // dense 16-bit tensor FLOP/s of one device
  double efficiency = 0.5;             // matrix products: achieved fraction of peak on large products
  double attentionEfficiency = 0.5;    // causal attention: achieved fraction of peak on long sequences
  // Tokens at which attention reaches half its efficiency: a sequence of s tokens runs at
  // attentionEfficiency * s / (s + attentionHalfLength).
  double attentionHalfLength = 0;
  int64_t memoryBytes = 80LL << 30;    // device memory (a per-rank budget; may be set lower)
  // Device memory bytes/s (data sheet) and the achieved fraction of it on memory-bound work
  // (the operands of matrix products, elementwise kernels, the loss, the optimizer).
  // memoryBandwidth 0: memory traffic is not modelled.
  double memoryBandwidth = 0;
  double memoryEfficiency = 1.0;
  double intraNodeBandwidth = 300e9;   // bytes/s one device sends within a node (one direction)
  double interNodeBandwidth = 25e9;    // bytes/s one device sends to another node (its own NIC)
  double intraNodeLatency = 5e-6;      // seconds per message
  double interNodeLatency = 10e-6;
  // Fixed seconds per layer, forward and backward together: for every micro-batch (kernel
  // launches, synchronisation), and for every sequence of a micro-batch (per-sequence work of
  // a packed attention kernel).
  double layerOverheadSeconds = 0;
  double sequenceOverheadSeconds = 0;
  // Fixed seconds per training step outside the micro-batches (data loading, the optimizer's
  // launches, logging).
  double stepOverheadSeconds = 0;

  // h100: fitted to measured Megatron-LM runs on H100 SXM (data/megatron_runs; see
  // HardwareProfile.cpp for the command and the values); h100-datasheet: the H100 data sheet
  // with assumed efficiencies and overheads; a100, a800, h200: the h100 fit scaled by the data
  // sheets' ratios of FLOP/s, memory bandwidth and link bandwidths. InvalidArgument otherwise.
  static HardwareProfile preset(const std::string& name);
  static std::vector<std::string> presetNames();

  double achievedFlops() const { return peakFlops * efficiency; }
  double achievedAttentionFlops() const { return peakFlops * attentionEfficiency; }
  // Achieved device-memory bytes/s; 0 when memory traffic is not modelled.
  double achievedMemoryBandwidth() const { return memoryBandwidth * memoryEfficiency; }
  // Throws InvalidArgument naming the first non-finite, non-positive or out-of-range field.
  void validate() const;
};

}  // namespace hotswitch
