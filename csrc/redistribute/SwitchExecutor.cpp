#include "redistribute/SwitchExecutor.h"

#include <algorithm>
#include <tuple>

#include "common/Check.h"
#include "common/Logging.h"

namespace hotswitch {

at::ScalarType toScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt64: return at::kLong;
    case DType::kInt32: return at::kInt;
  }
  return at::kFloat;
}

namespace {

// Messages start 8-byte aligned in the staging buffers, so every segment can be viewed in its
// dtype; the rounds reserve this padding.
constexpr int64_t kAlign = 8;
int64_t alignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

at::Tensor view(const at::Tensor& flat, const Box& box, const Shape& strides, int64_t offset) {
  return flat.as_strided(box.sizes(), strides, flat.storage_offset() + offset);
}

// Byte offsets of each segment in the packed message; each segment starts aligned to its
// element size so that it can be viewed in its dtype.
std::vector<int64_t> packOffsets(const RedistributionPlan& plan, const Message& m, int64_t* total) {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const Segment& s : m.segments) {
    int64_t elem = plan.elementSizes[s.tensor];
    at = (at + elem - 1) / elem * elem;
    offsets.push_back(at);
    at += plan.segmentBytes(s);
  }
  *total = at;
  return offsets;
}

at::Tensor packedView(const at::Tensor& bytes, int64_t offset, const Segment& s, int64_t elem,
                      at::ScalarType type) {
  return bytes.narrow(0, offset, s.numel() * elem).view(type).view(s.box.sizes());
}

// Segment s restricted to the sub-box `box`.
Segment restrict(const Segment& s, const Box& box) {
  Segment out = s;
  out.box = box;
  for (size_t d = 0; d < box.ndim(); ++d) {
    out.srcOffset += (box.lo[d] - s.box.lo[d]) * s.srcStrides[d];
    out.dstOffset += (box.lo[d] - s.box.lo[d]) * s.dstStrides[d];
  }
  return out;
}

}  // namespace

SwitchExecutor::SwitchExecutor(std::shared_ptr<Transport> transport)
    : transport_(std::move(transport)) {
  HS_CHECK(transport_ != nullptr, "SwitchExecutor needs a transport");
}

std::vector<std::vector<Message>> SwitchExecutor::rounds(const RedistributionPlan& plan,
                                                         int64_t maxBufferBytes) {
  HS_CHECK(maxBufferBytes >= 0, "max_buffer_bytes must be >= 0, got ", maxBufferBytes);
  if (maxBufferBytes == 0) return {plan.messages};
  HS_CHECK(maxBufferBytes >= 2 * kAlign, "max_buffer_bytes(", maxBufferBytes,
           ") must be 0 (no bound) or at least ", 2 * kAlign);
  const int64_t room = maxBufferBytes - kAlign;  // what a segment may fill beside its padding

  std::vector<std::vector<Message>> out;
  std::vector<std::vector<int64_t>> load;  // per round, per rank: send + receive bytes
  auto place = [&](const Message& m, const Segment& s, int64_t bytes) {
    int64_t need = bytes + kAlign;  // with its alignment padding
    size_t r = 0;
    for (; r < out.size(); ++r) {
      if (load[r][m.src] + need <= maxBufferBytes && load[r][m.dst] + need <= maxBufferBytes) break;
    }
    if (r == out.size()) {
      out.emplace_back();
      load.emplace_back(plan.world, 0);
    }
    load[r][m.src] += need;
    load[r][m.dst] += need;
    auto& round = out[r];
    auto it = std::find_if(round.rbegin(), round.rend(),
                           [&](const Message& x) { return x.src == m.src && x.dst == m.dst; });
    Message* target = it == round.rend() ? &round.emplace_back(Message{m.src, m.dst, {}, 0}) : &*it;
    target->segments.push_back(s);
    target->bytes += bytes;
  };
  for (const Message& m : plan.messages) {
    for (const Segment& s : m.segments) {
      const int64_t elem = plan.elementSizes[s.tensor];
      const int64_t maxElems = room / elem;  // >= 1: room >= kAlign >= elem
      if (s.numel() <= maxElems) {
        place(m, s, plan.segmentBytes(s));
        continue;
      }
      Shape sizes = s.box.sizes();
      for (int64_t b = 0; b < s.numel(); b += maxElems) {
        for (Box sub : flatRangeBoxes(sizes, b, std::min(s.numel(), b + maxElems))) {
          for (size_t d = 0; d < sub.ndim(); ++d) {
            sub.lo[d] += s.box.lo[d];
            sub.hi[d] += s.box.lo[d];
          }
          Segment part = restrict(s, sub);
          place(m, part, plan.segmentBytes(part));
        }
      }
    }
  }
  if (out.empty()) out.emplace_back();
  return out;
}

