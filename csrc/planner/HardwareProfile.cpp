#include "planner/HardwareProfile.h"

#include <cmath>
#include <utility>

#include "common/Check.h"

namespace hotswitch {

namespace {
struct Preset {
  const char* name;
  double peakFlops;
  int64_t memoryGiB;
  double nvlinkTotal;  // bytes/s, both directions together, as data sheets quote it
  double nicBits;      // bits/s of the device's InfiniBand NIC
};
constexpr Preset kPresets[] = {
    {"a100", 312e12, 80, 600e9, 200e9},   // A100 SXM 80GB, HDR 200 Gb/s
    {"a800", 312e12, 80, 400e9, 200e9},   // A800 SXM 80GB: NVLink limited to 400 GB/s
    {"h100", 989e12, 80, 900e9, 400e9},   // H100 SXM, NDR 400 Gb/s
    {"h200", 989e12, 141, 900e9, 400e9},  // H200 SXM, NDR 400 Gb/s
};
}  // namespace

HardwareProfile HardwareProfile::preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      HardwareProfile h;
      h.name = p.name;
      h.peakFlops = p.peakFlops;
      h.memoryBytes = p.memoryGiB << 30;
      h.intraNodeBandwidth = p.nvlinkTotal / 2;
      h.interNodeBandwidth = p.nicBits / 8;
      h.layerOverheadSeconds = 100e-6;
      return h;
    }
  }
  std::string names;
  for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  HS_CHECK(false, "hardware preset '", name, "' is not one of ", names);
  return {};
}

std::vector<std::string> HardwareProfile::presetNames() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

void HardwareProfile::validate() const {
  // An infinite rate or latency would turn the cost model's sums into inf - inf = NaN.
  const std::pair<const char*, double> fields[] = {
      {"peak_flops", peakFlops}, {"efficiency", efficiency}, {"attention_efficiency", attentionEfficiency},
      {"intra_node_bandwidth", intraNodeBandwidth}, {"inter_node_bandwidth", interNodeBandwidth},
      {"intra_node_latency", intraNodeLatency}, {"inter_node_latency", interNodeLatency},
      {"layer_overhead_seconds", layerOverheadSeconds}, {"sequence_overhead_seconds", sequenceOverheadSeconds}};
  for (const auto& [field, value] : fields) HS_CHECK(std::isfinite(value), field, " must be finite, got ", value);
  HS_CHECK(peakFlops > 0, "peak_flops must be > 0, got ", peakFlops);
  HS_CHECK(efficiency > 0 && efficiency <= 1, "efficiency must be in (0, 1], got ", efficiency);
  HS_CHECK(attentionEfficiency > 0 && attentionEfficiency <= 1, "attention_efficiency must be in (0, 1], got ",
           attentionEfficiency);
  HS_CHECK(memoryBytes > 0, "memory_bytes must be > 0, got ", memoryBytes);
  HS_CHECK(intraNodeBandwidth > 0, "intra_node_bandwidth must be > 0, got ", intraNodeBandwidth);
  HS_CHECK(interNodeBandwidth > 0, "inter_node_bandwidth must be > 0, got ", interNodeBandwidth);
  HS_CHECK(intraNodeLatency >= 0, "intra_node_latency must be >= 0, got ", intraNodeLatency);
  HS_CHECK(interNodeLatency >= 0, "inter_node_latency must be >= 0, got ", interNodeLatency);
  HS_CHECK(layerOverheadSeconds >= 0, "layer_overhead_seconds must be >= 0, got ", layerOverheadSeconds);
  HS_CHECK(sequenceOverheadSeconds >= 0, "sequence_overhead_seconds must be >= 0, got ", sequenceOverheadSeconds);
}

}  // namespace hotswitch
