#include "planner/HardwareProfile.h"

#include <cmath>
#include <utility>

#include "common/Check.h"

namespace hotswitch {

namespace {

// Data-sheet figures of one device and its links.
struct DataSheet {
  const char* name;
  double peakFlops;        // dense bf16 tensor FLOP/s
  int64_t memoryGiB;
  double memoryBandwidth;  // bytes/s
  double nvlinkTotal;      // bytes/s, both directions together, as data sheets quote it
  double nicBits;          // bits/s of the device's InfiniBand NIC
};
constexpr DataSheet kDataSheets[] = {
    {"a100", 312e12, 80, 2.039e12, 600e9, 200e9},   // A100 SXM 80GB, HDR 200 Gb/s
    {"a800", 312e12, 80, 2.039e12, 400e9, 200e9},   // A800 SXM 80GB: NVLink limited to 400 GB/s
    {"h100", 989e12, 80, 3.35e12, 900e9, 400e9},    // H100 SXM, NDR 400 Gb/s
    {"h200", 989e12, 141, 4.8e12, 900e9, 400e9},    // H200 SXM, NDR 400 Gb/s
};

// The fit of the cost model's free terms to the 106 rebuildable runs of measured Megatron-LM
// training on 8-32 H100 SXM (data/megatron_runs/runs.csv), made by
//   python -m hotswitch.costmodel fit --runs data/megatron_runs/runs.csv --name h100
// (base h100-datasheet, 8 drawn steps a packed run, seed 0; bounded least squares on log time,
// python/hotswitch/calibration/runs.py; the tp backward's column-parallel collectives hidden,
// CostOptions::tpOverlap 1, as Megatron-LM runs them), rounded to 4 digits. Peak FLOP/s,
// memory and memory bandwidth stay the data sheet's. Product efficiency, memory efficiency and
// both link bandwidths end at their upper bounds (0.9 and the data sheet's figures) and the
// intra-node latency at 0: the runs spend less time on products, memory traffic and
// communication than the model's FLOPs and bytes take at those rates, since Megatron-LM
// overlaps more of them with computation than the model represents.
struct Fit {
  double efficiency;
  double attentionEfficiency;
  double attentionHalfLength;
  double memoryEfficiency;
  double intraNodeBandwidth;
  double intraNodeLatency;
  double interNodeBandwidth;
  double interNodeLatency;
  double layerOverheadSeconds;
  double stepOverheadSeconds;
};
constexpr Fit kH100Fit = {0.9, 0.2251, 2636.0, 1.0, 450e9, 0.0, 50e9, 378.0e-6, 2.717e-3, 1.327};

const DataSheet& sheet(const char* name) {
  for (const DataSheet& d : kDataSheets) {
    if (std::string(name) == d.name) return d;
  }
  HS_INTERNAL_CHECK(false, "no data sheet named ", name);
  return kDataSheets[0];
}

// The data sheet with the efficiencies and overheads assumed before any fit: half of peak
// FLOP/s, the full memory bandwidth, 100 us per layer and micro-batch.
HardwareProfile fromDataSheet(const DataSheet& d) {
  HardwareProfile h;
  h.name = std::string(d.name) + "-datasheet";
  h.peakFlops = d.peakFlops;
  h.memoryBytes = d.memoryGiB << 30;
  h.memoryBandwidth = d.memoryBandwidth;
  h.intraNodeBandwidth = d.nvlinkTotal / 2;
  h.interNodeBandwidth = d.nicBits / 8;
  h.layerOverheadSeconds = 100e-6;
  return h;
}

// The h100 fit moved to device `d`: its own peak FLOP/s, memory and memory bandwidth; the
// fitted fractions of peak (efficiencies) and overheads kept; the fitted link bandwidths
// scaled by the data sheets' ratio of link bandwidths (NVLink, NIC) to the H100's.
HardwareProfile fitted(const DataSheet& d) {
  const DataSheet& h100 = sheet("h100");
  HardwareProfile h;
  h.name = d.name;
  h.peakFlops = d.peakFlops;
  h.memoryBytes = d.memoryGiB << 30;
  h.memoryBandwidth = d.memoryBandwidth;
  h.efficiency = kH100Fit.efficiency;
  h.attentionEfficiency = kH100Fit.attentionEfficiency;
  h.attentionHalfLength = kH100Fit.attentionHalfLength;
  h.memoryEfficiency = kH100Fit.memoryEfficiency;
  h.intraNodeBandwidth = kH100Fit.intraNodeBandwidth * d.nvlinkTotal / h100.nvlinkTotal;
  h.interNodeBandwidth = kH100Fit.interNodeBandwidth * d.nicBits / h100.nicBits;
  h.intraNodeLatency = kH100Fit.intraNodeLatency;
  h.interNodeLatency = kH100Fit.interNodeLatency;
  h.layerOverheadSeconds = kH100Fit.layerOverheadSeconds;
  h.stepOverheadSeconds = kH100Fit.stepOverheadSeconds;
  return h;
}

}  // namespace

HardwareProfile HardwareProfile::preset(const std::string& name) {
  if (name == "h100-datasheet") return fromDataSheet(sheet("h100"));
  for (const DataSheet& d : kDataSheets) {
    if (name == d.name) return fitted(d);
  }
  std::string names;
  for (const std::string& n : presetNames()) names += (names.empty() ? "" : ", ") + n;
  HS_CHECK(false, "hardware preset '", name, "' is not one of ", names);
  return {};
}

std::vector<std::string> HardwareProfile::presetNames() {
  std::vector<std::string> out;
  for (const DataSheet& d : kDataSheets) out.push_back(d.name);
  out.push_back("h100-datasheet");
  return out;
}

void HardwareProfile::validate() const {
  // An infinite rate or latency would turn the cost model's sums into inf - inf = NaN.
  const std::pair<const char*, double> fields[] = {
      {"peak_flops", peakFlops}, {"efficiency", efficiency}, {"attention_efficiency", attentionEfficiency},
      {"attention_half_length", attentionHalfLength}, {"memory_bandwidth", memoryBandwidth},
      {"memory_efficiency", memoryEfficiency},
      {"intra_node_bandwidth", intraNodeBandwidth}, {"inter_node_bandwidth", interNodeBandwidth},
      {"intra_node_latency", intraNodeLatency}, {"inter_node_latency", interNodeLatency},
      {"layer_overhead_seconds", layerOverheadSeconds}, {"sequence_overhead_seconds", sequenceOverheadSeconds},
      {"step_overhead_seconds", stepOverheadSeconds}};
  for (const auto& [field, value] : fields) HS_CHECK(std::isfinite(value), field, " must be finite, got ", value);
  HS_CHECK(peakFlops > 0, "peak_flops must be > 0, got ", peakFlops);
  HS_CHECK(efficiency > 0 && efficiency <= 1, "efficiency must be in (0, 1], got ", efficiency);
  HS_CHECK(attentionEfficiency > 0 && attentionEfficiency <= 1, "attention_efficiency must be in (0, 1], got ",
           attentionEfficiency);
  HS_CHECK(attentionHalfLength >= 0, "attention_half_length must be >= 0, got ", attentionHalfLength);
  HS_CHECK(memoryBytes > 0, "memory_bytes must be > 0, got ", memoryBytes);
  HS_CHECK(memoryBandwidth >= 0, "memory_bandwidth must be >= 0 (0: not modelled), got ", memoryBandwidth);
  HS_CHECK(memoryEfficiency > 0 && memoryEfficiency <= 1, "memory_efficiency must be in (0, 1], got ",
           memoryEfficiency);
  HS_CHECK(intraNodeBandwidth > 0, "intra_node_bandwidth must be > 0, got ", intraNodeBandwidth);
  HS_CHECK(interNodeBandwidth > 0, "inter_node_bandwidth must be > 0, got ", interNodeBandwidth);
  HS_CHECK(intraNodeLatency >= 0, "intra_node_latency must be >= 0, got ", intraNodeLatency);
  HS_CHECK(interNodeLatency >= 0, "inter_node_latency must be >= 0, got ", interNodeLatency);
  HS_CHECK(layerOverheadSeconds >= 0, "layer_overhead_seconds must be >= 0, got ", layerOverheadSeconds);
  HS_CHECK(sequenceOverheadSeconds >= 0, "sequence_overhead_seconds must be >= 0, got ", sequenceOverheadSeconds);
  HS_CHECK(stepOverheadSeconds >= 0, "step_overhead_seconds must be >= 0, got ", stepOverheadSeconds);
}

}  // namespace hotswitch