at::Tensor SwitchExecutor::staging(int64_t bytes, int64_t bound, const at::TensorOptions& options) {
  if (!staging_.defined() || staging_.numel() < bytes || staging_.device() != options.device() ||
      (bound > 0 && staging_.numel() > bound)) {
    staging_ = at::Tensor();  // free before allocating: the bound is on what is held
    staging_ = at::empty({bytes}, options);
  }
  return staging_.narrow(0, 0, bytes);
}

void SwitchExecutor::releaseStaging() {
  staging_ = at::Tensor();
  donated_.clear();
}

void SwitchExecutor::donate(std::vector<at::Tensor> tensors) {
  donated_.clear();
  for (at::Tensor& t : tensors) {
    if (t.defined() && t.is_contiguous() && t.storage_offset() == 0 &&
        static_cast<int64_t>(t.storage().nbytes()) == t.numel() * t.element_size()) {
      // A fresh 1-D tensor over the storage, not a view: a view would keep its base alive,
      // and with it a second reference to the storage.
      donated_.push_back(at::empty({0}, t.options()).set_(t.storage(), 0, {t.numel()}, {1}));
    }
  }
}

int64_t SwitchExecutor::donatedBytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : donated_) total += t.numel() * t.element_size();
  return total;
}

at::Tensor SwitchExecutor::reuseDonated(int64_t numel, const at::TensorOptions& options) {
  for (size_t i = 0; i < donated_.size(); ++i) {
    const at::Tensor& t = donated_[i];
    if (t.numel() == numel && t.scalar_type() == options.dtype().toScalarType() &&
        t.device() == options.device() && t.storage().use_count() == 1) {
      at::Tensor out = donated_[i];
      donated_.erase(donated_.begin() + i);
      return out;
    }
  }
  return at::Tensor();
}

int64_t SwitchExecutor::stagingBytes() const {
  return staging_.defined() ? staging_.numel() : 0;  // a uint8 buffer
}

