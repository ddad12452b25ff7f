#pragma once

// Executes a redistribution plan on one rank: packs one buffer per peer, runs one batched
// exchange through a Transport, unpacks into freshly allocated destination buffers; packing
// and unpacking overlap the transfers where the transport allows (exchangeOverlapped).
//
// Transactional: the source buffers are only read, and the destination buffers are returned
// only when every receive has completed; on error the caller still holds the old layout.
// With maxBufferBytes set, the exchange runs in rounds so that the bytes a rank sends plus
// receives in one round (its staging memory) stay within the bound; the rounds are a pure
// function of the plan and the bound, so every rank computes the same ones.

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <vector>

#include "redistribute/RedistributionPlan.h"
#include "transport/Transport.h"

namespace hotswitch {

at::ScalarType toScalarType(DType dtype);

struct SwitchOptions {
  int64_t maxBufferBytes = 0;  // 0: no bound, one round
  // Where staging and destination buffers live; default: the source buffers' device, or the
  // CPU for a rank without source buffers.
  c10::optional<at::Device> device;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

struct SwitchResult {
  std::vector<at::Tensor> buffers;  // the rank's destination buffers, shaped as planned
  int rounds = 0;
  int64_t bytesSent = 0;
  int64_t bytesReceived = 0;
  int64_t peakStagingBytes = 0;  // staging buffer used: the largest round's send + receive
  double seconds = 0;          // the whole run, of which:
  double packSeconds = 0;      //   local copies and packing send buffers
  double exchangeSeconds = 0;  //   the transport's exchanges, less packing and unpacking
  double unpackSeconds = 0;    //   unpacking received buffers
};

class SwitchExecutor {
 public:
  explicit SwitchExecutor(std::shared_ptr<Transport> transport);

  // Throws InvalidArgument (before any communication) when `src` does not match the plan's
  // source buffers of this rank in count, element count, dtype or device; Timeout or Fault
  // from the transport, naming the peer.
  SwitchResult run(const RedistributionPlan& plan, const std::vector<at::Tensor>& src,
                   const SwitchOptions& options = {});

  // Rounds for a bound (0: the plan's messages as one round). Exposed for tests.
  static std::vector<std::vector<Message>> rounds(const RedistributionPlan& plan,
                                                  int64_t maxBufferBytes);

  const std::shared_ptr<Transport>& transport() const { return transport_; }

  // Frees the staging buffers and donated tensors kept between runs.
  void releaseStaging();
  int64_t stagingBytes() const;

  // Offers tensors whose memory later runs may reuse for destination buffers of the same
  // element count, dtype and device: typically the source shards of the switch that just
  // succeeded, which the caller is about to drop. A donated tensor is reused only once its
  // storage has no other user, so a caller that keeps a reference is never overwritten.
  // Replaces the previous donation, so at most one donation's memory is held.
  void donate(std::vector<at::Tensor> tensors);
  int64_t donatedBytes() const;

 private:
  // A byte buffer of `bytes`, reused across runs: the same switch repeats every training
  // step, and fresh large buffers cost page faults each time. Reallocated when too small, or
  // when it holds more than a nonzero `bound`, so that what is held respects the bound.
  at::Tensor staging(int64_t bytes, int64_t bound, const at::TensorOptions& options);
  // A donated tensor matching the spec and free of other users, or an undefined tensor.
  at::Tensor reuseDonated(int64_t numel, const at::TensorOptions& options);

  std::shared_ptr<Transport> transport_;
  at::Tensor staging_;
  std::vector<at::Tensor> donated_;
};

}  // namespace hotswitch
