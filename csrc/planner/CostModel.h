#pragma once

// Predicts the time and per-rank peak memory of one phase: a model trained under one layout
// on a set of micro-batches, per data-parallel replica; and what a training step adds after
// its last phase. Analytical: every term below is a closed formula of the model's shape, the
// layout, the topology and the hardware profile, so that a phase costs microseconds to price.
//
// Notation, for one rank of a pipeline stage: L = num_layers / pp layers, t = tp, h hidden,
// f ffn hidden, d head dim, V vocabulary, b = param bytes (2 for bf16), g = grad bytes (fp32
// main gradients: 4); a micro-batch of n tokens in sequences s_1..s_c. P = peak FLOP/s,
// e = efficiency, e_a = attention efficiency, s_half = attention half length,
// M = memory bandwidth * memory efficiency (0: memory traffic not modelled, its terms drop),
// r = 3 products per matrix (forward, data gradient, weight gradient), 4 with full
// recomputation.
//
// Recomputation (Recompute, as Megatron-LM's --recompute-granularity) is a property of each
// call: terms(layout, recompute) and phase(layout, recompute, batches) price the layout with
// it, so the planner can weigh the same layout with and without it; terms(layout) takes the
// model's own setting. Full reruns each layer's forward in the backward pass: products,
// elementwise kernels and tensor-parallel collectives 4/3 as much, attention 9 instead of 7;
// selective reruns only the attention core: attention 9, the rest as without.
//
// Time of one micro-batch on one rank of a stage, forward and backward:
//
// 1. Matrix products. For each weight matrix of a layer as the rank holds it, K x N
//    (ModelConfig::layerMatrices: fused QKV h x (h + 2 kv) / t, projection h/t x h, fc1 (llama:
//    gate and up fused) h x f/t or 2f/t, fc2 f/t x h):
//      T_mm = r * 2 n K N / (P e)  +  [r b (n K + n N) + (r b + 2 g) K N] / M
//    FLOPs at the product's peak rate, plus the bytes its operands move: each product reads
//    x and W and writes y; the weight gradient accumulates into fp32 main gradients. This is
//    the efficiency of one kernel as a saturating function of its work:
//      eff = e * I / (I + I_half),  I = FLOPs / bytes,  I_half = P e / M,
//    so a product of few tokens (small n) or of a narrow shard (K or N = h/t, f/t) runs below
//    e. Per token r (2 K N / (P e) + b (K + N) / M); per micro-batch (r b + 2 g) K N / M.
// 2. Attention (flash attention, causal). Per sequence of s tokens: forward 2 s^2 h / t FLOPs
//    (QK^T and AV, 2 s^2 d per head each, halved by the mask), backward 2.5x forward
//    (it recomputes the scores): 7 s^2 h / t, 9 with recomputation (either granularity
//    reruns the attention core's forward). Head dims pad to a
//    multiple of 32 (the kernels' instantiations): x ceil(d / 32) * 32 / d. Efficiency grows
//    with the sequence's length, e_a * s / (s + s_half):
//      T_att = 7 (h/t) pad (s^2 + s_half s) / (P e_a)
//    Packed sequences attend only to themselves (sum over the micro-batch's sequences);
//    padded ones are sequences of the padded length.
// 3. Elementwise kernels, memory-bound, per token: the bytes they move per element, as
//    Megatron-LM implements each family (CostModel.cpp lists them). gpt: fused LayerNorms and
//    bias-dropout-residual adds, 56 bytes per hidden element, and a fused bias-GeLU, 10 per
//    MLP intermediate element; llama: RMSNorm in fp32 plain operations and unfused residual
//    adds, 256 per hidden element, SwiGLU 34 per intermediate element, rotary embedding 58 per
//    element of q and k. Hidden elements number h/t under sequence parallelism (h otherwise),
//    intermediate ones f/t, q and k ones (h + kv)/t:
//      T_ew = bytes * (b / 2) / M   (x 4/3 with recomputation)
// 4. Tensor-parallel collectives (t > 1): with sequence parallelism each layer all-gathers
//    its n x h input twice and reduce-scatters twice forward; backward, each column-parallel
//    product gathers its input again (for its weight gradient) and reduce-scatters its input
//    gradient, and each row-parallel one gathers its output gradient: 10, 14 with full
//    recomputation (as Megatron-LM's sequence-parallel linear layers and ours run). Without,
//    2 all-reduces forward and 2 backward, each two collectives' traffic: 8, 12. Of the
//    backward's, the column-parallel products' (the input gathered again and the input
//    gradient reduce-scattered, or without sequence parallelism its all-reduce: 4 collectives'
//    traffic) run beside their products; `tpOverlap` of them hides (1, the default: all, as
//    Megatron-LM's linear layers and this runtime's eager ones schedule them; 0: none, as
//    this runtime's compiled layers wait for each collective where it is posted). So 6 (10,
//    4, 8) are priced by default, 10 (14, 8, 12) at 0. A full recomputation whose rerun of a
//    chunk of k layers stops early (`recomputeChunkLayers` k) skips the chunk's last
//    reduce-scatter (all-reduce without sequence parallelism): a stage of L layers, cut into
//    ceil(L / k) chunks, posts that many (twice that many) fewer. One
//    collective of B bytes over a group of t ranks (a ring, `collectiveSeconds`):
//      (t - 1) * (B / t / bw + lat)        (an all-reduce twice that)
//    Inside a node bw = intra-node bandwidth; a group across nodes with r ranks on each node
//    spreads its rings over their r NICs: bw = min(intra, r * inter-node bandwidth), with the
//    inter-node latency.
// 5. Fixed costs: layer overhead seconds per layer (kernel launches, synchronisation) and
//    sequence overhead seconds per layer and sequence.
// 6. The last stage also runs the vocabulary-parallel head and the loss: the head's product
//    h x V/t as in 1 (r = 3), cross entropy over fp32 logits (32 bytes per logit: cast,
//    max, exp-sum, softmax gradient, cast back) / M, under sequence parallelism the head
//    input's all-gather (its backward's gather and reduce-scatter run beside its products and
//    hide: the head runs eagerly, whatever tpOverlap says of the layers; without sequence
//    parallelism so does its input gradient's all-reduce), and three all-reduces of n fp32
//    values (max, sum, target logit) over the tensor-parallel group. The first stage's
//    embedding lookup is not charged.
//
// These sum to the planner's linear view of a stage (LayoutTerms): a micro-batch k costs
//   t_k = alpha * n_k + beta * sum s^2 + gamma * c_k + o,
// alpha per token (1-4, 6), beta per token^2 (2), gamma per sequence (5), o per micro-batch
// (the weight bytes of 1, latencies of 4, 5, 6); the last stage's share of alpha and o is
// kept apart, so a middle stage costs t_k minus it.
//
// 7. Pipeline (pp > 1): each micro-batch sends n h b / t bytes forward (n h b without
//    sequence parallelism) and its gradient backward between adjacent stages over the link
//    that joins them (p_k = n h b / t / bw + lat). The replica runs Megatron-LM's 1F1B
//    schedule: stage j runs pp - 1 - j warm-up forwards, then alternates one forward and one
//    backward, then drains its backwards; a forward of micro-batch k on stage j starts when
//    the stage is free and micro-batch k has come from stage j - 1, a backward when its
//    gradient has come from stage j + 1. Its makespan is simulated exactly, with micro-batches
//    of unequal cost (a forward a third of t_k, a backward two thirds): equal micro-batches
//    give sum_k t_k + (pp - 1) * (t + 2 p) of the slowest stage; unequal ones stall every
//    stage on the slowest of the micro-batches in flight.
// 8. The phase takes as long as its slowest replica; then its gradients are reduce-scattered
//    over the data group (the distributed optimizer, ZeRO) or all-reduced, g bytes per
//    parameter of the rank's stage, as a collective in 4.
// 9. After the step's last phase (stepSeconds): under ZeRO the updated parameters are
//    all-gathered over the data group (b bytes per parameter); the optimizer reads the
//    gradient, reads and writes master weights and moments, and writes the parameter of its
//    shard (g + 2 * optimizer bytes + b per parameter), and the gradient buffer is zeroed
//    (g per parameter of the rank), at M; plus step overhead seconds.
//
// 10. Context parallelism (cp > 1): each micro-batch's tokens spread over the cp ranks of a
//    replica as the model cuts them (ContextSplit below, hotswitch/model/context.py): a
//    sequence of at least 2 cp * min chunk tokens in 2 cp chunks, rank i holding chunks i
//    and 2 cp - 1 - i (equal causal attention work), shorter ones whole, longest first to
//    the rank with the fewest tokens. A rank runs 1-6 on its own tokens and attention on its
//    own queries against their sequences' whole causal past, so in the linear view alpha
//    (1-4, 6), beta and the stage transfers divide by cp; gamma does not (every rank holds a
//    part of each cut sequence). Each layer all-gathers the micro-batch's keys and values
//    over the cp group (2 kv / t elements per token, kv = query groups * head dim) and
//    reduce-scatters their gradients backward (3 collectives with full recomputation), a
//    ring over the cp group as in 4 (alphaCp per token of the micro-batch, their latencies
//    per micro-batch); `cpOverlap` of that traffic hides behind compute (0: this runtime
//    gathers before the attention call and nothing hides; a ring exchange of K/V blocks, as
//    Megatron-LM's, hides up to all of it behind the attention of long sequences). The
//    exact phase time takes each micro-batch's slowest cp rank (its tokens, causal pairs
//    and sequences): the imbalance of uneven chunks and of the short sequences dealt whole.
//    Gradients reduce over the data group, dp * cp ranks.
//
// 12. CUDA graphs (CostOptions::graphBuckets; hotswitch.model's graph buckets). A layout whose
//    layers can run from captured graphs (pp and cp 1, no full recomputation, and at tp > 1
//    every bucket a multiple of tp, so that a padded pack cuts into equal sequence-parallel
//    slices; the tensor-parallel collectives are captured with the layer) may run a
//    micro-batch of n tokens padded to the smallest bucket B >= n: the padding is one more
//    sequence of B - n tokens, so the micro-batch costs alpha (B - n) + beta (B - n)^2 + gamma
//    more (gamma only when B > n), and each layer's fixed cost is graphLayerOverheadSeconds
//    instead of the profile's layerOverheadSeconds (LayoutTerms::graphSavedSeconds per
//    micro-batch, scaled as the layout's other terms). The graphed layers are compiled: at
//    tp > 1 they wait for each collective where it is posted, so such a micro-batch also pays
//    the tp traffic of its B tokens that tpOverlap hides in eager layers (graphTpAlpha per
//    token, graphTpMicroBatchSeconds). A micro-batch runs from the graphs when
//    that costs less than running it as it is (graphTokens); its activations are then of B
//    tokens. Nobody else weighs the padding against the launches per micro-batch: systems
//    that capture graphs pad every batch to one shape. Not modelled: a flash kernel's static
//    pack launches blocks for every sequence slot up to its capacity and the whole pack's
//    length (most of them exit at once), the capture's memory pool beyond the activations of
//    B tokens, and at tp > 1 the collectives' launches the graphs also save: every layout's
//    saving per layer is the one fitted value. A bucket runs from the graphs only where the
//    layout's attention is static at its size (graphMaxScores: the mask kernels hold at most
//    that many scores in one call; LayoutTerms::graphMaxTokens). The weight copies the graphs read (each layer
//    weight of the rank's shard, in the compute dtype: graphCopyBytes), which a layout's model keeps
//    while other layouts run, are held in every layout's memory: the Planner sums them over
//    its candidates that run graphs (CostOptions::graphCopiesHeldBytes). With many
//    candidates that is much of a GPU's memory (LLaMA-7B on 8 GPUs: dp8's copies alone are
//    12.9 GB), so graphLayouts may name the few layouts that capture graphs.
//
// Memory per rank, for the stage that holds the most: parameters (param bytes) and gradients
// (grad bytes) of the rank's shard, optimizer state (optimizer bytes per parameter, divided
// over the data group under ZeRO), activations of the micro-batches in flight (1F1B keeps up
// to pp on the first stage; 34 * hidden / tp bytes per token per layer at 16 bits with
// sequence parallelism and flash attention, or 2 * hidden / tp with full recomputation plus
// one layer's working set), and fp32 logits and their gradient for the largest micro-batch.
// Without flash attention (CostOptions::flashAttention false) the attention core also keeps
// its scores, softmax and dropout: 5 * heads / tp bytes per token^2 of each sequence per
// layer at 16 bits (Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models"), which either granularity of recomputation drops. Under cp a rank
// keeps the activations of its own tokens (÷ cp) plus the gathered keys and values of the
// whole micro-batch for the backward pass (2 kv / t elements per token per layer, unless fully
// recomputed), its scores ÷ cp, its logits ÷ cp.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
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
  bool sequenceParallel = true;        // Megatron sequence parallelism when tp > 1
  bool flashAttention = true;          // the attention core keeps no per-token^2 activations
  double cpOverlap = 0;                // share of the cp K/V traffic hidden behind compute, in [0, 1]
  double tpOverlap = 1;                // share of the backward's overlappable tp traffic hidden (4), in [0, 1]
  // Full recomputation's rerun of each chunk of this many layers stops after the last tensor
  // its backward saved (PyTorch's non-reentrant checkpoint, this runtime's): the chunk's last
  // row-parallel collective is not posted again (4). 0: every rerun posts all of its forward's
  // collectives (Megatron-LM's reentrant checkpoint). >= 0.
  int64_t recomputeChunkLayers = 0;
  int64_t cpMinChunk = 4;              // tokens: shorter cp chunks keep the sequence whole (10)
  // Per layout (by Layout::name()): a factor on every time term of terms(), > 0 and finite;
  // layouts not listed keep 1. What a machine's measured phases say of one layout beyond
  // what the profile's shared coefficients explain (online re-calibration).
  std::map<std::string, double> layoutScale;
  // CUDA graphs (12): the token counts at which layers run from captured graphs, ascending,
  // each >= 1 (empty: no graphs), and the fixed seconds per layer of such a micro-batch
  // (>= 0, finite), in place of the profile's layerOverheadSeconds.
  std::vector<int64_t> graphBuckets;
  double graphLayerOverheadSeconds = 0;
  // The layouts (by Layout::name()) whose models capture graphs, each holding its weight
  // copies while the others run (12); none: every layout that can. A layout not listed runs
  // as without graph buckets and keeps no copies. Names distinct, each a layout's name.
  std::optional<std::vector<std::string>> graphLayouts;
  // The attention's bound on a static pack (12): a layout runs bucket B from the graphs only
  // when its attention heads per rank * B^2 <= it (the mask kernels', whose scores one call
  // holds; over it they fall back to a kernel per length, which no graph captures); >= 0.
  // None: no bound (the flash and flex kernels).
  std::optional<int64_t> graphMaxScores;
  // Bytes every rank holds for the weight copies the captured graphs read (graphCopyBytes of
  // each layout that runs them, kept while other layouts run), in every layout's static
  // memory. The Planner sets it from its candidates; >= 0.
  int64_t graphCopiesHeldBytes = 0;
  // Bytes per element of the matrix weights' graph copies: the compute dtype's, where the
  // parameters are kept wider (mixed precision); 0: the model's param bytes.
  int64_t graphCopyParamBytes = 0;
};

