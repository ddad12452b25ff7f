#include "planner/CostModel.h"

#include <algorithm>
#include <cmath>

#include "common/Check.h"

namespace hotswitch {

namespace {

// Bytes the elementwise kernels of one layer move per element, forward and backward, at 16
// bits (3 in CostModel.h), as Megatron-LM implements each family. gpt: two fused LayerNorms
// (10 bytes each) and two fused bias-dropout-residual adds (18 each) per hidden element; a
// fused bias-GeLU per MLP intermediate element. llama: two RMSNorms in plain PyTorch
// operations in fp32 (cast, square, mean, scale, cast back, weight: 106 each) and two
// dropout-residual adds (22 each) per hidden element; SwiGLU as silu(gate) * up with its
// chunk (34) per intermediate element; rotary embedding in plain operations (cos/sin
// products, rotate-half by chunk and concatenation: 58) per element of q and k.
constexpr double kGptNormRegionBytes = 2 * 10 + 2 * 18;
constexpr double kGptActivationBytes = 10;
constexpr double kLlamaNormRegionBytes = 2 * 106 + 2 * 22;
constexpr double kLlamaActivationBytes = 34;
constexpr double kLlamaRotaryBytes = 58;
// Bytes per logit of cross entropy over fp32 logits (6 in CostModel.h).
constexpr double kLossBytesPerLogit = 32;
// Training FLOPs of causal flash attention per s^2 * h / t: forward 2, backward 5.
constexpr double kAttentionFlops = 7;
constexpr double kAttentionRecomputeFlops = 9;
// Flash attention's head-dim granularity.
constexpr int64_t kHeadDimStep = 32;

// First token of chunk j of a sequence of n tokens cut into `chunks` (the first n mod chunks
// one longer), as hotswitch.model.context cuts it.
int64_t chunkStart(int64_t n, int64_t chunks, int64_t j) {
  return j * (n / chunks) + std::min(j, n % chunks);
}

}  // namespace

std::vector<int> contextSplitOwners(const std::vector<int64_t>& lengths, int cp, int64_t minChunk) {
  HS_CHECK(cp >= 1, "cp must be >= 1, got ", cp);
  HS_CHECK(minChunk >= 1, "the minimum cp chunk must be >= 1 token, got ", minChunk);
  const int64_t chunks = 2 * static_cast<int64_t>(cp);
  std::vector<int> owner(lengths.size(), -1);
  std::vector<int64_t> tokens(cp, 0);
  std::vector<std::pair<int64_t, size_t>> whole;  // (-length, index): longest first, then by index
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t n = lengths[s];
    HS_CHECK(n >= 1, "sequence ", s, " has length ", n, ", expected >= 1");
    if (cp == 1 || n < chunks * minChunk) {
      whole.push_back({-n, s});
      continue;
    }
    for (int64_t i = 0; i < cp; ++i) {  // rank i: chunks i and 2cp - 1 - i
      tokens[i] += chunkStart(n, chunks, i + 1) - chunkStart(n, chunks, i) + chunkStart(n, chunks, chunks - i) -
                   chunkStart(n, chunks, chunks - 1 - i);
    }
  }
  std::sort(whole.begin(), whole.end());
  for (const auto& [negative, s] : whole) {
    const int r = static_cast<int>(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    owner[s] = r;
    tokens[r] += -negative;
  }
  return owner;
}

std::vector<ContextLoad> contextSplitLoads(const std::vector<int64_t>& lengths, int cp, int64_t minChunk) {
  const std::vector<int> owner = contextSplitOwners(lengths, cp, minChunk);
  std::vector<ContextLoad> out(cp);
  const int64_t chunks = 2 * static_cast<int64_t>(cp);
  // Causal pairs of queries [a, b) of a sequence: each attends to its position + 1 keys.
  auto pairs = [](int64_t a, int64_t b) {
    return (static_cast<double>(b) * (b + 1) - static_cast<double>(a) * (a + 1)) / 2.0;
  };
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t n = lengths[s];
    if (owner[s] >= 0) {
      ContextLoad& l = out[owner[s]];
      l.tokens += n;
      l.pairs += pairs(0, n);
      l.sequences += 1;
      continue;
    }
    auto start = [&](int64_t j) { return chunkStart(n, chunks, j); };
    for (int i = 0; i < cp; ++i) {
      for (int64_t j : {static_cast<int64_t>(i), chunks - 1 - i}) {
        out[i].tokens += start(j + 1) - start(j);
        out[i].pairs += pairs(start(j), start(j + 1));
      }
      out[i].sequences += 1;
    }
  }
  return out;
}

