#include "planner/CostModel.h"

#include <algorithm>

#include "common/Check.h"

namespace hotswitch {

CostModel::CostModel(ModelConfig model, HardwareProfile hardware, Topology topology, CostOptions options)
    : model_(std::move(model)), hardware_(std::move(hardware)), topology_(topology), options_(options) {
  model_.validate();
  hardware_.validate();
  HS_CHECK(options_.gradBytes == 2 || options_.gradBytes == 4, "grad_bytes must be 2 or 4, got ",
           options_.gradBytes);
  HS_CHECK(options_.optimizerBytesPerParam >= 0, "optimizer_bytes_per_param must be >= 0, got ",
           options_.optimizerBytesPerParam);
}

double CostModel::forwardFlops(int64_t s) const {
  const double h = static_cast<double>(model_.hiddenSize);
  const double linear = static_cast<double>(model_.layerParams() - 2 * model_.hiddenSize);
  const double perLayer = 2.0 * linear * s + 2.0 * static_cast<double>(s) * s * h;
  return model_.numLayers * perLayer + 2.0 * model_.vocabSize * h * s;
}

double CostModel::trainingFlops(int64_t s) const {
  // Recomputation reruns the layers' forward, not the head's.
  const double head = 2.0 * model_.vocabSize * static_cast<double>(model_.hiddenSize) * s;
  return (forwardFlops(s) - head) * (model_.recompute ? 4.0 : 3.0) + 3.0 * head;
}

int64_t CostModel::staticBytes(const Layout& layout) const {
  const int64_t tp = layout.tp(), pp = layout.pp();
  // The first stage holds the embedding; the last the head and final norm; with pp == 1
  // both. The fuller of the two bounds every stage.
  const int64_t layers = model_.numLayers / pp * model_.layerParams();
  const int64_t emb = model_.embeddingParams();
  int64_t params = pp == 1 ? layers + 2 * emb + model_.hiddenSize : layers + emb + model_.hiddenSize;
  params = (params + tp - 1) / tp;
  int64_t optimizer = params * options_.optimizerBytesPerParam;
  if (options_.zero) optimizer = (optimizer + layout.dataSize() - 1) / layout.dataSize();
  return params * (model_.paramBytes + options_.gradBytes) + optimizer;
}

int64_t CostModel::activationBytesPerTokenLayer(const Layout& layout) const {
  const int64_t scale = model_.paramBytes;  // the 34 h counts bytes at 16 bits: 2 per element
  const int64_t perToken = (model_.recompute ? 2 : 34) * model_.hiddenSize * scale / 2;
  return (perToken + layout.tp() - 1) / layout.tp();
}

double CostModel::gradientBytes(const Layout& layout) const {
  return static_cast<double>(model_.numLayers / layout.pp() * model_.layerParams() + model_.embeddingParams()) /
         layout.tp() * options_.gradBytes;
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

double CostModel::collectiveSeconds(const Layout& layout, Axis axis, double bytes, bool allReduce) const {
  const int n = layout.degree(axis);
  if (n <= 1 || bytes <= 0) return 0;
  const bool inter = spansNodes(layout, axis);
  const double bw = inter ? hardware_.interNodeBandwidth : hardware_.intraNodeBandwidth;
  const double lat = inter ? hardware_.interNodeLatency : hardware_.intraNodeLatency;
  const double steps = allReduce ? 2.0 * (n - 1) : (n - 1);
  return steps * (bytes / n / bw + lat);
}

LayoutTerms CostModel::terms(const Layout& layout) const {
  layout.validate(topology_.world());
  model_.validate(layout);
  HS_CHECK(layout.cp() == 1, "layout ", layout.name(), " has cp(", layout.cp(),
           "); the cost model covers cp == 1 only");
  const int pp = layout.pp(), tp = layout.tp();
  const double h = static_cast<double>(model_.hiddenSize);
  const double layers = static_cast<double>(model_.numLayers / pp);  // per stage
  const double factor = model_.recompute ? 4.0 : 3.0;
  const double linear = static_cast<double>(model_.layerParams() - 2 * model_.hiddenSize);
  const double head = 2.0 * static_cast<double>(model_.vocabSize) * h;

  LayoutTerms t;
  t.alphaCompute = (factor * layers * 2.0 * linear + 3.0 * head) / tp / hardware_.achievedFlops();
  t.beta = factor * layers * 2.0 * h / tp / hardware_.achievedAttentionFlops();
  t.gamma = layers * hardware_.sequenceOverheadSeconds;
  if (tp > 1) {
    const int collectives = model_.recompute ? 12 : 8;  // per layer per micro-batch
    const bool inter = spansNodes(layout, Axis::kTp);
    const double bw = inter ? hardware_.interNodeBandwidth : hardware_.intraNodeBandwidth;
    const double lat = inter ? hardware_.interNodeLatency : hardware_.intraNodeLatency;
    t.alphaTp = layers * collectives * (tp - 1.0) / tp * h * model_.paramBytes / bw;
    t.microBatchTpSeconds = layers * collectives * (tp - 1.0) * lat;
  }
  t.microBatchSeconds = layers * hardware_.layerOverheadSeconds + t.microBatchTpSeconds;
  if (pp > 1) {
    const bool inter = spansNodes(layout, Axis::kPp);
    t.p2pPerToken = h * model_.paramBytes / tp / (inter ? hardware_.interNodeBandwidth : hardware_.intraNodeBandwidth);
    t.p2pLatency = inter ? hardware_.interNodeLatency : hardware_.intraNodeLatency;
  }
  t.dpSeconds = collectiveSeconds(layout, Axis::kDp, gradientBytes(layout), !options_.zero);
  return t;
}

PhaseCost CostModel::phase(const Layout& layout, const PhaseBatches& batches) const {
  return phase(layout, terms(layout), batches);
}

PhaseCost CostModel::phase(const Layout& layout, const LayoutTerms& t, const PhaseBatches& batches) const {
  HS_CHECK(static_cast<int>(batches.size()) == layout.dp(), "phase under ", layout.name(), " got ",
           batches.size(), " replicas of micro-batches, expected dp(", layout.dp(), ")");
  for (const auto& replica : batches) {
    for (const auto& micro : replica) {
      for (int64_t s : micro) HS_CHECK(s >= 1, "sequence length must be >= 1, got ", s);
    }
  }
  const int pp = layout.pp(), tp = layout.tp();
  const int64_t perTokenLayer = activationBytesPerTokenLayer(layout);

  PhaseCost cost;
  int64_t worstActivations = 0;
  double worstReplica = 0;
  std::vector<int64_t> tokens;
  for (const auto& replica : batches) {
    double sumStage = 0, compute = 0, tpComm = 0, worstBubble = -1, bubbleStage = 0, bubbleP2p = 0;
    tokens.clear();
    for (const auto& micro : replica) {
      double n = 0, squares = 0;
      for (int64_t s : micro) {
        n += static_cast<double>(s);
        squares += static_cast<double>(s) * static_cast<double>(s);
      }
      tokens.push_back(static_cast<int64_t>(n));
      const double count = static_cast<double>(micro.size());
      const double stageCompute = t.alphaCompute * n + t.beta * squares + t.gamma * count +
                                  (t.microBatchSeconds - t.microBatchTpSeconds);
      const double stageTp = t.alphaTp * n + t.microBatchTpSeconds;
      const double stage = stageCompute + stageTp;
      const double p2p = pp > 1 ? 2.0 * (t.p2pPerToken * n + t.p2pLatency) : 0.0;
      sumStage += stage;
      compute += stageCompute;
      tpComm += stageTp;
      if (stage + p2p > worstBubble) {
        worstBubble = stage + p2p;
        bubbleStage = stage;
        bubbleP2p = p2p;
      }
    }
    const double total = replica.empty() ? 0.0 : sumStage + (pp - 1) * (bubbleStage + bubbleP2p);
    if (total > worstReplica) {
      worstReplica = total;
      const double bubbleShare = sumStage > 0 ? (sumStage + (pp - 1) * bubbleStage) / sumStage : 1.0;
      cost.computeSeconds = compute * bubbleShare;
      cost.tpSeconds = tpComm * bubbleShare;
      cost.ppSeconds = (pp - 1) * bubbleP2p;
    }
    // Activation peak: the first stage keeps up to pp micro-batches in flight.
    std::sort(tokens.rbegin(), tokens.rend());
    int64_t inFlight = 0;
    for (size_t k = 0; k < tokens.size() && k < static_cast<size_t>(pp); ++k) inFlight += tokens[k];
    int64_t layers = model_.numLayers / pp;
    int64_t acts = inFlight * perTokenLayer * layers;
    if (model_.recompute && !tokens.empty()) {
      acts += tokens.front() * (34 * model_.hiddenSize * model_.paramBytes / 2 / tp);  // one layer rebuilt
    }
    if (!tokens.empty()) acts += tokens.front() * ((model_.vocabSize + tp - 1) / tp) * 4 * 2;  // logits
    worstActivations = std::max(worstActivations, acts);
  }
  cost.dpSeconds = t.dpSeconds;
  cost.totalSeconds = worstReplica + cost.dpSeconds;
  cost.staticBytes = staticBytes(layout);
  cost.activationBytes = worstActivations;
  cost.peakBytes = cost.staticBytes + cost.activationBytes;
  cost.fits = cost.peakBytes <= hardware_.memoryBytes;
  return cost;
}

}  // namespace hotswitch