// One cp rank's part of a micro-batch (10 above): tokens, causal (query, key) pairs of its
// queries, and sequences it holds a part of.
struct ContextLoad {
  int64_t tokens = 0;
  double pairs = 0;
  int64_t sequences = 0;
};

// How one micro-batch of sequence lengths is dealt over cp ranks (10): a sequence of at least
// 2 * cp * minChunk tokens is cut into 2 * cp chunks, rank i holding chunks i and 2cp - 1 - i
// (owner -1); a shorter one stays whole, dealt longest first (then by index) to the rank
// holding the fewest tokens so far (then the lowest rank). hotswitch.model.context splits
// packs with it. Throws InvalidArgument for cp < 1, minChunk < 1 or a length < 1.
std::vector<int> contextSplitOwners(const std::vector<int64_t>& lengths, int cp, int64_t minChunk);

// The cp ranks' parts of one micro-batch of sequence lengths, dealt as contextSplitOwners
// deals them. Throws as contextSplitOwners.
std::vector<ContextLoad> contextSplitLoads(const std::vector<int64_t>& lengths, int cp, int64_t minChunk);

// The coefficients of one layout's time model (see above); seconds.
struct LayoutTerms {
  double alphaCompute = 0;       // per token: products, attention's linear part, elementwise, head
  double alphaTp = 0;            // per token: tensor-parallel collectives (bandwidth part)
  double beta = 0;               // per token^2: causal attention
  double gamma = 0;              // per sequence
  double microBatchSeconds = 0;  // per micro-batch (o): overheads, weight bytes, latencies
  double microBatchTpSeconds = 0;  // the collectives' latency part of microBatchSeconds
  double lastStageAlpha = 0;     // of alpha(): what only the last stage pays per token (head, loss)
  double lastStageMicroBatchSeconds = 0;  // of microBatchSeconds: the same per micro-batch
  double p2pPerToken = 0;        // one stage-boundary transfer, per token (pp > 1)
  double p2pLatency = 0;         // one stage-boundary transfer, fixed (pp > 1)
  double dpSeconds = 0;          // gradient reduction over the data group (dp * cp ranks)
  double alphaCp = 0;            // per token of a micro-batch: exposed cp K/V traffic (10)
  double microBatchCpSeconds = 0;  // of microBatchSeconds: the cp collectives' latencies
  int cp = 1;                    // the layout's cp: alpha other than alphaCp and beta are per cp rank
  Recompute recompute = Recompute::kNone;  // what the terms (and the phase's memory) assume
  bool graphs = false;           // micro-batches may run from CUDA graphs (12)
  double graphSavedSeconds = 0;  // per micro-batch run from them: the fixed cost it does not pay
  // Per token and per micro-batch run from them at tp > 1: the tp collectives that tpOverlap
  // hides in eager layers and the compiled, graphed ones wait for (12).
  double graphTpAlpha = 0;
  double graphTpMicroBatchSeconds = 0;
  // The largest graph bucket whose attention is static under the layout (12:
  // CostOptions::graphMaxScores), 0 when none is; larger micro-batches run as they are.
  int64_t graphMaxTokens = 0;