double oneForwardOneBackward(const std::vector<std::vector<double>>& forward,
                             const std::vector<std::vector<double>>& backward, const std::vector<double>& transfer) {
  const int pp = static_cast<int>(forward.size());
  const int m = static_cast<int>(transfer.size());
  HS_CHECK(pp >= 1 && static_cast<int>(backward.size()) == pp, "1F1B needs forward and backward times for the same ",
           "stages, got ", forward.size(), " and ", backward.size());
  for (int j = 0; j < pp; ++j) {
    HS_CHECK(static_cast<int>(forward[j].size()) == m && static_cast<int>(backward[j].size()) == m, "stage ", j,
             " has ", forward[j].size(), " forward and ", backward[j].size(), " backward times, expected ", m);
  }
  if (m == 0) return 0;
  const size_t cells = static_cast<size_t>(pp) * m;
  std::vector<double> endF(cells, 0), endB(cells, 0);
  std::vector<char> doneF(cells, 0), doneB(cells, 0);
  std::vector<int> next(pp, 0);
  std::vector<double> freeAt(pp, 0);
  auto at = [m](int j, int k) { return static_cast<size_t>(j) * m + k; };
  int left = 2 * m * pp;
  // Runs stage j's program as far as its inputs allow; returns whether it ran anything.
  auto advance = [&](int j) {
    const int warm = std::min(pp - 1 - j, m);
    bool ran = false;
    while (next[j] < 2 * m) {
      const int p = next[j];
      bool isForward;
      int k;
      if (p < warm) {
        isForward = true;
        k = p;
      } else if (p < warm + 2 * (m - warm)) {
        const int q = p - warm;
        isForward = q % 2 == 0;
        k = isForward ? warm + q / 2 : q / 2;
      } else {
        isForward = false;
        k = p - m;
      }
      double ready = freeAt[j];
      if (isForward) {
        if (j > 0) {
          if (!doneF[at(j - 1, k)]) break;
          ready = std::max(ready, endF[at(j - 1, k)] + transfer[k]);
        }
        endF[at(j, k)] = ready + forward[j][k];
        doneF[at(j, k)] = 1;
        freeAt[j] = endF[at(j, k)];
      } else {
        if (j < pp - 1) {
          if (!doneB[at(j + 1, k)]) break;
          ready = std::max(ready, endB[at(j + 1, k)] + transfer[k]);
        }
        endB[at(j, k)] = ready + backward[j][k];
        doneB[at(j, k)] = 1;
        freeAt[j] = endB[at(j, k)];
      }
      ++next[j];
      --left;
      ran = true;
    }
    return ran;
  };
  while (left > 0) {
    // Forwards flow to later stages and backwards to earlier ones: sweep both ways.
    bool progressed = false;
    for (int j = 0; j < pp; ++j) progressed = advance(j) || progressed;
    for (int j = pp - 1; j >= 0; --j) progressed = advance(j) || progressed;
    HS_INTERNAL_CHECK(progressed, "the 1F1B schedule of ", pp, " stages and ", m, " micro-batches deadlocked");
  }
  return *std::max_element(freeAt.begin(), freeAt.end());
}

CostModel::CostModel(ModelConfig model, HardwareProfile hardware, Topology topology, CostOptions options)
    : model_(std::move(model)), hardware_(std::move(hardware)), topology_(topology), options_(options) {
  model_.validate();
  hardware_.validate();
  HS_CHECK(options_.gradBytes == 2 || options_.gradBytes == 4, "grad_bytes must be 2 or 4, got ",
           options_.gradBytes);
  HS_CHECK(options_.cpOverlap >= 0 && options_.cpOverlap <= 1, "cp_overlap must be in [0, 1], got ",
           options_.cpOverlap);
  HS_CHECK(options_.tpOverlap >= 0 && options_.tpOverlap <= 1, "tp_overlap must be in [0, 1], got ",
           options_.tpOverlap);
  HS_CHECK(options_.recomputeChunkLayers >= 0, "recompute_chunk_layers must be >= 0 (0: the whole rerun), got ",
           options_.recomputeChunkLayers);
  HS_CHECK(options_.cpMinChunk >= 1, "cp_min_chunk must be >= 1 token, got ", options_.cpMinChunk);
  HS_CHECK(options_.optimizerBytesPerParam >= 0, "optimizer_bytes_per_param must be >= 0, got ",
           options_.optimizerBytesPerParam);
  for (const auto& [name, factor] : options_.layoutScale) {
    HS_CHECK(std::isfinite(factor) && factor > 0, "layout_scale of ", name, " must be a finite factor > 0, got ",
             factor);
  }
  for (size_t i = 0; i < options_.graphBuckets.size(); ++i) {
    HS_CHECK(options_.graphBuckets[i] >= 1 && (i == 0 || options_.graphBuckets[i] > options_.graphBuckets[i - 1]),
             "graph_buckets must be ascending token counts >= 1, got ", options_.graphBuckets[i], " at index ", i);
  }
  if (options_.graphLayouts) {
    const auto& names = *options_.graphLayouts;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string name = Layout::parse(names[i]).name();
      HS_CHECK(name == names[i], "graph_layouts names layouts as Layout.name writes them: expected '", name,
               "', got '", names[i], "'");
      HS_CHECK(std::find(names.begin(), names.begin() + i, names[i]) == names.begin() + i, "graph_layouts lists '",
               names[i], "' twice");
    }
  }
  HS_CHECK(!options_.graphMaxScores || *options_.graphMaxScores >= 0, "graph_max_scores must be >= 0 or None "
           "(no bound), got ", options_.graphMaxScores.value_or(0));
  HS_CHECK(options_.graphCopyParamBytes >= 0, "graph_copy_param_bytes must be >= 0 (0: the model's param "
           "bytes), got ", options_.graphCopyParamBytes);
  HS_CHECK(options_.graphCopiesHeldBytes >= 0, "graph_copies_held_bytes must be >= 0, got ",
           options_.graphCopiesHeldBytes);
  HS_CHECK(std::isfinite(options_.graphLayerOverheadSeconds) && options_.graphLayerOverheadSeconds >= 0,
           "graph_layer_overhead_seconds must be finite and >= 0, got ", options_.graphLayerOverheadSeconds);
}

