#pragma once

// An in-process Transport for the executor's tests: the ranks of a group are threads of one
// process and messages pass through a shared mailbox. It keeps the contract of Transport
// (every rank calls exchange() the same number of times; a receive waits at most `timeout`,
// then throws Timeout naming the peer), so the executor's packing, rounds and summation are
// tested without a process group. C10dTransport itself is tested over real gloo process
// groups by the Python suite (tests/python/switch).

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/Check.h"
#include "transport/Transport.h"

namespace hotswitch {
namespace testing {

class Mailbox {
 public:
  void post(int src, int dst, at::Tensor bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queues_[{src, dst}].push_back(std::move(bytes));
    }
    ready_.notify_all();
  }

  // The oldest message from src to dst, or an undefined tensor when none arrives by deadline.
  at::Tensor take(int src, int dst, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& queue = queues_[{src, dst}];
    if (!ready_.wait_until(lock, deadline, [&] { return !queue.empty(); })) return at::Tensor();
    at::Tensor out = std::move(queue.front());
    queue.pop_front();
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<std::pair<int, int>, std::deque<at::Tensor>> queues_;
};

class ThreadTransport : public Transport {
 public:
  ThreadTransport(std::shared_ptr<Mailbox> mailbox, int rank, int size)
      : mailbox_(std::move(mailbox)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "threads"; }

  void exchange(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const PeerBuffer& s : sends) mailbox_->post(rank_, s.peer, s.buffer.clone());
    for (const PeerBuffer& r : recvs) {
      at::Tensor got = mailbox_->take(r.peer, rank_, deadline);
      if (!got.defined()) {
        throw Timeout(str("rank ", rank_, ": receive from rank ", r.peer, " timed out after ",
                          timeout.count(), " ms"));
      }
      HS_INTERNAL_CHECK(got.nbytes() == r.buffer.nbytes(), "rank ", rank_, " expected ",
                        r.buffer.nbytes(), " B from rank ", r.peer, ", got ", got.nbytes());
      r.buffer.copy_(got.view(r.buffer.scalar_type()).view(r.buffer.sizes()));
    }
  }

 private:
  std::shared_ptr<Mailbox> mailbox_;
  int rank_;
  int size_;
};

// Runs fn(rank, transport) on `world` threads sharing one mailbox; the test fails with each
// rank's exception message.
template <typename Fn>
void runRanks(int world, Fn fn) {
  auto mailbox = std::make_shared<Mailbox>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, std::make_shared<ThreadTransport>(mailbox, r, world));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace testing
}  // namespace hotswitch