  double alpha() const { return alphaCompute + alphaTp + alphaCp; }
  // Critical-path seconds of one sequence on the last stage.
  double u(int64_t s) const {
    const double x = static_cast<double>(s);
    return alpha() * x + beta * x * x + gamma;
  }
  // u plus its two stage-boundary transfers: what the sequence adds to a bubble.
  double v(int64_t s) const { return u(s) + 2.0 * p2pPerToken * static_cast<double>(s); }
};

struct PhaseCost {
  double computeSeconds = 0;  // the slowest replica's last stage: its own work, collectives aside
  double tpSeconds = 0;       // the same stage's tensor-parallel collectives
  double cpSeconds = 0;       // the same stage's cp K/V exchange (exposed part)
  double ppSeconds = 0;       // what pipelining adds: fill, drain, stalls and stage transfers
  double dpSeconds = 0;       // gradient reduction at the end of the phase
  double totalSeconds = 0;    // compute + tp + cp + pp + dp
  int64_t staticBytes = 0;      // parameters, gradients, optimizer state
  int64_t activationBytes = 0;  // at the peak
  int64_t peakBytes = 0;
  bool fits = false;            // peakBytes <= the device's memory
  int graphedMicroBatches = 0;  // over all replicas: the micro-batches run from CUDA graphs (12)

