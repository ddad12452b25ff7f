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
  try {
    overlaps_ = group_->getBackendName() == "gloo";
  } catch (const std::exception&) {
    overlaps_ = false;  // a backend that does not name itself: keep the safe order
  }
}

std::string C10dTransport::name() const {
  return str("c10d(rank ", rank_, " of ", size_, ")");
}

void C10dTransport::exchange(const std::vector<PeerBuffer>& sends,
                             const std::vector<PeerBuffer>& recvs,
                             std::chrono::milliseconds timeout) {
  run(sends, recvs, timeout, nullptr, nullptr);
}

void C10dTransport::exchangeOverlapped(const std::vector<PeerBuffer>& sends,
                                       const std::vector<PeerBuffer>& recvs,
                                       std::chrono::milliseconds timeout,
                                       const std::function<void(size_t)>& pack,
                                       const std::function<void(size_t)>& unpack) {
  if (!overlaps_) {
    Transport::exchangeOverlapped(sends, recvs, timeout, pack, unpack);
    return;
  }
  run(sends, recvs, timeout, &pack, &unpack);
}

void C10dTransport::run(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                        std::chrono::milliseconds timeout, const std::function<void(size_t)>* pack,
                        const std::function<void(size_t)>* unpack) {
  HS_CHECK(timeout.count() > 0, "timeout must be > 0 ms, got ", timeout.count());
  checkPeers(sends, size_, "send");
  checkPeers(recvs, size_, "receive");
  const int tag = tag_;
  tag_ = (tag_ + 1) % kTagSpan;
  const bool overlapped = pack != nullptr;

  struct Op {
    int peer;
    bool send;
    size_t index;  // into sends or recvs
    at::Tensor buffer;
    c10::intrusive_ptr<::c10d::Work> work;
  };
  std::vector<Op> ops;
  for (size_t i = 0; i < sends.size(); ++i) ops.push_back({sends[i].peer, true, i, sends[i].buffer, {}});
  for (size_t j = 0; j < recvs.size(); ++j) ops.push_back({recvs[j].peer, false, j, recvs[j].buffer, {}});
  std::sort(ops.begin(), ops.end(), [&](const Op& a, const Op& b) {
    if (overlapped) {
      // Every receive first, so that peers can send while this rank still packs.
      if (a.send != b.send) return !a.send;
      return a.index < b.index;
    }
    // Per peer: the lower rank of the pair sends first, the higher receives first.
    if (a.peer != b.peer) return a.peer < b.peer;
    bool lowerSendsFirst = rank_ < a.peer;
    return lowerSendsFirst ? (a.send && !b.send) : (!a.send && b.send);
  });

  const auto begin = std::chrono::steady_clock::now();
  const auto deadline = begin + timeout;
  const Op* current = nullptr;
  auto fail = [&](const std::exception& e) {
    for (const Op& op : ops) abandoned_.push_back(op.buffer);
    std::string what = e.what();
    std::string msg = str("transport: ", current->send ? "send to" : "receive from", " rank ",
                          current->peer, " failed after ",
                          std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - begin).count(),
                          " ms (timeout ", timeout.count(), " ms): ", what.substr(0, 400));
    HS_LOG_WARN("transport", msg);
    // A wait that ran to the deadline timed out; anything earlier is a failure of the peer.
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(5) >= deadline) {
      throw Timeout(msg);
    }
    throw Fault(msg);
  };
  auto post = [&](Op& op) {
    current = &op;
    try {
      std::vector<at::Tensor> tensors{op.buffer};
      op.work = op.send ? group_->send(tensors, op.peer, tag) : group_->recv(tensors, op.peer, tag);
    } catch (const std::exception& e) {
      fail(e);
    }
  };
  auto wait = [&](Op& op) {
    current = &op;
    try {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      op.work->wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      fail(e);
    }
  };

  for (Op& op : ops) {
    if (op.send && overlapped) (*pack)(op.index);
    post(op);
  }
  for (Op& op : ops) {
    if (op.send) continue;
    wait(op);
    if (overlapped) (*unpack)(op.index);
  }
  for (Op& op : ops) {
    if (op.send) wait(op);
  }
}

}  // namespace hotswitch