SwitchResult SwitchExecutor::run(const RedistributionPlan& plan, const std::vector<at::Tensor>& src,
                                 const SwitchOptions& options) {
  const int me = transport_->rank();
  HS_CHECK(transport_->size() == plan.world, "transport has ", transport_->size(),
           " ranks but the plan is for world ", plan.world);
  const auto& srcSpecs = plan.srcBuffers[me];
  HS_CHECK(src.size() == srcSpecs.size(), "rank ", me, " passed ", src.size(),
           " source buffers, the plan expects ", srcSpecs.size());
  HS_CHECK(options.timeout.count() > 0, "timeout must be > 0 ms, got ", options.timeout.count());
  at::Device device = options.device.value_or(src.empty() ? at::Device(at::kCPU) : src.front().device());
  std::vector<at::Tensor> flatSrc;
  for (size_t i = 0; i < src.size(); ++i) {
    HS_CHECK(src[i].defined(), "source buffer ", i, " is undefined");
    HS_CHECK(src[i].numel() == srcSpecs[i].numel(), "source buffer ", i, " has ", src[i].numel(),
             " elements, expected ", srcSpecs[i].numel(), " (shape ", srcSpecs[i].shape, ")");
    HS_CHECK(src[i].scalar_type() == toScalarType(srcSpecs[i].dtype), "source buffer ", i,
             " has dtype ", c10::toString(src[i].scalar_type()), ", expected ",
             dtypeName(srcSpecs[i].dtype));
    HS_CHECK(src[i].device() == device, "source buffers are on ", device.str(), " and ",
             src[i].device().str(), "; expected one device");
    flatSrc.push_back(src[i].contiguous().view(-1));
  }

  const auto start = std::chrono::steady_clock::now();
  auto byteOpts = at::TensorOptions().dtype(at::kByte).device(device);
  SwitchResult result;
  for (size_t i = 0; i < plan.dstBuffers[me].size(); ++i) {
    const BufferSpec& b = plan.dstBuffers[me][i];
    auto opts = at::TensorOptions().dtype(toScalarType(b.dtype)).device(device);
    // Sums accumulate into zeros; copies overwrite every element but ZeRO padding.
    bool overwritten = !plan.sumsSummands && plan.dstFullyCovered[me][i];
    at::Tensor buf = reuseDonated(b.numel(), opts);
    if (!buf.defined()) buf = at::empty({b.numel()}, opts);
    if (!overwritten) buf.zero_();
    result.buffers.push_back(buf);
  }
  auto dstView = [&](const Segment& s) {
    return view(result.buffers[s.dstBuffer], s.box, s.dstStrides, s.dstOffset);
  };
  auto srcView = [&](const Segment& s) {
    return view(flatSrc[s.srcBuffer], s.box, s.srcStrides, s.srcOffset);
  };
  auto typeOf = [&](const Segment& s) { return toScalarType(plan.dtypes[s.tensor]); };

  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  // Summands are added after every one has arrived, in summand order from zero: each
  // element of the sum is ((0 + s_0) + s_1) + ... on every rank that holds it, whichever
  // rank sent which summand and in which order messages completed, so replicas of one
  // destination element stay bitwise equal.
  struct Summand {
    int summand;
    const Segment* segment;
    at::Tensor values;
  };
  std::vector<Summand> summands;
  auto localStart = Clock::now();
  for (const Segment& s : plan.localCopies[me]) {
    if (plan.sumsSummands) {
      summands.push_back({s.summand, &s, srcView(s)});
    } else {
      dstView(s).copy_(srcView(s));
    }
  }

  result.packSeconds += since(localStart);
  auto rounds = options.maxBufferBytes == 0 ? std::vector<std::vector<Message>>{}
                                            : SwitchExecutor::rounds(plan, options.maxBufferBytes);
  result.rounds = rounds.empty() ? 1 : static_cast<int>(rounds.size());
  auto roundOf = [&](int k) -> const std::vector<Message>& { return rounds.empty() ? plan.messages : rounds[k]; };

  // This rank's messages of each round with their packed layout; one staging buffer holds
  // the largest round, sends first, then receives.
  struct Packed {
    const Message* message;
    int64_t total;
    std::vector<int64_t> offsets;
    int64_t at;  // in the staging buffer
  };
  std::vector<std::vector<Packed>> packed(result.rounds);
  std::vector<int64_t> sendTotals(result.rounds, 0);
  for (int k = 0; k < result.rounds; ++k) {
    int64_t recvTotal = 0;
    for (const Message& m : roundOf(k)) {
      if (m.src != me && m.dst != me) continue;
      Packed p{&m, 0, {}, 0};
      p.offsets = packOffsets(plan, m, &p.total);
      int64_t& total = m.src == me ? sendTotals[k] : recvTotal;
      p.at = total;
      total += alignUp(p.total);
      packed[k].push_back(std::move(p));
    }
    for (Packed& p : packed[k]) {
      if (p.message->dst == me) p.at += sendTotals[k];
    }
    result.peakStagingBytes = std::max(result.peakStagingBytes, sendTotals[k] + recvTotal);
  }
  at::Tensor arena = staging(result.peakStagingBytes, options.maxBufferBytes, byteOpts);

  for (int k = 0; k < result.rounds; ++k) {
    std::vector<PeerBuffer> sends, recvs;
    std::vector<const Packed*> outgoing, incoming;
    for (const Packed& p : packed[k]) {
      at::Tensor bytes = arena.narrow(0, p.at, p.total);
      if (p.message->src == me) {
        sends.push_back({p.message->dst, bytes});
        outgoing.push_back(&p);
        result.bytesSent += p.message->bytes;
      } else {
        recvs.push_back({p.message->src, bytes});
        incoming.push_back(&p);
        result.bytesReceived += p.message->bytes;
      }
    }
    double packSeconds = 0, unpackSeconds = 0;
    auto pack = [&](size_t i) {
      auto t = Clock::now();
      const Message& m = *outgoing[i]->message;
      for (size_t n = 0; n < m.segments.size(); ++n) {
        const Segment& s = m.segments[n];
        packedView(sends[i].buffer, outgoing[i]->offsets[n], s, plan.elementSizes[s.tensor], typeOf(s))
            .copy_(srcView(s));
      }
      packSeconds += since(t);
    };
    auto unpack = [&](size_t j) {
      auto t = Clock::now();
      const Message& m = *incoming[j]->message;
      for (size_t n = 0; n < m.segments.size(); ++n) {
        const Segment& s = m.segments[n];
        at::Tensor packedSegment = packedView(recvs[j].buffer, incoming[j]->offsets[n], s,
                                              plan.elementSizes[s.tensor], typeOf(s));
        if (plan.sumsSummands) {
          // A later round reuses the staging buffer: keep a copy until the sums are made.
          summands.push_back({s.summand, &s, rounds.size() > 1 ? packedSegment.clone() : packedSegment});
        } else {
          dstView(s).copy_(packedSegment);
        }
      }
      unpackSeconds += since(t);
    };
    auto exchangeStart = Clock::now();
    try {
      transport_->exchangeOverlapped(sends, recvs, options.timeout, pack, unpack);
    } catch (...) {
      // The transport keeps the failed call's buffers alive for late peers; new runs must
      // not write into them.
      staging_ = at::Tensor();
      throw;
    }
    result.packSeconds += packSeconds;
    result.unpackSeconds += unpackSeconds;
    result.exchangeSeconds += since(exchangeStart) - packSeconds - unpackSeconds;
  }
  if (plan.sumsSummands) {
    auto t = Clock::now();
    std::stable_sort(summands.begin(), summands.end(),
                     [](const Summand& a, const Summand& b) { return a.summand < b.summand; });
    for (const Summand& s : summands) dstView(*s.segment).add_(s.values);
    result.unpackSeconds += since(t);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  HS_LOG_DEBUG("switch", "rank ", me, ": sent ", result.bytesSent, " B, received ",
               result.bytesReceived, " B in ", result.rounds, " rounds, ", result.seconds * 1e3, " ms");
  return result;
}

}  // namespace hotswitch