  // Seconds before the gradient reduction: what the phase's micro-batches take.
  double runSeconds() const { return totalSeconds - dpSeconds; }
};

// A phase's micro-batches: microBatches[replica][k] lists the sequence lengths packed into
// micro-batch k of that data-parallel replica (spread over its cp ranks when cp > 1).
using PhaseBatches = std::vector<std::vector<std::vector<int64_t>>>;

// The makespan of the 1F1B schedule over `stages` stages (see 7 above): forward[j][k] and
// backward[j][k] seconds of micro-batch k on stage j, transfer[k] seconds of each of its
// stage-boundary sends. Throws InvalidArgument on mismatched sizes.
double oneForwardOneBackward(const std::vector<std::vector<double>>& forward,
                             const std::vector<std::vector<double>>& backward, const std::vector<double>& transfer);

class CostModel {
 public:
  // The forward pass's share of a micro-batch's time on a stage (7 above).
  static constexpr double kForwardShare = 1.0 / 3.0;

  // Throws InvalidArgument when the model, hardware or topology is malformed.
  CostModel(ModelConfig model, HardwareProfile hardware, Topology topology, CostOptions options = {});

  const ModelConfig& model() const { return model_; }
  const HardwareProfile& hardware() const { return hardware_; }
  const Topology& topology() const { return topology_; }
  const CostOptions& options() const { return options_; }