double CostModel::forwardFlops(int64_t s) const {
  const double h = static_cast<double>(model_.hiddenSize);
  double linear = 0;
  for (const auto& [k, n] : model_.layerMatrices()) linear += static_cast<double>(k) * static_cast<double>(n);
  const double perLayer = 2.0 * linear * s + 2.0 * static_cast<double>(s) * s * h;
  return model_.numLayers * perLayer + 2.0 * model_.vocabSize * h * s;
}

double CostModel::trainingFlops(int64_t s) const { return trainingFlops(s, model_.recompute); }

double CostModel::trainingFlops(int64_t s, Recompute recompute) const {
  const double h = static_cast<double>(model_.hiddenSize);
  const double head = 2.0 * model_.vocabSize * h * s;
  const double attention = model_.numLayers * 2.0 * static_cast<double>(s) * s * h;
  const double products = forwardFlops(s) - head - attention;
  // Full recomputation reruns the layers' forward, not the head's; selective only the
  // attention core's; flash attention's backward costs 2.5 forwards.
  const double factor = recompute == Recompute::kFull ? 4.0 : 3.0;
  const double attentionFactor = recompute == Recompute::kNone ? 3.5 : 4.5;
  return products * factor + attention * attentionFactor + 3.0 * head;
}

double CostModel::rankParams(const Layout& layout) const {
  const int64_t pp = layout.pp();
  // The first stage holds the embedding; the last the head and final norm; with pp == 1
  // both. The fuller of the two bounds every stage.
  const double layers = static_cast<double>(model_.numLayers / pp) * static_cast<double>(model_.layerParams());
  const double first = static_cast<double>(model_.firstStageParams());
  const double last = static_cast<double>(model_.lastStageParams());
  const double stage = pp == 1 ? layers + first + last : layers + std::max(first, last);
  return stage / layout.tp();
}

int64_t CostModel::staticBytes(const Layout& layout) const {
  const int64_t params = static_cast<int64_t>(std::ceil(rankParams(layout)));
  int64_t optimizer = params * options_.optimizerBytesPerParam;
  if (options_.zero) optimizer = (optimizer + layout.dataSize() - 1) / layout.dataSize();
  return params * (model_.paramBytes + options_.gradBytes) + optimizer + options_.graphCopiesHeldBytes;
}

bool CostModel::layoutRunsGraphs(const Layout& layout) const {
  const std::vector<int64_t>& buckets = options_.graphBuckets;
  const int tp = layout.tp();
  if (options_.graphLayouts && std::find(options_.graphLayouts->begin(), options_.graphLayouts->end(),
                                         layout.name()) == options_.graphLayouts->end()) {
    return false;
  }
  return !buckets.empty() && layout.pp() == 1 && layout.cp() == 1 &&
         std::all_of(buckets.begin(), buckets.end(), [tp](int64_t b) { return b % tp == 0; });
}

int64_t CostModel::graphCopyBytes(const Layout& layout) const {
  if (!layoutRunsGraphs(layout)) return 0;
  const int tp = layout.tp();
  // The matrices of the rank's shard at the copies' bytes; the rest (norms) whole, as kept.
  int64_t matrices = 0, whole = 0;
  for (const auto& [k, n] : model_.layerMatrices(tp)) matrices += k * n;
  for (const auto& [k, n] : model_.layerMatrices(1)) whole += k * n;
  const int64_t bytes = options_.graphCopyParamBytes > 0 ? options_.graphCopyParamBytes : model_.paramBytes;
  int64_t out = model_.numLayers * (matrices * bytes + (model_.layerParams() - whole) * model_.paramBytes);
  // Computing in a narrower dtype, an untied head computes through a copy too (its shard of
  // the vocabulary), which the model keeps with the layers' while other layouts run.
  if (options_.graphCopyParamBytes > 0 && !model_.tiedEmbeddings) {
    out += (model_.vocabSize + tp - 1) / tp * model_.hiddenSize * options_.graphCopyParamBytes;
  }
  return out;
}

