// The one pybind11 module, hotswitch._C: thin bindings over the C++ core. Validation lives
// in the core (InvalidArgument -> ValueError); the public API is python/hotswitch.

#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <optional>

#include "common/Check.h"
#include "common/Logging.h"
#include "layout/Layout.h"
#include "layout/ParamSpec.h"
#include "layout/Placement.h"
#include "layout/Topology.h"
#include "planner/CostModel.h"
#include "planner/Planner.h"
#include "planner/SwitchEstimate.h"
#include "redistribute/PlanCache.h"
#include "redistribute/SwitchExecutor.h"
#include "transport/C10dTransport.h"

namespace py = pybind11;
using namespace hotswitch;

namespace {

Axis parseAxis(const std::string& name) {
  for (Axis a : {Axis::kTp, Axis::kCp, Axis::kDp, Axis::kPp}) {
    if (name == axisName(a)) return a;
  }
  HS_CHECK(false, "axis '", name, "' is not one of tp, cp, dp, pp");
  return Axis::kTp;
}

// A recompute mode from its name, or from a bool (True: full recomputation, False: none).
Recompute recomputeArg(const py::object& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? Recompute::kFull : Recompute::kNone;
  HS_CHECK(py::isinstance<py::str>(value), "recompute must be 'none', 'selective', 'full' or a bool, got ",
           static_cast<std::string>(py::repr(value)));
  return parseRecompute(value.cast<std::string>());
}

py::dict statsDict(const PlanStats& s) {
  py::dict d;
  d["bytes_moved"] = s.bytesMoved;
  d["inter_node_bytes"] = s.interNodeBytes;
  d["max_send_bytes"] = s.maxSendBytes;
  d["max_recv_bytes"] = s.maxRecvBytes;
  d["num_messages"] = s.numMessages;
  d["local_copy_bytes"] = s.localCopyBytes;
  d["lower_bound_bytes"] = s.lowerBoundBytes;
  d["lower_bound_inter_node_bytes"] = s.lowerBoundInterNodeBytes;
  d["same_node_first_max_send_bytes"] = s.sameNodeFirstMaxSendBytes;
  d["max_send_seconds"] = s.maxSendSeconds;
  d["same_node_first_max_send_seconds"] = s.sameNodeFirstMaxSendSeconds;
  return d;
}

// Seconds from Python as a duration; InvalidArgument unless finite and in (0, 1e7].
std::chrono::milliseconds toTimeout(double seconds) {
  HS_CHECK(seconds > 0 && seconds <= 1e7, "timeout must be in (0, 1e7] seconds, got ", seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3 + 0.5));
}

const std::vector<BufferSpec>& buffersOf(const std::vector<std::vector<BufferSpec>>& perRank, int rank) {
  HS_CHECK(rank >= 0 && rank < static_cast<int>(perRank.size()), "rank ", rank, " outside world(",
           perRank.size(), ")");
  return perRank[rank];
}