  // Forward FLOPs of one sequence through all layers and the head (products and attention).
  double forwardFlops(int64_t seqLen) const;
  // Training FLOPs: products 3x forward (4x with full recomputation, the head 3x), attention
  // 3.5x (4.5x with either recomputation). The first form takes the model's recompute.
  double trainingFlops(int64_t seqLen) const;
  double trainingFlops(int64_t seqLen, Recompute recompute) const;

  // Bytes of parameters, gradients and optimizer state on the fullest rank of the layout, and
  // the graph copies held (CostOptions::graphCopiesHeldBytes).
  int64_t staticBytes(const Layout& layout) const;
  // Bytes of the weight copies a rank of the layout keeps for its CUDA graphs (12), whose
  // addresses the graphs captured: every layer's matrices of its shard at
  // CostOptions::graphCopyParamBytes, its norms whole at param bytes, and where that is set
  // (a narrower compute dtype) an untied head's shard at it too; 0 for a layout that runs no
  // graphs (pp or cp > 1, a bucket not a multiple of tp, no buckets, not in graphLayouts).
  int64_t graphCopyBytes(const Layout& layout) const;
  // The same model with `bytes` of graph copies held.
  CostModel withGraphCopiesHeld(int64_t bytes) const;
  // Activation bytes one token keeps per layer on a rank of the layout (the first form: with
  // the model's recompute).
  int64_t activationBytesPerTokenLayer(const Layout& layout) const;
  int64_t activationBytesPerTokenLayer(const Layout& layout, Recompute recompute) const;
  // Under cp, the bytes of the gathered keys and values per token of a micro-batch per layer.
  int64_t gatheredKeyValueBytesPerToken(const Layout& layout) const;
  // Activation bytes per token^2 of one sequence per layer: the attention core's scores
  // without flash attention and recomputation, 0 otherwise.
  double attentionBytesPerSquareLayer(const Layout& layout, Recompute recompute) const;
  // Parameters on the fullest rank: its stage's layers and, on an end stage, the embedding
  // or head, over tp.
  double rankParams(const Layout& layout) const;
  // Bytes of the gradients of the fullest rank's shard, at grad bytes per element.
  double gradientBytes(const Layout& layout) const;
  // Seconds of one ring collective moving `bytes` (the full buffer) among the ranks of the
  // layout's groups along `axis`; `allReduce` doubles the traffic (see 4 above).
  double collectiveSeconds(const Layout& layout, Axis axis, double bytes, bool allReduce) const;
  // Seconds of one ring collective over the layout's data groups (dp * cp ranks each).
  double dataCollectiveSeconds(const Layout& layout, double bytes, bool allReduce) const;
  // Whether some group of the layout along `axis` spans nodes.
  bool spansNodes(const Layout& layout, Axis axis) const;
  // The most ranks one group along `axis` has on one node.
  int groupRanksPerNode(const Layout& layout, Axis axis) const;