CostModel CostModel::withGraphCopiesHeld(int64_t bytes) const {
  CostOptions options = options_;
  options.graphCopiesHeldBytes = bytes;
  return CostModel(model_, hardware_, topology_, options);
}

int64_t CostModel::activationBytesPerTokenLayer(const Layout& layout) const {
  return activationBytesPerTokenLayer(layout, model_.recompute);
}

int64_t CostModel::activationBytesPerTokenLayer(const Layout& layout, Recompute recompute) const {
  const int64_t scale = model_.paramBytes;  // the 34 h counts bytes at 16 bits: 2 per element
  const int64_t perToken = (recompute == Recompute::kFull ? 2 : 34) * model_.hiddenSize * scale / 2;
  const int64_t split = static_cast<int64_t>(layout.tp()) * layout.cp();
  int64_t bytes = (perToken + split - 1) / split;
  // Under cp the gathered keys and values of the whole micro-batch stay for the backward.
  if (layout.cp() > 1 && recompute != Recompute::kFull) bytes += gatheredKeyValueBytesPerToken(layout);
  return bytes;
}

int64_t CostModel::gatheredKeyValueBytesPerToken(const Layout& layout) const {
  const int64_t kv = model_.numQueryGroups * model_.headDim();
  return (2 * kv * model_.paramBytes + layout.tp() - 1) / layout.tp();
}

double CostModel::attentionBytesPerSquareLayer(const Layout& layout, Recompute recompute) const {
  if (options_.flashAttention || recompute != Recompute::kNone) return 0;
  // Scores and softmax (2 bytes each at 16 bits) and the dropout mask (1), per head.
  return 5.0 * model_.numAttentionHeads * static_cast<double>(model_.paramBytes) / 2.0 / layout.tp() / layout.cp();
}

double CostModel::gradientBytes(const Layout& layout) const {
  return rankParams(layout) * static_cast<double>(options_.gradBytes);
}

bool CostModel::spansNodes(const Layout& layout, Axis axis) const {
  // A group spans nodes when some rank sits on another node than its group's first rank.
  for (int r = 0; r < layout.world(); ++r) {
    Coord c = layout.coord(r);
    c[static_cast<int>(axis)] = 0;
    if (topology_.node(r) != topology_.node(layout.rank(c))) return true;
  }
  return false;
}

int CostModel::groupRanksPerNode(const Layout& layout, Axis axis) const {
  int most = 0;
  for (const auto& group : layout.groups(axis)) {
    for (int member : group) {
      int here = 0;
      for (int other : group) here += topology_.sameNode(member, other) ? 1 : 0;
      most = std::max(most, here);
    }
  }
  return most;
}

std::pair<double, double> CostModel::groupLink(const Layout& layout, Axis axis) const {
  if (!spansNodes(layout, axis)) return {hardware_.intraNodeBandwidth, hardware_.intraNodeLatency};
  return {std::min(hardware_.intraNodeBandwidth, groupRanksPerNode(layout, axis) * hardware_.interNodeBandwidth),
          hardware_.interNodeLatency};
}

double CostModel::collectiveSeconds(const Layout& layout, Axis axis, double bytes, bool allReduce) const {
  if (layout.degree(axis) <= 1 || bytes <= 0) return 0;
  return groupCollectiveSeconds(layout.groups(axis), bytes, allReduce);
}

double CostModel::dataCollectiveSeconds(const Layout& layout, double bytes, bool allReduce) const {
  if (layout.dataSize() <= 1 || bytes <= 0) return 0;
  if (layout.cp() == 1) return collectiveSeconds(layout, Axis::kDp, bytes, allReduce);
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < layout.world(); ++r) {
    std::vector<int> group = layout.dataGroup(r);
    if (*std::min_element(group.begin(), group.end()) == r) groups.push_back(std::move(group));
  }
  return groupCollectiveSeconds(groups, bytes, allReduce);
}

double CostModel::groupCollectiveSeconds(const std::vector<std::vector<int>>& groups, double bytes,
                                         bool allReduce) const {
  const int n = groups.empty() ? 1 : static_cast<int>(groups.front().size());
  if (n <= 1 || bytes <= 0) return 0;
  bool spans = false;
  int perNode = 0;
  for (const auto& group : groups) {
    for (int member : group) {
      int here = 0;
      for (int other : group) here += topology_.sameNode(member, other) ? 1 : 0;
      perNode = std::max(perNode, here);
      spans = spans || !topology_.sameNode(member, group.front());
    }
  }
  double bw = hardware_.intraNodeBandwidth, lat = hardware_.intraNodeLatency;
  if (spans) {
    // The ring's channels spread over the NICs of the group's ranks on each node.
    bw = std::min(bw, perNode * hardware_.interNodeBandwidth);
    lat = hardware_.interNodeLatency;
  }
  const double steps = allReduce ? 2.0 * (n - 1) : (n - 1);
  return steps * (bytes / n / bw + lat);
}

LayoutTerms CostModel::terms(const Layout& layout) const { return terms(layout, model_.recompute); }

