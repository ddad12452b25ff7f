#pragma once

// Predicts the time and per-rank peak memory of one phase: a model trained under one layout
// on a set of packed micro-batches, per data-parallel replica.
//
// Time. One sequence of s tokens costs each rank of a pipeline stage on the critical path
//   u(s) = alpha * s + beta * s^2 + gamma                                        seconds
// (LayoutTerms): FLOPs over the achieved FLOP/s of one device, linear layers and head at the
// linear efficiency, causal attention at the attention efficiency; the tensor-parallel
// collectives of sequence parallelism (per layer, forward: two all-gathers and two
// reduce-scatters of the micro-batch's activations; as many again in backward and in
// recomputation), ring cost (tp - 1) / tp * bytes / bandwidth per collective; and a fixed
// per-layer cost per sequence. A micro-batch k costs t_k = sum u(s) + o, where o holds the
// per-layer overhead per micro-batch and the latencies of its collectives. A replica runs its
// micro-batches through the 1F1B schedule:
//   sum_k t_k + (pp - 1) * max_k (t_k + 2 * p_k),   p_k = tokens_k * pi + latency,
// the bubble being (pp - 1) stage times of the largest micro-batch plus its point-to-point
// transfers (activations forward, their gradient backward) between stages. The phase takes
// as long as its slowest replica; then its gradients are reduced over the data group (ring
// all-reduce, or reduce-scatter under ZeRO). A group uses the inter-node links when any of
// its groups spans nodes. The last stage also runs the head, and its time bounds the others.
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

// The coefficients of one layout's time model (see above); seconds.
struct LayoutTerms {
  double alphaCompute = 0;       // per token: linear layers and head
  double alphaTp = 0;            // per token: tensor-parallel collectives (bandwidth part)
  double beta = 0;               // per token^2: causal attention
  double gamma = 0;              // per sequence
  double microBatchSeconds = 0;  // per micro-batch (o): layer overheads plus latencies
  double microBatchTpSeconds = 0;  // the collectives' latency part of microBatchSeconds
  double p2pPerToken = 0;        // one stage-boundary transfer, per token (pp > 1)
  double p2pLatency = 0;         // one stage-boundary transfer, fixed (pp > 1)
  double dpSeconds = 0;          // gradient reduction over the data group

  double alpha() const { return alphaCompute + alphaTp; }
  // Critical-path seconds of one sequence on a stage.
  double u(int64_t s) const {
    const double x = static_cast<double>(s);
    return alpha() * x + beta * x * x + gamma;
  }
  // u plus its two stage-boundary transfers: what the sequence adds to a bubble.
  double v(int64_t s) const { return u(s) + 2.0 * p2pPerToken * static_cast<double>(s); }
};

struct PhaseCost {
  double computeSeconds = 0;  // of the slowest replica, bubble included
  double tpSeconds = 0;       // tensor-parallel collectives on its critical path
  double ppSeconds = 0;       // point-to-point stage transfers on its critical path
  double dpSeconds = 0;       // gradient reduction at the end of the phase
  double totalSeconds = 0;    // compute + tp + pp + dp
  int64_t staticBytes = 0;      // parameters, gradients, optimizer state
  int64_t activationBytes = 0;  // at the peak
  int64_t peakBytes = 0;
  bool fits = false;            // peakBytes <= the device's memory

  // Seconds before the gradient reduction: what the phase's micro-batches take.
  double runSeconds() const { return totalSeconds - dpSeconds; }
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
  const CostOptions& options() const { return options_; }

  // Forward FLOPs of one sequence through all layers and the head (see above).
  double forwardFlops(int64_t seqLen) const;
  // Training FLOPs (forward, backward, recomputation when on).
  double trainingFlops(int64_t seqLen) const;

  // Bytes of parameters, gradients and optimizer state on the fullest rank of the layout.
  int64_t staticBytes(const Layout& layout) const;
  // Activation bytes one token keeps per layer on a rank of the layout.
  int64_t activationBytesPerTokenLayer(const Layout& layout) const;
  // Bytes of the gradients of the fullest rank's shard (its stage's layers and, on an end
  // stage, the embedding), at grad bytes per element.
  double gradientBytes(const Layout& layout) const;
  // Seconds of one ring collective moving `bytes` (the full buffer) among the ranks of the
  // layout's groups along `axis`; `allReduce` doubles the traffic.
  double collectiveSeconds(const Layout& layout, Axis axis, double bytes, bool allReduce) const;
  // Whether some group of the layout along `axis` spans nodes.
  bool spansNodes(const Layout& layout, Axis axis) const;

  // The time coefficients of the layout. Throws InvalidArgument when the layout does not fit
  // the model or world.
  LayoutTerms terms(const Layout& layout) const;

  // Throws InvalidArgument when the layout does not fit the model or world, when the batch
  // does not have one entry per data-parallel replica, or a length is < 1.
  PhaseCost phase(const Layout& layout, const PhaseBatches& batches) const;
  // The same with the layout's terms already at hand (no validation of the layout).
  PhaseCost phase(const Layout& layout, const LayoutTerms& terms, const PhaseBatches& batches) const;

 private:
  ModelConfig model_;
  HardwareProfile hardware_;
  Topology topology_;
  CostOptions options_;
};

}  // namespace hotswitch