  // The time coefficients of the layout, with the model's recompute or the one given. Throws
  // InvalidArgument when the layout does not fit the model or world.
  LayoutTerms terms(const Layout& layout) const;
  LayoutTerms terms(const Layout& layout, Recompute recompute) const;

  // Throws InvalidArgument when the layout does not fit the model or world, when the batch
  // does not have one entry per data-parallel replica, or a length is < 1.
  PhaseCost phase(const Layout& layout, const PhaseBatches& batches) const;
  PhaseCost phase(const Layout& layout, Recompute recompute, const PhaseBatches& batches) const;
  // The same with the layout's terms already at hand (no validation of the layout); the
  // terms' recompute decides the memory. `graphTokens` (12), when given, says which graph
  // bucket each micro-batch ran padded to (graphTokens[replica][k], 0: as it is) instead of
  // graphTokens' choice: how a phase that ran is priced under other coefficients. Throws
  // InvalidArgument when its shape is not the batches' or an entry is neither 0 nor a bucket
  // that holds its micro-batch under a layout that runs graphs.
  PhaseCost phase(const Layout& layout, const LayoutTerms& terms, const PhaseBatches& batches,
                  const std::vector<std::vector<int64_t>>* graphTokens = nullptr) const;

  // The graph bucket a micro-batch of these sequence lengths runs padded to under the terms
  // (12), or 0 when it runs as it is (no bucket holds it, the padding costs more than the
  // launches it saves, or the terms' layout runs no graphs). Throws InvalidArgument for a
  // length < 1.
  int64_t graphTokens(const LayoutTerms& terms, const std::vector<int64_t>& lengths) const;