LayoutTerms CostModel::terms(const Layout& layout, Recompute recompute) const {
  layout.validate(topology_.world());
  model_.validate(layout);
  const int pp = layout.pp(), tp = layout.tp(), cp = layout.cp();
  const double t = tp;
  const double layers = static_cast<double>(model_.numLayers / pp);  // per stage
  const double h = static_cast<double>(model_.hiddenSize);
  const double f = static_cast<double>(model_.ffnHiddenSize);
  const double kv = static_cast<double>(model_.numQueryGroups * model_.headDim());
  const double vocab = static_cast<double>(model_.vocabSize) / t;  // head rows on this rank
  const double b = static_cast<double>(model_.paramBytes);
  const double g = static_cast<double>(options_.gradBytes);
  const bool gpt = model_.family == ModelFamily::kGpt;
  const bool sp = options_.sequenceParallel && tp > 1;
  const bool full = recompute == Recompute::kFull;
  const double products = full ? 4.0 : 3.0;
  const double flops = hardware_.achievedFlops();
  const double memory = hardware_.achievedMemoryBandwidth();
  auto memorySeconds = [memory](double bytes) { return memory > 0 ? bytes / memory : 0.0; };

  // 1. Matrix products: FLOPs at the peak rate plus their operands' bytes.
  double productToken = 0, productMicroBatch = 0;
  for (const auto& [k, n] : model_.layerMatrices(tp)) {
    const double K = static_cast<double>(k), N = static_cast<double>(n);
    productToken += products * 2.0 * K * N / flops + memorySeconds(products * b * (K + N));
    productMicroBatch += memorySeconds((products * b + 2.0 * g) * K * N);
  }
  // 2. Attention, per token^2, and its per-token part from the efficiency curve.
  const int64_t d = model_.headDim();
  const double pad = static_cast<double>((d + kHeadDimStep - 1) / kHeadDimStep * kHeadDimStep) / d;
  const double attention = (recompute == Recompute::kNone ? kAttentionFlops : kAttentionRecomputeFlops) * (h / t) * pad /
                           hardware_.achievedAttentionFlops();
  // 3. Elementwise kernels.
  const double bytes = gpt ? kGptNormRegionBytes * h / (sp ? t : 1.0) + kGptActivationBytes * f / t
                           : kLlamaNormRegionBytes * h / (sp ? t : 1.0) + kLlamaActivationBytes * f / t +
                                 kLlamaRotaryBytes * (h + kv) / t;
  const double elementwise = memorySeconds(bytes * b / 2.0) * (full ? 4.0 / 3.0 : 1.0);

  LayoutTerms out;
  out.recompute = recompute;
  out.beta = layers * attention;
  out.gamma = layers * hardware_.sequenceOverheadSeconds;
  out.alphaCompute = layers * (productToken + attention * hardware_.attentionHalfLength + elementwise);
  out.microBatchSeconds = layers * (productMicroBatch + hardware_.layerOverheadSeconds);
  // 12. CUDA graphs: layouts of one stage and no cp that keep their activations, at tp > 1 when
  // every bucket divides into its sequence-parallel slices.
  out.graphs = !full && layoutRunsGraphs(layout);
  if (out.graphs) {
    out.graphSavedSeconds = layers * (hardware_.layerOverheadSeconds - options_.graphLayerOverheadSeconds);
    // The largest bucket whose attention is static: heads per rank * B^2 scores in one call.
    const double heads = static_cast<double>(model_.numAttentionHeads / tp);
    for (int64_t bucket : options_.graphBuckets) {
      const double b = static_cast<double>(bucket);
      if (!options_.graphMaxScores || heads * b * b <= static_cast<double>(*options_.graphMaxScores)) {
        out.graphMaxTokens = bucket;
      }
    }
  }

  // 6. The head and the loss, on the last stage.
  const double headToken = 3.0 * 2.0 * h * vocab / flops + memorySeconds(3.0 * b * (h + vocab)) +
                           memorySeconds(kLossBytesPerLogit * vocab);
  const double headMicroBatch = memorySeconds((3.0 * b + 2.0 * g) * h * vocab);
  double headTpToken = 0, headTpMicroBatch = 0;

  // 4. Tensor-parallel collectives (ring: tp - 1 steps, each a tp-th of the buffer).
  if (tp > 1) {
    const auto [bw, lat] = groupLink(layout, Axis::kTp);
    // Per layer per micro-batch. Sequence parallelism: 2 all-gathers and 2 reduce-scatters
    // forward; backward, each column-parallel product gathers its input again for its weight
    // gradient and reduce-scatters its input gradient, each row-parallel one gathers its output
    // gradient (6). Without: 2 all-reduces each way, each two collectives' traffic. The
    // column-parallel products' 4 backward ones run beside their products: tpOverlap of them hides.
    // A rerun that stops early skips its chunk's last row-parallel collective: the stage's
    // layers cut into ceil(layers / k) chunks.
    const int64_t k = options_.recomputeChunkLayers;
    const double chunks = k > 0 ? std::ceil(layers / static_cast<double>(k)) : 0.0;
    const double skipped = full && k > 0 ? (sp ? 1.0 : 2.0) * chunks / layers : 0.0;
    const double collectives = (sp ? 10 : 8) + (full ? 4 : 0) - skipped - 4.0 * options_.tpOverlap;
    out.alphaTp = layers * collectives * (t - 1) / t * h * b / bw;
    out.microBatchTpSeconds = layers * collectives * (t - 1) * lat;
    if (out.graphs) {  // 12: graphed layers are compiled, and wait for each collective as posted
      out.graphTpAlpha = layers * 4.0 * options_.tpOverlap * (t - 1) / t * h * b / bw;
      out.graphTpMicroBatchSeconds = layers * 4.0 * options_.tpOverlap * (t - 1) * lat;
    }
    // The head, a column-parallel product that runs eagerly in Megatron-LM and here (never
    // compiled or graphed): under sequence parallelism its input gathered forward; backward,
    // the input gathered again and its gradient reduce-scattered beside the products, hidden
    // (without, the input gradient's all-reduce beside the weight gradient's product). Three
    // all-reduces of one fp32 value per token in the loss.
    const double headCollectives = sp ? 1.0 : 0.0;
    headTpToken = headCollectives * (t - 1) / t * h * b / bw + 3.0 * 2.0 * (t - 1) / t * 4.0 / bw;
    headTpMicroBatch = (headCollectives + 3.0 * 2.0) * (t - 1) * lat;
  }
  out.alphaCompute += headToken;
  out.alphaTp += headTpToken;
  out.microBatchTpSeconds += headTpMicroBatch;
  out.microBatchSeconds += headMicroBatch + out.microBatchTpSeconds;
  out.lastStageAlpha = headToken + headTpToken;
  out.lastStageMicroBatchSeconds = headMicroBatch + headTpMicroBatch;

  // 7. Stage-boundary transfers, over the NIC when the stages sit on different nodes.
  if (pp > 1) {
    const bool inter = spansNodes(layout, Axis::kPp);
    out.p2pPerToken = h * b / (sp ? t : 1.0) / (inter ? hardware_.interNodeBandwidth : hardware_.intraNodeBandwidth);
    out.p2pLatency = inter ? hardware_.interNodeLatency : hardware_.intraNodeLatency;
  }
  // 10. Context parallelism: a rank's share of the micro-batch's work, and the K/V exchange.
  out.cp = cp;
  if (cp > 1) {
    const double c = cp;
    out.alphaCompute /= c;
    out.alphaTp /= c;
    out.beta /= c;
    out.lastStageAlpha /= c;
    out.p2pPerToken /= c;
    const auto [bw, lat] = groupLink(layout, Axis::kCp);
    const double collectives = full ? 3 : 2;  // per layer: gather forward (and again), reduce-scatter backward
    const double keyValueBytes = static_cast<double>(gatheredKeyValueBytesPerToken(layout));
    out.alphaCp = (1.0 - options_.cpOverlap) * layers * collectives * (c - 1) / c * keyValueBytes / bw;
    out.microBatchCpSeconds = layers * collectives * (c - 1) * lat;
    out.microBatchSeconds += out.microBatchCpSeconds;
  }
  // 8. Gradient reduction over the data group.
  out.dpSeconds = dataCollectiveSeconds(layout, gradientBytes(layout), !options_.zero);
  // 11. What this machine's measured phases say of the layout beyond the shared coefficients.
  if (const auto it = options_.layoutScale.find(layout.name()); it != options_.layoutScale.end()) {
    const double k = it->second;
    for (double* term : {&out.alphaCompute, &out.alphaTp, &out.beta, &out.gamma, &out.microBatchSeconds,
                         &out.microBatchTpSeconds, &out.lastStageAlpha, &out.lastStageMicroBatchSeconds,
                         &out.p2pPerToken, &out.p2pLatency, &out.dpSeconds, &out.alphaCp, &out.microBatchCpSeconds,
                         &out.graphSavedSeconds, &out.graphTpAlpha, &out.graphTpMicroBatchSeconds}) {
      *term *= k;
    }
  }
  return out;
}

