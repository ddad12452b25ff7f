#pragma once

// A Transport over a native NCCL communicator: one exchange is one ncclGroupStart /
// ncclSend... ncclRecv... / ncclGroupEnd on a side stream, polled until done or timed out.
// Built only when CUDA and NCCL are found (HOTSWITCH_WITH_NCCL). Buffers must be CUDA
// tensors on the transport's device; the transport synchronizes the device before posting,
// so buffers written on any stream are complete.

#include <cuda_runtime.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "transport/Transport.h"

namespace hotswitch {

class NcclTransport : public Transport {
 public:
  // Collective over the `size` ranks: rank 0 creates the NCCL unique id and publishes it in
  // `store` under `key`; the others wait for it. Throws Fault when CUDA or NCCL fails.
  NcclTransport(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size, int device,
                const std::string& key = "hotswitch/nccl_unique_id");
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  // Whether a CUDA device is present (false, never throwing, on machines without one).
  static bool deviceAvailable();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override;
  // As Transport::exchange. On timeout the communicator is aborted: the transport cannot
  // be used again (a new one must be made), matching what NCCL allows after an abort.
  void exchange(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                std::chrono::milliseconds timeout) override;

 private:
  int rank_;
  int size_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool aborted_ = false;
  std::vector<at::Tensor> abandoned_;
};

}  // namespace hotswitch