  // Seconds a training step spends after its last phase's gradient reduction when the
  // layout is the home layout (9 above): parameter all-gather under ZeRO, the optimizer's
  // update, the fixed step overhead.
  double stepSeconds(const Layout& layout) const;

 private:
  // Whether the layout's model runs graphs at any recomputation but full (12): graph
  // buckets, one stage, no cp, every bucket a multiple of tp.
  bool layoutRunsGraphs(const Layout& layout) const;
  // graphTokens of a micro-batch of `tokens` tokens, and the seconds running it from the
  // graphs adds (< 0), or (0, 0).
  std::pair<int64_t, double> graphChoice(const LayoutTerms& terms, double tokens) const;
  // The seconds a micro-batch of `tokens` tokens padded to `bucket` and run from the graphs
  // adds (12).
  static double graphAdded(const LayoutTerms& terms, double tokens, double bucket);
  // The bandwidth and latency of a ring over the layout's groups along `axis` (4 above): inside
  // a node its links; across nodes the NICs of the group's ranks on each node.
  std::pair<double, double> groupLink(const Layout& layout, Axis axis) const;
  // A ring collective over `groups` (ranks of this topology); see 4 above.
  double groupCollectiveSeconds(const std::vector<std::vector<int>>& groups, double bytes, bool allReduce) const;

  ModelConfig model_;
  HardwareProfile hardware_;
  Topology topology_;
  CostOptions options_;
};

}  // namespace hotswitch