PhaseCost CostModel::phase(const Layout& layout, const PhaseBatches& batches) const {
  return phase(layout, terms(layout), batches);
}

PhaseCost CostModel::phase(const Layout& layout, Recompute recompute, const PhaseBatches& batches) const {
  return phase(layout, terms(layout, recompute), batches);
}

PhaseCost CostModel::phase(const Layout& layout, const LayoutTerms& t, const PhaseBatches& batches,
                           const std::vector<std::vector<int64_t>>* graphTokens) const {
  HS_CHECK(static_cast<int>(batches.size()) == layout.dp(), "phase under ", layout.name(), " got ",
           batches.size(), " replicas of micro-batches, expected dp(", layout.dp(), ")");
  for (const auto& replica : batches) {
    for (const auto& micro : replica) {
      for (int64_t s : micro) HS_CHECK(s >= 1, "sequence length must be >= 1, got ", s);
    }
  }
  if (graphTokens != nullptr) {
    HS_CHECK(graphTokens->size() == batches.size(), "graph_tokens has ", graphTokens->size(),
             " replicas, expected the batches' ", batches.size());
    const auto& buckets = options_.graphBuckets;
    for (size_t r = 0; r < batches.size(); ++r) {
      HS_CHECK((*graphTokens)[r].size() == batches[r].size(), "graph_tokens[", r, "] has ",
               (*graphTokens)[r].size(), " entries, expected one per micro-batch (", batches[r].size(), ")");
      for (size_t k = 0; k < batches[r].size(); ++k) {
        const int64_t b = (*graphTokens)[r][k];
        if (b == 0) continue;
        int64_t n = 0;
        for (int64_t s : batches[r][k]) n += s;
        HS_CHECK(t.graphs, "graph_tokens[", r, "][", k, "] is ", b, " but ", layout.name(),
                 " runs no CUDA graphs (graph buckets, each a multiple of tp; pp and cp 1; no full recomputation)");
        HS_CHECK(std::binary_search(buckets.begin(), buckets.end(), b) && b >= n, "graph_tokens[", r, "][", k,
                 "] is ", b, ", expected 0 or a graph bucket that holds the micro-batch's ", n, " tokens");
        HS_CHECK(b <= t.graphMaxTokens, "graph_tokens[", r, "][", k, "] is ", b, " but ", layout.name(),
                 "'s attention is static up to ", t.graphMaxTokens, " tokens (graph_max_scores ",
                 *options_.graphMaxScores, ")");
      }
    }
  }
  const int pp = layout.pp(), tp = layout.tp();
  const int64_t perTokenLayer = activationBytesPerTokenLayer(layout, t.recompute);
  // Without flash attention the attention core's per-token^2 bytes: of the micro-batches in
  // flight, or of the one layer a full recomputation rebuilds.
  const double perSquareLayer = attentionBytesPerSquareLayer(layout, Recompute::kNone);
  const double keptPerSquareLayer = attentionBytesPerSquareLayer(layout, t.recompute);

  PhaseCost cost;
  int64_t worstActivations = 0;
  double worstReplica = -1;
  std::vector<std::pair<int64_t, double>> tokens;  // per micro-batch: tokens, sum of squares
  std::vector<double> last, transfer;
  std::vector<std::vector<double>> forward(pp), backward(pp);
  for (const auto& replica : batches) {
    const size_t m = replica.size();
    double work = 0, tpWork = 0, cpWork = 0;
    tokens.clear();
    last.assign(m, 0);
    transfer.assign(m, 0);
    for (auto& stage : forward) stage.assign(m, 0);
    for (auto& stage : backward) stage.assign(m, 0);
    for (size_t k = 0; k < m; ++k) {
      double n = 0, squares = 0;
      for (int64_t s : replica[k]) {
        n += static_cast<double>(s);
        squares += static_cast<double>(s) * static_cast<double>(s);
      }
      tokens.push_back({static_cast<int64_t>(n), squares});
      const double count = static_cast<double>(replica[k].size());
      // The tokens, squares and sequences of the micro-batch's slowest rank, in units of the
      // terms: the whole micro-batch when cp == 1; under cp the slowest cp rank's part, its
      // tokens and pairs scaled by cp (the terms divide the balanced work by cp).
      double rankTokens = n, rankSquares = squares, rankSequences = count;
      if (t.cp > 1) {
        const double c = t.cp;
        double slowest = -1;
        for (const ContextLoad& load : contextSplitLoads(replica[k], t.cp, options_.cpMinChunk)) {
          const double x = c * static_cast<double>(load.tokens), y = 2.0 * c * load.pairs;
          const double seconds = (t.alpha() - t.alphaCp) * x + t.beta * y + t.gamma * static_cast<double>(load.sequences);
          if (seconds > slowest) {
            slowest = seconds;
            rankTokens = x;
            rankSquares = y;
            rankSequences = static_cast<double>(load.sequences);
          }
        }
      }
      const double cpExchange = t.alphaCp * n + t.microBatchCpSeconds;
      last[k] = (t.alpha() - t.alphaCp) * rankTokens + t.beta * rankSquares + t.gamma * rankSequences +
                t.microBatchSeconds + t.alphaCp * n;
      auto [bucket, added] = graphChoice(t, n);
      if (graphTokens != nullptr) {  // as it ran
        bucket = (*graphTokens)[static_cast<size_t>(&replica - batches.data())][k];
        added = bucket > 0 ? graphAdded(t, n, static_cast<double>(bucket)) : 0.0;
      }
      if (bucket > 0) {  // 12: padded, from the graphs
        last[k] += added;
        tokens.back().first = bucket;
        tokens.back().second += (static_cast<double>(bucket) - n) * (static_cast<double>(bucket) - n);
        ++cost.graphedMicroBatches;
        tpWork += t.graphTpAlpha * static_cast<double>(bucket) + t.graphTpMicroBatchSeconds;
      }
      const double middle = last[k] - t.lastStageAlpha * rankTokens - t.lastStageMicroBatchSeconds;
      work += last[k];
      tpWork += t.alphaTp * rankTokens + t.microBatchTpSeconds;
      cpWork += cpExchange;
      transfer[k] = t.p2pPerToken * rankTokens + t.p2pLatency;
      for (int j = 0; j < pp; ++j) {
        const double stage = j == pp - 1 ? last[k] : middle;
        forward[j][k] = kForwardShare * stage;
        backward[j][k] = stage - forward[j][k];
      }
    }
    const double total = pp == 1 ? work : oneForwardOneBackward(forward, backward, transfer);
    if (total > worstReplica) {
      worstReplica = total;
      cost.computeSeconds = work - tpWork - cpWork;
      cost.tpSeconds = tpWork;
      cost.cpSeconds = cpWork;
      cost.ppSeconds = total - work;
    }
    // Activation peak: the first stage keeps up to pp micro-batches in flight.
    std::sort(tokens.rbegin(), tokens.rend());
    int64_t inFlight = 0;
    double inFlightSquares = 0;
    for (size_t k = 0; k < tokens.size() && k < static_cast<size_t>(pp); ++k) {
      inFlight += tokens[k].first;
      inFlightSquares += tokens[k].second;
    }
    int64_t layers = model_.numLayers / pp;
    int64_t acts = inFlight * perTokenLayer * layers +
                   static_cast<int64_t>(std::ceil(inFlightSquares * keptPerSquareLayer * static_cast<double>(layers)));
    if (!tokens.empty()) {
      const auto& [largest, largestSquares] = tokens.front();
      if (t.recompute == Recompute::kFull) {  // one layer rebuilt
        acts += largest * (34 * model_.hiddenSize * model_.paramBytes / 2 / tp / layout.cp() +
                           (layout.cp() > 1 ? gatheredKeyValueBytesPerToken(layout) : 0)) +
                static_cast<int64_t>(std::ceil(largestSquares * perSquareLayer));
      }
      const int64_t rows = (largest + layout.cp() - 1) / layout.cp();  // a cp rank's share, balanced
      acts += rows * ((model_.vocabSize + tp - 1) / tp) * 4 * 2;  // logits
    }
    worstActivations = std::max(worstActivations, acts);
  }
  cost.dpSeconds = t.dpSeconds;
  cost.totalSeconds = std::max(worstReplica, 0.0) + cost.dpSeconds;
  cost.staticBytes = staticBytes(layout);
  cost.activationBytes = worstActivations;
  cost.peakBytes = cost.staticBytes + cost.activationBytes;
  cost.fits = cost.peakBytes <= hardware_.memoryBytes;
  return cost;
}

