#pragma once

// A Transport over a torch.distributed (c10d) ProcessGroup.
//
// Sends and receives are posted as individual point-to-point operations, each pair ordered
// so that the lower rank sends first: with backends that serialize a pair's operations on one
// channel (NCCL's per-pair communicators) no two ranks wait on each other. On gloo, whose
// operations progress independently, exchangeOverlapped() posts every receive first, packs
// and posts each send in turn, and unpacks each receive as it completes.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>

#include "transport/Transport.h"

namespace hotswitch {

class C10dTransport : public Transport {
 public:
  explicit C10dTransport(c10::intrusive_ptr<::c10d::ProcessGroup> group);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override;
  void exchange(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                std::chrono::milliseconds timeout) override;
  void exchangeOverlapped(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                          std::chrono::milliseconds timeout, const std::function<void(size_t)>& pack,
                          const std::function<void(size_t)>& unpack) override;

 private:
  void run(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
           std::chrono::milliseconds timeout, const std::function<void(size_t)>* pack,
           const std::function<void(size_t)>* unpack);

  bool overlaps_;  // the backend lets a pair's operations progress in any order (gloo)
  c10::intrusive_ptr<::c10d::ProcessGroup> group_;
  int rank_;
  int size_;
  int tag_ = 0;
  std::vector<at::Tensor> abandoned_;  // buffers of failed exchanges, see Transport::exchange
};

}  // namespace hotswitch
