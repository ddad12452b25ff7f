#include "transport/C10dTransport.h"

#include <algorithm>
#include <map>

#include "common/Check.h"
#include "common/Logging.h"

namespace hotswitch {

namespace {
constexpr int kTagSpan = 1 << 20;  // tags cycle; far more exchanges apart than can overlap

void checkPeers(const std::vector<PeerBuffer>& buffers, int size, const char* what) {
  std::vector<bool> seen(size, false);
  for (const PeerBuffer& b : buffers) {
    HS_CHECK(b.peer >= 0 && b.peer < size, what, " peer ", b.peer, " outside group of size ", size);
    HS_CHECK(!seen[b.peer], "two ", what, " buffers for peer ", b.peer);
    HS_CHECK(b.buffer.is_contiguous(), what, " buffer for peer ", b.peer, " is not contiguous");
    seen[b.peer] = true;
  }
}
}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<::c10d::ProcessGroup> group)
    : group_(std::move(group)) {
  HS_CHECK(group_, "C10dTransport needs a process group, got None");
  rank_ = group_->getRank();
  size_ = group_->getSize();
}

std::string C10dTransport::name() const {
  return str("c10d(rank ", rank_, " of ", size_, ")");
}

void C10dTransport::exchange(const std::vector<PeerBuffer>& sends,
                             const std::vector<PeerBuffer>& recvs,
                             std::chrono::milliseconds timeout) {
  HS_CHECK(timeout.count() > 0, "timeout must be > 0 ms, got ", timeout.count());
  checkPeers(sends, size_, "send");
  checkPeers(recvs, size_, "receive");
  const int tag = tag_;
  tag_ = (tag_ + 1) % kTagSpan;

  struct Op {
    int peer;
    bool send;
    at::Tensor buffer;
  };
  std::vector<Op> ops;
  for (const PeerBuffer& b : sends) ops.push_back({b.peer, true, b.buffer});
  for (const PeerBuffer& b : recvs) ops.push_back({b.peer, false, b.buffer});
  // Per peer: the lower rank of the pair sends first, the higher receives first.
  std::sort(ops.begin(), ops.end(), [&](const Op& a, const Op& b) {
    if (a.peer != b.peer) return a.peer < b.peer;
    bool lowerSendsFirst = rank_ < a.peer;
    return lowerSendsFirst ? (a.send && !b.send) : (!a.send && b.send);
  });

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<c10::intrusive_ptr<::c10d::Work>> works;
  size_t i = 0;
  try {
    for (; i < ops.size(); ++i) {
      std::vector<at::Tensor> tensors{ops[i].buffer};
      works.push_back(ops[i].send ? group_->send(tensors, ops[i].peer, tag)
                                  : group_->recv(tensors, ops[i].peer, tag));
    }
    for (i = 0; i < works.size(); ++i) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      works[i]->wait(std::max(left, std::chrono::milliseconds(1)));
    }
  } catch (const std::exception& e) {
    for (const Op& op : ops) abandoned_.push_back(op.buffer);
    std::string what = e.what();
    std::string msg = str("transport: ", ops[i].send ? "send to" : "receive from", " rank ",
                          ops[i].peer, " failed after ",
                          std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - (deadline - timeout))
                              .count(),
                          " ms (timeout ", timeout.count(), " ms): ", what.substr(0, 400));
    HS_LOG_WARN("transport", msg);
    // A wait that ran to the deadline timed out; anything earlier is a failure of the peer.
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(5) >= deadline) {
      throw Timeout(msg);
    }
    throw Fault(msg);
  }
}

}  // namespace hotswitch