std::pair<int64_t, double> CostModel::graphChoice(const LayoutTerms& t, double tokens) const {
  if (!t.graphs || tokens <= 0) return {0, 0.0};
  const auto& buckets = options_.graphBuckets;
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), tokens,
                                   [](int64_t b, double n) { return static_cast<double>(b) < n; });
  if (it == buckets.end() || *it > t.graphMaxTokens) return {0, 0.0};
  const double added = graphAdded(t, tokens, static_cast<double>(*it));
  return added < 0 ? std::make_pair(*it, added) : std::make_pair(int64_t{0}, 0.0);
}

double CostModel::graphAdded(const LayoutTerms& t, double tokens, double bucket) {
  const double pad = bucket - tokens;
  return t.alpha() * pad + t.beta * pad * pad + (pad > 0 ? t.gamma : 0.0) - t.graphSavedSeconds +
         t.graphTpAlpha * bucket + t.graphTpMicroBatchSeconds;
}

int64_t CostModel::graphTokens(const LayoutTerms& terms, const std::vector<int64_t>& lengths) const {
  double tokens = 0;
  for (int64_t s : lengths) {
    HS_CHECK(s >= 1, "sequence length must be >= 1, got ", s);
    tokens += static_cast<double>(s);
  }
  return graphChoice(terms, tokens).first;
}

double CostModel::stepSeconds(const Layout& layout) const {
  layout.validate(topology_.world());
  const double params = rankParams(layout);
  const double shard = options_.zero ? params / layout.dataSize() : params;
  double seconds = hardware_.stepOverheadSeconds;
  if (options_.zero) {
    seconds += dataCollectiveSeconds(layout, params * static_cast<double>(model_.paramBytes), false);
  }
  const double memory = hardware_.achievedMemoryBandwidth();
  if (memory > 0) {
    const double g = static_cast<double>(options_.gradBytes);
    const double update = g + 2.0 * static_cast<double>(options_.optimizerBytesPerParam) +
                          static_cast<double>(model_.paramBytes);
    seconds += (shard * update + params * g) / memory;
  }
  return seconds;
}

}  // namespace hotswitch
