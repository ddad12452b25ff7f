#pragma once

// Predicts the time and per-rank peak memory of one phase: a model trained under one layout
// on a set of packed micro-batches, per data-parallel replica.
//
// Time, per micro-batch and pipeline stage: FLOPs over the achieved FLOP/s of one device,
// plus the tensor-parallel collectives of sequence parallelism (per layer, forward: two
// all-gathers and two reduce-scatters of the micro-batch's activations; as many again in
// backward and in recomputation), ring cost (tp - 1) / tp * bytes / bandwidth plus latency.
// A replica runs its micro-batches through the 1F1B schedule: the sum of their stage times
// plus a bubble of (pp - 1) times the largest, plus the point-to-point activation and
// gradient transfers between stages. The phase ends with the gradient reduction over the
// data group (ring all-reduce, or reduce-scatter under ZeRO). A group uses the inter-node
// links when any of its groups spans nodes.
//
// FLOPs of one sequence of s tokens, forward: per layer 2 * (linear parameters) * s for the
// linear layers and 2 * s^2 * hidden for causal attention (QK^T and AV, each 2 s^2 h, halved
// by the mask; packed sequences do not attend to each other), plus 2 * vocab * hidden * s
// for the head. Training costs 3x forward, 4x with full recomputation.
//
// Memory per rank, for the stage that holds the most: parameters (param bytes) and gradients
// (grad bytes) of the rank's shard, optimizer state (optimizer bytes per parameter, divided
// over the data group under ZeRO), activations of the micro-batches in flight (1F1B keeps up
// to pp on the first stage; 34 * hidden / tp bytes per token per layer at 16 bits with
// sequence parallelism and flash attention, or 2 * hidden / tp with recomputation plus one
// layer's working set), and fp32 logits and their gradient for the largest micro-batch.

#include <cstdint>
#include <vector>

#include "layout/Layout.h"
#include "layout/Topology.h"
#include "planner/HardwareProfile.h"
#include "planner/ModelConfig.h"

namespace hotswitch {

struct CostOptions {
  bool zero = false;                   // optimizer state sharded over the data group
  int64_t gradBytes = 4;               // bytes per gradient element (fp32 main grads)
  int64_t optimizerBytesPerParam = 12;  // fp32 master weight + Adam's two moments
};

struct PhaseCost {
  double computeSeconds = 0;  // of the slowest replica, bubble included
  double tpSeconds = 0;       // tensor-parallel collectives on its critical path
  double ppSeconds = 0;       // point-to-point stage transfers on its critical path
  double dpSeconds = 0;       // gradient reduction at the end of the phase
  double totalSeconds = 0;
  int64_t staticBytes = 0;      // parameters, gradients, optimizer state
  int64_t activationBytes = 0;  // at the peak
  int64_t peakBytes = 0;
  bool fits = false;            // peakBytes <= the device's memory
};

// A phase's micro-batches: microBatches[replica][k] lists the sequence lengths packed into
// micro-batch k of that data-parallel replica (cp == 1 for now).
using PhaseBatches = std::vector<std::vector<std::vector<int64_t>>>;

class CostModel {
 public:
  // Throws InvalidArgument when the model, hardware or topology is malformed.
  CostModel(ModelConfig model, HardwareProfile hardware, Topology topology, CostOptions options = {});

  const ModelConfig& model() const { return model_; }
  const HardwareProfile& hardware() const { return hardware_; }
  const Topology& topology() const { return topology_; }

  // Forward FLOPs of one sequence through all layers and the head (see above).
  double forwardFlops(int64_t seqLen) const;
  // Training FLOPs (forward, backward, recomputation when on).
  double trainingFlops(int64_t seqLen) const;

  // Bytes of parameters, gradients and optimizer state on the fullest rank of the layout.
  int64_t staticBytes(const Layout& layout) const;
  // Activation bytes one token keeps per layer on a rank of the layout.
  int64_t activationBytesPerTokenLayer(const Layout& layout) const;
  // Seconds of one ring collective moving `bytes` (the full buffer) among the ranks of the
  // layout's groups along `axis`; `allReduce` doubles the traffic.
  double collectiveSeconds(const Layout& layout, Axis axis, double bytes, bool allReduce) const;

  // Throws InvalidArgument when the layout does not fit the model or world, when the batch
  // does not have one entry per data-parallel replica, or a length is < 1.
  PhaseCost phase(const Layout& layout, const PhaseBatches& batches) const;

 private:
  bool spansNodes(const Layout& layout, Axis axis) const;

  ModelConfig model_;
  HardwareProfile hardware_;
  Topology topology_;
  CostOptions options_;
};

}  // namespace hotswitch