py::list buffersList(const std::vector<BufferSpec>& buffers) {
  py::list out;
  for (const BufferSpec& b : buffers) {
    out.append(py::make_tuple(b.tensor, b.shape, dtypeName(b.dtype)));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hotswitch native core";
  // The torch this module was compiled against: it runs under that release only.
  m.attr("TORCH_VERSION") = HOTSWITCH_TORCH_VERSION;

  // The exception types live in the module, stored once without a C++ destructor that would
  // run after the interpreter has shut down (a static py::exception would).
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> faultError;
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> timeoutError;
  faultError.call_once_and_store_result(
      [&] { return py::exception<Fault>(m, "SwitchFault", PyExc_RuntimeError); });
  timeoutError.call_once_and_store_result(
      [&] { return py::exception<Timeout>(m, "SwitchTimeout", faultError.get_stored()); });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      py::set_error(PyExc_ValueError, e.what());
    } catch (const Timeout& e) {
      py::set_error(timeoutError.get_stored(), e.what());
    } catch (const Fault& e) {
      py::set_error(faultError.get_stored(), e.what());
    }
  });

  m.def("set_log_level", [](const std::string& level) { setLogLevel(parseLogLevel(level)); },
        py::arg("level"));
  m.def("log_level", [] {
    static const char* names[] = {"trace", "debug", "info", "warn", "error", "off"};
    return std::string(names[static_cast<int>(logLevel())]);
  });

  py::class_<Topology>(m, "Topology")
      .def(py::init<int, int>(), py::arg("world"), py::arg("ranks_per_node"))
      .def_property_readonly("world", &Topology::world)
      .def_property_readonly("ranks_per_node", &Topology::ranksPerNode)
      .def_property_readonly("num_nodes", &Topology::numNodes)
      .def("node", &Topology::node, py::arg("rank"))
      .def("__eq__", &Topology::operator==)
      .def("__repr__", &Topology::toString);

  py::class_<Layout>(m, "Layout")
      .def(py::init([](int dp, int tp, int pp, int cp, const std::string& order) {
             return Layout(dp, tp, pp, cp, Layout::parseOrder(order));
           }),
           py::arg("dp") = 1, py::arg("tp") = 1, py::arg("pp") = 1, py::arg("cp") = 1,
           py::arg("order") = "tp-cp-dp-pp")
      .def_static("parse", &Layout::parse, py::arg("text"))
      .def_static("enumerate", &Layout::enumerate, py::arg("world"), py::arg("max_cp") = 1,
                  "Every layout of the world with cp <= max_cp, sorted by (cp, pp, tp, dp).")
      .def_property_readonly("dp", &Layout::dp)
      .def_property_readonly("tp", &Layout::tp)
      .def_property_readonly("pp", &Layout::pp)
      .def_property_readonly("cp", &Layout::cp)
      .def_property_readonly("world", &Layout::world)
      .def_property_readonly("order", &Layout::orderName)
      .def_property_readonly("name", &Layout::name)
      .def("validate", &Layout::validate, py::arg("world"))
      .def("coord", [](const Layout& l, int rank) {
        Coord c = l.coord(rank);
        py::dict d;
        for (Axis a : {Axis::kDp, Axis::kTp, Axis::kPp, Axis::kCp}) d[axisName(a)] = c[static_cast<int>(a)];
        return d;
      }, py::arg("rank"))
      .def("rank", [](const Layout& l, int dp, int tp, int pp, int cp) {
        Coord c{};
        c[static_cast<int>(Axis::kDp)] = dp;
        c[static_cast<int>(Axis::kTp)] = tp;
        c[static_cast<int>(Axis::kPp)] = pp;
        c[static_cast<int>(Axis::kCp)] = cp;
        return l.rank(c);
      }, py::arg("dp") = 0, py::arg("tp") = 0, py::arg("pp") = 0, py::arg("cp") = 0)
      .def("group", [](const Layout& l, const std::string& axis, int rank) {
        return l.group(parseAxis(axis), rank);
      }, py::arg("axis"), py::arg("rank"))
      .def("groups", [](const Layout& l, const std::string& axis) {
        return l.groups(parseAxis(axis));
      }, py::arg("axis"))
      .def("data_group", &Layout::dataGroup, py::arg("rank"))
      .def("data_index", &Layout::dataIndex, py::arg("rank"))
      .def("__eq__", &Layout::operator==)
      .def("__hash__", [](const Layout& l) { return std::hash<std::string>()(l.name()); })
      .def("__repr__", [](const Layout& l) { return "Layout('" + l.name() + "')"; })
      .def("__str__", &Layout::name);

  py::class_<ParamSpec>(m, "ParamSpec")
      .def(py::init([](const std::string& name, const Shape& shape, const std::string& dtype,
                       const std::string& rule, const std::vector<int64_t>& groups,
                       const std::string& stage, int layer) {
             ParamSpec s;
             s.name = name;
             s.shape = shape;
             s.dtype = parseDType(dtype);
             s.rule = parseShardRule(rule);
             s.groups = groups;
             s.stage = parseStageRole(stage);
             s.layer = layer;
             s.validate();
             return s;
           }),
           py::arg("name"), py::arg("shape"), py::arg("dtype") = "float32",
           py::arg("rule") = "replicated", py::arg("groups") = std::vector<int64_t>{},
           py::arg("stage") = "layer", py::arg("layer") = 0)
      .def_readonly("name", &ParamSpec::name)
      .def_readonly("shape", &ParamSpec::shape)
      .def_property_readonly("dtype", [](const ParamSpec& s) { return dtypeName(s.dtype); })
      .def_property_readonly("rule", [](const ParamSpec& s) { return shardRuleName(s.rule); })
      .def_readonly("groups", &ParamSpec::groups)
      .def_property_readonly("stage", [](const ParamSpec& s) { return stageRoleName(s.stage); })
      .def_readonly("layer", &ParamSpec::layer)
      .def_property_readonly("numel", &ParamSpec::numel)
      .def_property_readonly("nbytes", &ParamSpec::bytes)
      .def("__repr__", &ParamSpec::toString);

  py::class_<TensorSet>(m, "TensorSet")
      .def(py::init([](std::vector<ParamSpec> specs, int numLayers) {
             TensorSet set{std::move(specs), numLayers};
             set.validate();
             return set;
           }),
           py::arg("specs"), py::arg("num_layers"))
      .def_readonly("specs", &TensorSet::specs)
      .def_readonly("num_layers", &TensorSet::numLayers)
      .def("fingerprint", &TensorSet::fingerprint);

  py::class_<Placement>(m, "Placement")
      .def(py::init([](const TensorSet& set, const Layout& layout, const std::string& kind) {
             return Placement::make(set, layout, parsePlacementKind(kind));
           }),
           py::arg("tensor_set"), py::arg("layout"), py::arg("kind") = "sharded")
      .def_property_readonly("key", &Placement::key)
      .def_property_readonly("world", &Placement::world)
      .def("buffers", [](const Placement& p, int rank) { return buffersList(p.rank(rank).buffers); },
           py::arg("rank"))
      .def("pieces", [](const Placement& p, int rank) {
        py::list out;
        for (const Piece& piece : p.rank(rank).pieces) {
          out.append(py::make_tuple(piece.tensor, piece.box.lo, piece.box.hi, piece.buffer,
                                    piece.offset, piece.strides, piece.summand));
        }
        return out;
      }, py::arg("rank"));

  py::class_<CachedPlan, std::shared_ptr<CachedPlan>>(m, "Plan")
      .def_property_readonly("stats", [](const CachedPlan& c) { return statsDict(c.plan.stats); })
      .def_property_readonly("build_seconds", [](const CachedPlan& c) { return c.buildSeconds; })
      .def_property_readonly("send_bytes", [](const CachedPlan& c) { return c.plan.sendBytes; })
      .def_property_readonly("recv_bytes", [](const CachedPlan& c) { return c.plan.recvBytes; })
      .def_property_readonly("sums_summands", [](const CachedPlan& c) { return c.plan.sumsSummands; })
      .def("messages", [](const CachedPlan& c) {
        py::list out;
        for (const Message& msg : c.plan.messages) {
          out.append(py::make_tuple(msg.src, msg.dst, msg.bytes, msg.segments.size()));
        }
        return out;
      })
      .def("src_buffers", [](const CachedPlan& c, int rank) { return buffersList(buffersOf(c.plan.srcBuffers, rank)); },
           py::arg("rank"))
      .def("dst_buffers", [](const CachedPlan& c, int rank) { return buffersList(buffersOf(c.plan.dstBuffers, rank)); },
           py::arg("rank"))
      .def("summary", [](const CachedPlan& c) { return c.plan.summary(); });

  py::class_<PlanCache, std::shared_ptr<PlanCache>>(m, "PlanCache")
      .def(py::init<>())
      .def("get", [](PlanCache& cache, const TensorSet& set, const Layout& from,
                     const std::string& fromKind, const Layout& to, const std::string& toKind,
                     const Topology& topology, const std::string& policy, double intraNodeBandwidth,
                     double interNodeBandwidth) {
        PlanOptions options;
        options.intraNodeBandwidth = intraNodeBandwidth;
        options.interNodeBandwidth = interNodeBandwidth;
        HS_CHECK(policy == "balanced" || policy == "greedy", "sender policy '", policy,
                 "' is not one of balanced, greedy");
        options.senderPolicy = policy == "greedy" ? SenderPolicy::kGreedy : SenderPolicy::kBalanced;
        bool hit = false;
        std::shared_ptr<const CachedPlan> plan;
        {
          py::gil_scoped_release release;
          plan = cache.get(set, from, parsePlacementKind(fromKind), to, parsePlacementKind(toKind),
                           topology, options, &hit);
        }
        return py::make_tuple(std::const_pointer_cast<CachedPlan>(plan), hit);
      }, py::arg("tensor_set"), py::arg("src"), py::arg("src_kind"), py::arg("dst"),
         py::arg("dst_kind"), py::arg("topology"), py::arg("policy") = "balanced",
         py::arg("intra_node_bandwidth") = 0.0, py::arg("inter_node_bandwidth") = 0.0)
      .def("__len__", &PlanCache::size)
      .def("clear", &PlanCache::clear);

  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("name", &Transport::name)
      .def("exchange", [](Transport& t, const std::vector<std::pair<int, at::Tensor>>& sends,
                          const std::vector<std::pair<int, at::Tensor>>& recvs, double timeoutSeconds) {
        std::vector<PeerBuffer> s, r;
        for (const auto& [peer, buf] : sends) s.push_back({peer, buf});
        for (const auto& [peer, buf] : recvs) r.push_back({peer, buf});
        auto timeout = toTimeout(timeoutSeconds);
        py::gil_scoped_release release;
        t.exchange(s, r, timeout);
      }, py::arg("sends"), py::arg("recvs"), py::arg("timeout"));

  py::class_<C10dTransport, Transport, std::shared_ptr<C10dTransport>>(m, "C10dTransport")
      .def(py::init<c10::intrusive_ptr<::c10d::ProcessGroup>>(), py::arg("group"));

  py::class_<SwitchExecutor, std::shared_ptr<SwitchExecutor>>(m, "SwitchExecutor")
      .def(py::init<std::shared_ptr<Transport>>(), py::arg("transport"))
      .def("run", [](SwitchExecutor& ex, const CachedPlan& plan, const std::vector<at::Tensor>& src,
                     int64_t maxBufferBytes, double timeoutSeconds, const std::string& device) {
        SwitchOptions options;
        if (!device.empty()) options.device = at::Device(device);
        options.maxBufferBytes = maxBufferBytes;
        options.timeout = toTimeout(timeoutSeconds);
        SwitchResult result;
        {
          py::gil_scoped_release release;
          result = ex.run(plan.plan, src, options);
        }
        py::dict info;
        info["rounds"] = result.rounds;
        info["bytes_sent"] = result.bytesSent;
        info["bytes_received"] = result.bytesReceived;
        info["peak_staging_bytes"] = result.peakStagingBytes;
        info["seconds"] = result.seconds;
        info["pack_seconds"] = result.packSeconds;
        info["exchange_seconds"] = result.exchangeSeconds;
        info["unpack_seconds"] = result.unpackSeconds;
        return py::make_tuple(result.buffers, info);
      }, py::arg("plan"), py::arg("src"), py::arg("max_buffer_bytes") = 0, py::arg("timeout") = 300.0,
         py::arg("device") = "")
      .def("release_staging", &SwitchExecutor::releaseStaging)
      .def("donate", &SwitchExecutor::donate, py::arg("tensors"))
      .def_property_readonly("donated_bytes", &SwitchExecutor::donatedBytes)
      .def_property_readonly("staging_bytes", &SwitchExecutor::stagingBytes);

  py::class_<ModelConfig>(m, "ModelConfig")
      .def(py::init([](int numLayers, int64_t hidden, int heads, int groups, int64_t ffn, int64_t vocab,
                       int64_t paramBytes, py::object recompute, const std::string& name, const std::string& family,
                       py::object tied, int64_t maxPositions) {
             ModelConfig c;
             c.name = name;
             c.family = parseModelFamily(family);
             c.numLayers = numLayers;
             c.hiddenSize = hidden;
             c.numAttentionHeads = heads;
             c.numQueryGroups = groups;
             c.ffnHiddenSize = ffn;
             c.vocabSize = vocab;
             c.paramBytes = paramBytes;
             c.recompute = recomputeArg(recompute);
             c.tiedEmbeddings = tied.is_none() ? c.family == ModelFamily::kGpt : tied.cast<bool>();
             c.maxPositions = maxPositions;
             c.validate();
             return c;
           }),
           py::arg("num_layers"), py::arg("hidden_size"), py::arg("num_attention_heads"),
           py::arg("num_query_groups"), py::arg("ffn_hidden_size"), py::arg("vocab_size"),
           py::arg("param_bytes") = 2, py::arg("recompute") = "none", py::arg("name") = "custom",
           py::arg("family") = "llama", py::arg("tied_embeddings") = py::none(), py::arg("max_positions") = 0,
           "family: 'llama' (RMSNorm, rotary, SwiGLU MLP, no biases) or 'gpt' (LayerNorm, learned positions, "
           "GeLU MLP of two matrices, biases); tied_embeddings defaults to the family's (gpt: tied); recompute: "
           "'none', 'selective' or 'full' (True: 'full', False: 'none'), what the cost model assumes when a call "
           "names none.")
      .def_static("preset", &ModelConfig::preset, py::arg("name"))
      .def_static("preset_names", &ModelConfig::presetNames)
      .def_readonly("name", &ModelConfig::name)
      .def_property_readonly("family", [](const ModelConfig& c) { return std::string(modelFamilyName(c.family)); })
      .def_readonly("num_layers", &ModelConfig::numLayers)
      .def_readonly("hidden_size", &ModelConfig::hiddenSize)
      .def_readonly("num_attention_heads", &ModelConfig::numAttentionHeads)
      .def_readonly("num_query_groups", &ModelConfig::numQueryGroups)
      .def_readonly("ffn_hidden_size", &ModelConfig::ffnHiddenSize)
      .def_readonly("vocab_size", &ModelConfig::vocabSize)
      .def_readonly("param_bytes", &ModelConfig::paramBytes)
      .def_property_readonly("recompute", [](const ModelConfig& c) { return std::string(recomputeName(c.recompute)); })
      .def_readonly("tied_embeddings", &ModelConfig::tiedEmbeddings)
      .def_readonly("max_positions", &ModelConfig::maxPositions)
      .def_property_readonly("head_dim", &ModelConfig::headDim)
      .def_property_readonly("layer_params", &ModelConfig::layerParams)
      .def_property_readonly("total_params", &ModelConfig::totalParams)
      .def("layer_matrices", &ModelConfig::layerMatrices, py::arg("tp") = 1,
           "(K, N) of each weight matrix of one layer as a rank of tp holds it.")
      .def("validate", py::overload_cast<const Layout&>(&ModelConfig::validate, py::const_), py::arg("layout"))
      .def("__repr__", [](const ModelConfig& c) {
        return str("ModelConfig(", c.name, ": ", modelFamilyName(c.family), ", ", c.numLayers, " layers, hidden ",
                   c.hiddenSize, ", heads ", c.numAttentionHeads, "/", c.numQueryGroups, ", ffn ", c.ffnHiddenSize,
                   ", vocab ", c.vocabSize, ")");
      });

  // Fields of HardwareProfile by their Python names; every setter validates before it stores.
  using HwDouble = double HardwareProfile::*;
  static const std::vector<std::pair<const char*, HwDouble>> hwDoubles = {
      {"peak_flops", &HardwareProfile::peakFlops},
      {"efficiency", &HardwareProfile::efficiency},
      {"attention_efficiency", &HardwareProfile::attentionEfficiency},
      {"attention_half_length", &HardwareProfile::attentionHalfLength},
      {"memory_bandwidth", &HardwareProfile::memoryBandwidth},
      {"memory_efficiency", &HardwareProfile::memoryEfficiency},
      {"intra_node_bandwidth", &HardwareProfile::intraNodeBandwidth},
      {"inter_node_bandwidth", &HardwareProfile::interNodeBandwidth},
      {"intra_node_latency", &HardwareProfile::intraNodeLatency},
      {"inter_node_latency", &HardwareProfile::interNodeLatency},
      {"layer_overhead_seconds", &HardwareProfile::layerOverheadSeconds},
      {"sequence_overhead_seconds", &HardwareProfile::sequenceOverheadSeconds},
      {"step_overhead_seconds", &HardwareProfile::stepOverheadSeconds},
  };
  // Fields a profile file may leave out (added after the first profiles were saved); they
  // default to the values that leave their terms out of the cost model.
  static const std::vector<std::string> hwOptional = {"attention_half_length", "memory_bandwidth",
                                                       "memory_efficiency", "step_overhead_seconds"};
  auto hw = py::class_<HardwareProfile>(m, "HardwareProfile");
  hw.def(py::init([](double peakFlops, double efficiency, int64_t memoryBytes, double intraBw, double interBw,
                     double intraLat, double interLat, const std::string& name, py::object attentionEfficiency,
                     double layerOverhead, double sequenceOverhead) {
           HardwareProfile h;
           h.name = name;
           h.peakFlops = peakFlops;
           h.efficiency = efficiency;
           h.attentionEfficiency = attentionEfficiency.is_none() ? efficiency : attentionEfficiency.cast<double>();
           h.memoryBytes = memoryBytes;
           h.intraNodeBandwidth = intraBw;
           h.interNodeBandwidth = interBw;
           h.intraNodeLatency = intraLat;
           h.interNodeLatency = interLat;
           h.layerOverheadSeconds = layerOverhead;
           h.sequenceOverheadSeconds = sequenceOverhead;
           h.validate();
           return h;
         }),
         py::arg("peak_flops"), py::arg("efficiency"), py::arg("memory_bytes"), py::arg("intra_node_bandwidth"),
         py::arg("inter_node_bandwidth"), py::arg("intra_node_latency") = 5e-6, py::arg("inter_node_latency") = 10e-6,
         py::arg("name") = "custom", py::arg("attention_efficiency") = py::none(),
         py::arg("layer_overhead_seconds") = 0.0, py::arg("sequence_overhead_seconds") = 0.0)
      .def_static("preset", &HardwareProfile::preset, py::arg("name"))
      .def_static("preset_names", &HardwareProfile::presetNames)
      .def_property("name", [](const HardwareProfile& h) { return h.name; },
                    [](HardwareProfile& h, const std::string& v) { h.name = v; })
      .def_property("memory_bytes", [](const HardwareProfile& h) { return h.memoryBytes; },
                    [](HardwareProfile& h, int64_t v) {
                      HardwareProfile c = h;
                      c.memoryBytes = v;
                      c.validate();
                      h = c;
                    }, "Per-rank memory budget in bytes (may be set below the device's memory).")
      .def("to_dict", [](const HardwareProfile& h) {
        py::dict d;
        d["name"] = h.name;
        d["memory_bytes"] = h.memoryBytes;
        for (const auto& [key, field] : hwDoubles) d[key] = h.*field;
        return d;
      }, "The profile as a dict of plain numbers (the JSON form).")
      .def_static("from_dict", [](const py::dict& d) {
        HardwareProfile h;
        std::vector<std::string> known{"name", "memory_bytes"};
        for (const auto& [key, field] : hwDoubles) known.push_back(key);
        for (const auto& item : d) {
          const std::string key = py::str(item.first);
          HS_CHECK(std::find(known.begin(), known.end(), key) != known.end(), "hardware profile field '", key,
                   "' is not one of ", known);
        }
        for (const std::string& key : known) {
          const bool optional = std::find(hwOptional.begin(), hwOptional.end(), key) != hwOptional.end();
          HS_CHECK(optional || d.contains(key), "hardware profile lacks the field '", key, "'");
        }
        try {
          h.name = d["name"].cast<std::string>();
          h.memoryBytes = d["memory_bytes"].cast<int64_t>();
          for (const auto& [key, field] : hwDoubles) {
            if (d.contains(key)) h.*field = d[key].cast<double>();
          }
        } catch (const py::cast_error&) {
          HS_CHECK(false, "hardware profile fields must be numbers (name a string), got ",
                   static_cast<std::string>(py::repr(d)));
        }
        h.validate();
        return h;
      }, py::arg("fields"), "The inverse of to_dict; ValueError naming a missing, unknown or bad field.")
      .def("__eq__", [](const HardwareProfile& a, const HardwareProfile& b) {
        bool same = a.name == b.name && a.memoryBytes == b.memoryBytes;
        for (const auto& [key, field] : hwDoubles) same = same && a.*field == b.*field;
        return same;
      })
      .def("__repr__", [](const HardwareProfile& h) {
        return str("HardwareProfile(", h.name, ": ", h.peakFlops / 1e12, " TFLOP/s x ", h.efficiency, " linear / ",
                   h.attentionEfficiency, " attention, ", h.memoryBytes / double(1 << 30), " GiB, ",
                   h.intraNodeBandwidth / 1e9, " / ", h.interNodeBandwidth / 1e9, " GB/s)");
      });
  for (const auto& [key, field] : hwDoubles) {
    const HwDouble f = field;
    const std::string name = key;
    hw.def_property(key, [f](const HardwareProfile& h) { return h.*f; },
                    [f](HardwareProfile& h, double v) {
                      HardwareProfile c = h;
                      c.*f = v;
                      c.validate();
                      h = c;
                    });
  }

  // Results of the cost model and the planner: read-only, named as their C++ fields in
  // snake_case (see planner/StepPlan.h).
  py::class_<LayoutTerms>(m, "LayoutTerms",
                          "A layout's time coefficients in seconds: a sequence of s tokens costs a stage "
                          "u(s) = alpha * s + beta * s**2 + gamma; a micro-batch adds micro_batch_seconds.")
      .def_readonly("alpha_compute", &LayoutTerms::alphaCompute)
      .def_readonly("alpha_tp", &LayoutTerms::alphaTp)
      .def_readonly("beta", &LayoutTerms::beta)
      .def_readonly("gamma", &LayoutTerms::gamma)
      .def_readonly("micro_batch_seconds", &LayoutTerms::microBatchSeconds)
      .def_readonly("micro_batch_tp_seconds", &LayoutTerms::microBatchTpSeconds)
      .def_readonly("last_stage_alpha", &LayoutTerms::lastStageAlpha,
                    "Of the alphas, the seconds per token the last stage's head and loss add.")
      .def_readonly("last_stage_micro_batch_seconds", &LayoutTerms::lastStageMicroBatchSeconds,
                    "Of micro_batch_seconds, what the last stage's head and loss add.")
      .def_readonly("p2p_per_token", &LayoutTerms::p2pPerToken)
      .def_readonly("p2p_latency", &LayoutTerms::p2pLatency)
      .def_readonly("dp_seconds", &LayoutTerms::dpSeconds)
      .def_readonly("alpha_cp", &LayoutTerms::alphaCp,
                    "Seconds per token of a micro-batch of the cp K/V exchange (its exposed part).")
      .def_readonly("micro_batch_cp_seconds", &LayoutTerms::microBatchCpSeconds,
                    "Of micro_batch_seconds, the cp collectives' latencies.")
      .def_readonly("cp", &LayoutTerms::cp)
      .def_readonly("graphs", &LayoutTerms::graphs,
                    "Whether micro-batches may run from CUDA graphs (graph buckets given, each a multiple of tp; "
                    "pp and cp 1; no full recomputation).")
      .def_readonly("graph_saved_seconds", &LayoutTerms::graphSavedSeconds,
                    "Per micro-batch run from CUDA graphs, the fixed cost it does not pay.")
      .def_readonly("graph_tp_alpha", &LayoutTerms::graphTpAlpha,
                    "Per token of a micro-batch run from CUDA graphs at tp > 1: the tp traffic the eager layers "
                    "hide (tp_overlap) and the compiled, graphed ones wait for.")
      .def_readonly("graph_tp_micro_batch_seconds", &LayoutTerms::graphTpMicroBatchSeconds,
                    "Per micro-batch run from CUDA graphs at tp > 1: those collectives' latencies.")
      .def_readonly("graph_max_tokens", &LayoutTerms::graphMaxTokens,
                    "The largest graph bucket whose attention is static under the layout (graph_max_scores), 0 "
                    "when none is: larger micro-batches run as they are.")
      .def_property_readonly("recompute", [](const LayoutTerms& t) { return std::string(recomputeName(t.recompute)); })
      .def_property_readonly("alpha", &LayoutTerms::alpha)
      .def("u", &LayoutTerms::u, py::arg("tokens"), "Critical-path seconds of one sequence on a stage.")
      .def("v", &LayoutTerms::v, py::arg("tokens"), "u plus its two stage-boundary transfers.")
      .def("__repr__", [](const LayoutTerms& t) {
        return str("LayoutTerms(alpha ", t.alpha(), " s/token, beta ", t.beta, " s/token^2, gamma ", t.gamma,
                   " s, micro-batch ", t.microBatchSeconds, " s, dp ", t.dpSeconds, " s)");
      });

  py::class_<PhaseCost>(m, "PhaseCost", "Predicted seconds and peak bytes per rank of one phase.")
      .def_readonly("compute_seconds", &PhaseCost::computeSeconds)
      .def_readonly("tp_seconds", &PhaseCost::tpSeconds)
      .def_readonly("cp_seconds", &PhaseCost::cpSeconds)
      .def_readonly("pp_seconds", &PhaseCost::ppSeconds)
      .def_readonly("dp_seconds", &PhaseCost::dpSeconds)
      .def_readonly("total_seconds", &PhaseCost::totalSeconds)
      .def_readonly("static_bytes", &PhaseCost::staticBytes)
      .def_readonly("activation_bytes", &PhaseCost::activationBytes)
      .def_readonly("peak_bytes", &PhaseCost::peakBytes)
      .def_readonly("graphed_micro_batches", &PhaseCost::graphedMicroBatches,
                    "Over all replicas, the micro-batches run padded to a graph bucket, from CUDA graphs.")
      .def_readonly("fits", &PhaseCost::fits)
      .def_property_readonly("run_seconds", &PhaseCost::runSeconds,
                             "Seconds before the gradient reduction: what the micro-batches take.")
      .def("__repr__", [](const PhaseCost& c) {
        return str("PhaseCost(total ", c.totalSeconds, " s = compute ", c.computeSeconds, " + tp ", c.tpSeconds,
                   " + cp ", c.cpSeconds, " + pp ", c.ppSeconds, " + dp ", c.dpSeconds, ", peak ", c.peakBytes / double(1 << 30), " GiB",
                   c.fits ? "" : ", does not fit", ")");
      });

  m.def("context_split_owners", &contextSplitOwners, py::arg("lengths"), py::arg("cp"), py::arg("min_chunk") = 4,
        "Per sequence, the cp rank that holds it whole, or -1 when it is cut into 2 * cp chunks (rank i "
        "holding chunks i and 2 * cp - 1 - i): how hotswitch.model.context splits a pack.");

  m.def("context_split_loads", [](const std::vector<int64_t>& lengths, int cp, int64_t minChunk) {
    py::list out;
    for (const ContextLoad& l : contextSplitLoads(lengths, cp, minChunk)) {
      out.append(py::make_tuple(l.tokens, l.pairs, l.sequences));
    }
    return out;
  }, py::arg("lengths"), py::arg("cp"), py::arg("min_chunk") = 4,
        "Per cp rank, (tokens, causal pairs, sequences) of its part of a micro-batch of these sequence lengths, "
        "dealt as context_split_owners deals them.");

  py::class_<CostModel>(m, "CostModel")
      .def(py::init([](const ModelConfig& model, const HardwareProfile& hw, const Topology& topo, bool zero,
                       bool sequenceParallel, bool flashAttention, double cpOverlap, int64_t cpMinChunk,
                       std::map<std::string, double> layoutScale, std::vector<int64_t> graphBuckets,
                       double graphLayerOverheadSeconds, double tpOverlap, int64_t graphCopyParamBytes,
                       std::optional<int64_t> graphMaxScores, std::optional<std::vector<std::string>> graphLayouts,
                       int64_t recomputeChunkLayers) {
             CostOptions o;
             o.recomputeChunkLayers = recomputeChunkLayers;
             o.graphMaxScores = graphMaxScores;
             o.graphLayouts = std::move(graphLayouts);
             o.graphBuckets = std::move(graphBuckets);
             o.graphLayerOverheadSeconds = graphLayerOverheadSeconds;
             o.zero = zero;
             o.sequenceParallel = sequenceParallel;
             o.flashAttention = flashAttention;
             o.cpOverlap = cpOverlap;
             o.tpOverlap = tpOverlap;
             o.graphCopyParamBytes = graphCopyParamBytes;
             o.cpMinChunk = cpMinChunk;
             o.layoutScale = std::move(layoutScale);
             return CostModel(model, hw, topo, o);
           }),
           py::arg("model"), py::arg("hardware"), py::arg("topology"), py::arg("zero") = false,
           py::arg("sequence_parallel") = true, py::arg("flash_attention") = true, py::arg("cp_overlap") = 0.0,
           py::arg("cp_min_chunk") = 4, py::arg("layout_scale") = std::map<std::string, double>{},
           py::arg("graph_buckets") = std::vector<int64_t>{}, py::arg("graph_layer_overhead_seconds") = 0.0,
           py::arg("tp_overlap") = 1.0, py::arg("graph_copy_param_bytes") = 0,
           py::arg("graph_max_scores") = py::none(), py::arg("graph_layouts") = py::none(),
           py::arg("recompute_chunk_layers") = 0,
           "flash_attention: the attention core keeps no per-token^2 activations (False: its scores, softmax "
           "and dropout mask stay for the backward pass unless recomputed). cp_overlap: the share of the cp "
           "K/V exchange hidden behind compute, in [0, 1] (0: this runtime's all-gather before attention); "
           "cp_min_chunk: tokens of the smallest cp chunk (shorter sequences stay whole on one cp rank). "
           "layout_scale: {layout name: factor > 0} on every time term of that layout (the others keep 1). "
           "graph_buckets: ascending token counts at which the layers of layouts with pp and cp 1 (and every bucket "
           "a multiple of tp) run from CUDA graphs, "
           "a micro-batch padded to the smallest that holds it when that costs less than its launches; "
           "graph_layer_overhead_seconds: the fixed seconds per layer of such a micro-batch (in place of the "
           "profile's layer_overhead_seconds). tp_overlap: the share of the backward's column-parallel "
           "collectives (the input gathered again, the input gradient reduce-scattered) hidden behind their "
           "products, in [0, 1] (1: this runtime's eager layers and Megatron-LM's; 0: its compiled layers; "
           "graphed micro-batches always pay them). graph_copy_param_bytes: bytes per element of the matrix "
           "weights' copies that CUDA graphs read (the compute dtype's; 0: the model's param_bytes). "
           "graph_max_scores: the attention's bound on a static pack: a bucket runs from the graphs only where the "
           "heads per rank * bucket^2 <= it (the mask kernels'; None: no bound, the flash and flex kernels). "
           "graph_layouts: the names of the layouts whose models capture graphs and keep their weight copies "
           "(None: every layout that can). recompute_chunk_layers: full recomputation reruns chunks of this many "
           "layers up to the last tensor their backward saved, skipping each chunk's last row-parallel "
           "collective (PyTorch's non-reentrant checkpoint: this runtime's recompute_num_layers); 0: the whole "
           "forward again (Megatron-LM's).")
      .def_property_readonly("graph_buckets", [](const CostModel& c) { return c.options().graphBuckets; })
      .def_property_readonly("graph_layouts", [](const CostModel& c) { return c.options().graphLayouts; })
      .def_property_readonly("graph_max_scores", [](const CostModel& c) { return c.options().graphMaxScores; })
      .def_property_readonly("graph_layer_overhead_seconds",
                             [](const CostModel& c) { return c.options().graphLayerOverheadSeconds; })
      .def("graph_tokens", [](const CostModel& c, const Layout& layout, const std::vector<int64_t>& lengths,
                              std::optional<std::string> recompute) {
        return c.graphTokens(recompute ? c.terms(layout, parseRecompute(*recompute)) : c.terms(layout), lengths);
      }, py::arg("layout"), py::arg("lengths"), py::arg("recompute") = py::none(),
           "The graph bucket a micro-batch of these sequence lengths runs padded to under the layout, or 0 when it "
           "runs as it is.")
      .def_property_readonly("layout_scale", [](const CostModel& c) { return c.options().layoutScale; })
      .def_property_readonly("model", &CostModel::model)
      .def_property_readonly("hardware", &CostModel::hardware)
      .def_property_readonly("topology", &CostModel::topology)
      .def_property_readonly("zero", [](const CostModel& c) { return c.options().zero; })
      .def_property_readonly("sequence_parallel", [](const CostModel& c) { return c.options().sequenceParallel; })
      .def_property_readonly("flash_attention", [](const CostModel& c) { return c.options().flashAttention; })
      .def_property_readonly("cp_overlap", [](const CostModel& c) { return c.options().cpOverlap; })
      .def_property_readonly("tp_overlap", [](const CostModel& c) { return c.options().tpOverlap; })
      .def_property_readonly("recompute_chunk_layers",
                             [](const CostModel& c) { return c.options().recomputeChunkLayers; })
      .def_property_readonly("graph_copies_held_bytes",
                             [](const CostModel& c) { return c.options().graphCopiesHeldBytes; },
                             "Bytes every rank holds for the weight copies of the layouts that run CUDA graphs, in "
                             "every layout's static memory (a Planner's cost model: summed over its candidates).")
      .def("graph_copy_bytes", &CostModel::graphCopyBytes, py::arg("layout"),
           "Bytes of the weight copies a rank of the layout keeps for its CUDA graphs (every layer weight of its "
           "shard at param bytes); 0 for a layout that runs none.")
      .def_property_readonly("cp_min_chunk", [](const CostModel& c) { return c.options().cpMinChunk; })
      .def("data_collective_seconds", &CostModel::dataCollectiveSeconds, py::arg("layout"), py::arg("bytes"),
           py::arg("all_reduce") = false,
           "Seconds of one ring collective of `bytes` over the layout's data groups (dp * cp ranks).")
      .def("forward_flops", &CostModel::forwardFlops, py::arg("seq_len"))
      .def("training_flops", [](const CostModel& c, int64_t seqLen, std::optional<std::string> recompute) {
        return recompute ? c.trainingFlops(seqLen, parseRecompute(*recompute)) : c.trainingFlops(seqLen);
      }, py::arg("seq_len"), py::arg("recompute") = py::none())
      .def("static_bytes", &CostModel::staticBytes, py::arg("layout"))
      .def("gradient_bytes", &CostModel::gradientBytes, py::arg("layout"))
      .def("collective_seconds", [](const CostModel& c, const Layout& layout, const std::string& axis, double bytes,
                                    bool allReduce) {
        return c.collectiveSeconds(layout, parseAxis(axis), bytes, allReduce);
      }, py::arg("layout"), py::arg("axis"), py::arg("bytes"), py::arg("all_reduce") = false)
      .def("terms", [](const CostModel& c, const Layout& layout, std::optional<std::string> recompute) {
        return recompute ? c.terms(layout, parseRecompute(*recompute)) : c.terms(layout);
      }, py::arg("layout"), py::arg("recompute") = py::none(),
           "The layout's time coefficients (LayoutTerms, seconds), with recompute 'none', 'selective' or 'full' "
           "(default: the model's).")
      .def("step_seconds", &CostModel::stepSeconds, py::arg("layout"),
           "Seconds a step spends after its last phase with this home layout: the parameters' all-gather under "
           "ZeRO, the optimizer's update and the fixed step overhead.")
      .def("phase", [](const CostModel& c, const Layout& layout, const PhaseBatches& batches,
                       std::optional<std::string> recompute,
                       std::optional<std::vector<std::vector<int64_t>>> graphTokens) {
        const LayoutTerms t = recompute ? c.terms(layout, parseRecompute(*recompute)) : c.terms(layout);
        return c.phase(layout, t, batches, graphTokens ? &*graphTokens : nullptr);
      }, py::arg("layout"), py::arg("batches"), py::arg("recompute") = py::none(),
           py::arg("graph_tokens") = py::none(),
           "Predicted time (seconds) and peak memory (bytes) per rank of one phase (PhaseCost); batches[replica]"
           "[k] lists the sequence lengths of micro-batch k of that data-parallel replica; recompute 'none', "
           "'selective' or 'full' (default: the model's); graph_tokens[replica][k], when given, the graph bucket "
           "each micro-batch ran padded to (0: as it is), as a plan's graph_tokens, instead of the model's choice.");

  py::class_<SwitchEstimate>(m, "SwitchEstimate")
      .def_static("of", [](const TensorSet& set, const Placement& from, const Placement& to, const Topology& topology) {
        py::gil_scoped_release release;
        return SwitchEstimate::of(set, from, to, topology);
      }, py::arg("tensor_set"), py::arg("src"), py::arg("dst"), py::arg("topology"),
         "Receive bytes per rank of a switch between two placements (hotswitch.Placement), without a plan.")
      .def_readonly("recv_intra_node_bytes", &SwitchEstimate::recvIntraNodeBytes)
      .def_readonly("recv_inter_node_bytes", &SwitchEstimate::recvInterNodeBytes)
      .def_readonly("total_bytes", &SwitchEstimate::totalBytes)
      .def("seconds", &SwitchEstimate::seconds, py::arg("intra_node_bandwidth"), py::arg("inter_node_bandwidth"));

  py::class_<SequencePiece>(m, "SequencePiece", "Tokens [offset, offset + length) of sequence `sequence`.")
      .def_readonly("sequence", &SequencePiece::sequence)
      .def_readonly("offset", &SequencePiece::offset)
      .def_readonly("length", &SequencePiece::length)
      .def("__eq__", &SequencePiece::operator==, py::is_operator())
      .def("__repr__", [](const SequencePiece& q) {
        return str("SequencePiece(sequence=", q.sequence, ", offset=", q.offset, ", length=", q.length, ")");
      });

  py::class_<Packing>(m, "Packing")
      .def_readonly("micro_batches", &Packing::microBatches,
                    "micro_batches[replica][k]: indices into the plan's pieces, in packing order.")
      .def_readonly("replica_cost", &Packing::replicaCost,
                    "Per data-parallel replica, the predicted seconds of its pieces (sum of u(s)).");

  py::class_<PlannedPhase>(m, "PlannedPhase", "One bucket's pieces under one layout, packed into micro-batches.")
      .def_readonly("candidate", &PlannedPhase::candidate)
      .def_readonly("layout", &PlannedPhase::layout)
      .def_readonly("sequences", &PlannedPhase::sequences, "Indices into the plan's pieces.")
      .def_readonly("packing", &PlannedPhase::packing)
      .def_readonly("cu_seqlens", &PlannedPhase::cuSeqlens,
                    "cu_seqlens[replica][k]: [0, l0, l0 + l1, ...] over micro-batch k's pieces.")
      .def_readonly("cost", &PlannedPhase::cost, "The exact packing's cost; cost.run_seconds is the phase's run.")
      .def_readonly("graph_tokens", &PlannedPhase::graphTokens,
                    "graph_tokens[replica][k]: the CUDA graph bucket micro-batch k runs padded to, 0 where it runs "
                    "as it is.")
      .def_readonly("estimate_seconds", &PlannedPhase::estimateSeconds)
      .def_readonly("switch_in_seconds", &PlannedPhase::switchInSeconds)
      .def_readonly("switch_out_seconds", &PlannedPhase::switchOutSeconds)
      .def_readonly("grad_seconds", &PlannedPhase::gradSeconds)
      .def_property_readonly("grad_method", [](const PlannedPhase& ph) { return gradMethodName(ph.gradMethod); },
                             "\"local\", \"reduce\" or \"partial\"")
      .def_property_readonly("recompute", [](const PlannedPhase& ph) { return std::string(recomputeName(ph.recompute)); },
                             "\"none\", \"selective\" or \"full\": the activation recomputation the phase runs with")
      .def("__repr__", [](const PlannedPhase& ph) {
        size_t microBatches = 0;
        for (const auto& replica : ph.packing.microBatches) microBatches += replica.size();
        return str("PlannedPhase(", ph.layout.name(), ", candidate ", ph.candidate, ": ", ph.sequences.size(),
                   " pieces in ", microBatches, " micro-batches, run ", ph.cost.runSeconds(), " s, switch in ",
                   ph.switchInSeconds, " s, grads ", ph.gradSeconds, " s ", gradMethodName(ph.gradMethod),
                   ", recompute ", recomputeName(ph.recompute), ")");
      });

  py::class_<StepPlan>(m, "StepPlan", "The ordered phases of one step, with predicted seconds.")
      .def_readonly("pieces", &StepPlan::pieces)
      .def_readonly("phases", &StepPlan::phases, "In run order.")
      .def_readonly("switch_back_seconds", &StepPlan::switchBackSeconds)
      .def_readonly("total_seconds", &StepPlan::totalSeconds)
      .def_readonly("objective_seconds", &StepPlan::objectiveSeconds)
      .def_readonly("program_seconds", &StepPlan::programSeconds)
      .def_readonly("candidates_used", &StepPlan::candidatesUsed)
      .def_readonly("single_phase_fallback", &StepPlan::singlePhaseFallback)
      .def_readonly("program_plan_seconds", &StepPlan::programPlanSeconds)
      .def_readonly("one_phase_seconds", &StepPlan::onePhaseSeconds)
      .def_readonly("best_static_candidate", &StepPlan::bestStaticCandidate)
      .def_property_readonly("best_static_recompute", [](const StepPlan& p) {
        return std::string(recomputeName(p.bestStaticRecompute));
      })
      .def_readonly("best_static_seconds", &StepPlan::bestStaticSeconds)
      .def_readonly("best_static_objective_seconds", &StepPlan::bestStaticObjectiveSeconds)
      .def("__repr__", [](const StepPlan& plan) {
        std::string order;
        for (const PlannedPhase& ph : plan.phases) order += (order.empty() ? "" : " -> ") + ph.layout.name();
        return str("StepPlan(", plan.pieces.size(), " pieces in ", plan.phases.size(), " phases ", order,
                   ", total ", plan.totalSeconds, " s; best static candidate ", plan.bestStaticCandidate, ", ",
                   plan.bestStaticSeconds, " s)");
      });

  py::class_<CandidateModel>(m, "CandidateModel",
                             "The objective's view of one candidate: dp, pp, budget (tokens), its terms (u(s) "
                             "seconds, micro-batch and p2p terms), tau (target, seconds) and g (grad_seconds).")
      .def_readonly("layout", &CandidateModel::layout)
      .def_readonly("terms", &CandidateModel::terms)
      .def_readonly("dp", &CandidateModel::dp)
      .def_readonly("pp", &CandidateModel::pp)
      .def_readonly("budget", &CandidateModel::budget)
      .def_readonly("target", &CandidateModel::target)
      .def_readonly("graph_buckets", &CandidateModel::graphBuckets)
      .def_readonly("grad_seconds", &CandidateModel::gradSeconds)
      .def_property_readonly("grad_method", [](const CandidateModel& c) { return gradMethodName(c.gradMethod); },
                             "\"local\", \"reduce\" or \"partial\"")
      .def_readonly("reduce_seconds", &CandidateModel::reduceSeconds)
      .def_property_readonly("recompute", [](const CandidateModel& c) { return std::string(recomputeName(c.recompute)); })
      .def("__repr__", [](const CandidateModel& c) {
        return str("CandidateModel(", c.layout.name(), ": budget ", c.budget, " tokens, target ", c.target,
                   " s, grads ", c.gradSeconds, " s ", gradMethodName(c.gradMethod), ")");
      });

  py::class_<ObjectiveValue>(m, "ObjectiveValue", "The planner's objective J of one assignment, with its parts.")
      .def_readonly("total_seconds", &ObjectiveValue::totalSeconds)
      .def_readonly("switch_seconds", &ObjectiveValue::switchSeconds)
      .def_readonly("phase_seconds", &ObjectiveValue::phaseSeconds,
                    "Per variant (candidate * len(planner.recompute) + the mode's position): E + g, 0 when unused.")
      .def_readonly("order", &ObjectiveValue::order, "Used variants in run order.")
      .def("__repr__", [](const ObjectiveValue& v) {
        return str("ObjectiveValue(total ", v.totalSeconds, " s, switches ", v.switchSeconds, " s)");
      });

  py::class_<Planner>(m, "Planner")
      .def(py::init([](const CostModel& cost, std::vector<Layout> candidates, int home,
                       std::vector<std::vector<double>> switchSeconds, std::vector<double> gradSeconds,
                       std::optional<std::vector<double>> gradPartialSeconds, int boundaryCandidates,
                       int64_t maxContext, const std::string& longSequences, bool pruneDominated,
                       double microBatchOverheadShare, bool exactFallback, int64_t maxTokensPerMicroBatch,
                       double minGain, const std::vector<std::string>& recompute, bool graphEstimate) {
             PlannerOptions o;
             o.graphEstimate = graphEstimate;
             o.recompute.clear();
             for (const std::string& mode : recompute) o.recompute.push_back(parseRecompute(mode));
             o.maxTokensPerMicroBatch = maxTokensPerMicroBatch;
             o.boundaryCandidates = boundaryCandidates;
             o.maxContext = maxContext;
             o.longSequences = parseLongSequences(longSequences);
             o.pruneDominated = pruneDominated;
             o.microBatchOverheadShare = microBatchOverheadShare;
             o.exactFallback = exactFallback;
             o.minGain = minGain;
             SwitchCosts sw{std::move(switchSeconds), std::move(gradSeconds),
                            gradPartialSeconds.value_or(std::vector<double>{})};
             py::gil_scoped_release release;
             return Planner(cost, std::move(candidates), home, std::move(sw), o);
           }),
           py::arg("cost"), py::arg("candidates"), py::arg("home"), py::arg("switch_seconds"),
           py::arg("grad_seconds"), py::arg("grad_partial_seconds") = py::none(),
           py::arg("boundary_candidates") = 128, py::arg("max_context") = 0, py::arg("long_sequences") = "reject",
           py::arg("prune_dominated") = true, py::arg("micro_batch_overhead_share") = 0.1,
           py::arg("exact_fallback") = true, py::arg("max_tokens_per_micro_batch") = 0, py::arg("min_gain") = 0.01,
           py::arg("recompute") = std::vector<std::string>{"none"}, py::arg("graph_estimate") = true,
           "recompute: the modes ('none', 'selective', 'full') the planner may give each phase, every candidate "
           "weighed with each; the first is what candidate_model and objective assume by default. min_gain: the "
           "fraction by which the program's plan must be predicted faster than one phase under home or the best "
           "static layout to be kept (0.01: 1%). graph_estimate: the program's estimate weighs the micro-batches of a "
           "layout that runs CUDA graph buckets packed to them (False: as without graphs until the exact packing).")
      .def_property_readonly("candidates", &Planner::candidates)
      .def_property_readonly("home", &Planner::home)
      .def_property_readonly("cost", &Planner::costModel)
      .def_property_readonly("switch_seconds", [](const Planner& p) { return p.switchCosts().params; })
      .def_property_readonly("max_context", [](const Planner& p) { return p.options().maxContext; })
      .def_property_readonly("recompute", [](const Planner& p) {
        std::vector<std::string> out;
        for (Recompute r : p.options().recompute) out.push_back(recomputeName(r));
        return out;
      })
      .def_property_readonly("long_sequences", [](const Planner& p) {
        return std::string(longSequencesName(p.options().longSequences));
      })
      .def("micro_batch_budget", &Planner::microBatchBudget, py::arg("candidate"))
      .def("candidate_model", [](const Planner& p, int i, std::optional<std::string> recompute) {
        HS_CHECK(i >= 0 && i < static_cast<int>(p.candidates().size()), "candidate ", i, " outside [0, ",
                 p.candidates().size(), ")");
        return recompute ? p.candidateModel(i, parseRecompute(*recompute)) : p.candidateModel(i);
      }, py::arg("candidate"), py::arg("recompute") = py::none(),
           "The objective's view of one candidate (a CandidateModel), under the planner's first recompute mode "
           "or the one named.")
      .def("pieces", &Planner::pieces, py::arg("lengths"),
           "The pieces (SequencePiece) the plan cuts the lengths into.")
      .def("objective", [](const Planner& p, const std::vector<int64_t>& lengths, const std::vector<int>& assignment,
                           const std::vector<std::string>& recompute) {
        std::vector<Recompute> modes;
        for (const std::string& mode : recompute) modes.push_back(parseRecompute(mode));
        return p.objective(lengths, assignment, modes);
      }, py::arg("piece_lengths"), py::arg("assignment"), py::arg("recompute") = std::vector<std::string>{},
           "The planner's objective J (an ObjectiveValue, seconds) of an arbitrary assignment of pieces to "
           "candidates, each piece under the recompute mode listed for it (empty: the planner's first).")
      .def("plan", &Planner::plan, py::arg("lengths"), py::call_guard<py::gil_scoped_release>(),
           "Plans one step: a StepPlan. Indices refer to the plan's pieces.")
      .def("plan_fixed", [](const Planner& p, const std::vector<int64_t>& lengths,
                            const std::vector<std::tuple<int64_t, int, std::string>>& entries) {
        std::vector<FixedPlanEntry> fixed;
        for (const auto& [bound, candidate, recompute] : entries) {
          fixed.push_back({bound, candidate, parseRecompute(recompute)});
        }
        py::gil_scoped_release release;
        return p.planFixed(lengths, fixed);
      }, py::arg("lengths"), py::arg("entries"),
           "The StepPlan of a fixed bucketing: entries (upper length bound, candidate index, recompute), bounds "
           "increasing; each piece runs under the first entry whose bound holds it, with the plan()'s packing and "
           "switches and never a one-phase fallback.")
      .def("check_fixed_plan", [](const Planner& p, const std::vector<std::tuple<int64_t, int, std::string>>& entries) {
        std::vector<FixedPlanEntry> fixed;
        for (const auto& [bound, candidate, recompute] : entries) {
          fixed.push_back({bound, candidate, parseRecompute(recompute)});
        }
        p.checkFixedPlan(fixed);
      }, py::arg("entries"),
           "ValueError naming the entry when plan_fixed would refuse these entries whatever the lengths.");
}
