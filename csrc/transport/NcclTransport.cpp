#include "transport/NcclTransport.h"

#include <cstring>
#include <thread>

#include "common/Check.h"
#include "common/Logging.h"

#define HS_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess) HS_FAULT("transport: ", #expr, " failed: ", cudaGetErrorString(err_)); \
  } while (0)

#define HS_NCCL_CHECK(expr)                                                              \
  do {                                                                                   \
    ncclResult_t res_ = (expr);                                                          \
    if (res_ != ncclSuccess) HS_FAULT("transport: ", #expr, " failed: ", ncclGetErrorString(res_)); \
  } while (0)

namespace hotswitch {

bool NcclTransport::deviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

NcclTransport::NcclTransport(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                             int device, const std::string& key)
    : rank_(rank), size_(size), device_(device) {
  HS_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " outside a group of size ", size);
  HS_CHECK(store, "NcclTransport needs a store");
  ncclUniqueId id;
  if (rank == 0) {
    HS_NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<uint8_t> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    store->set(key, bytes);
  } else {
    std::vector<uint8_t> bytes = store->get(key);
    HS_CHECK(bytes.size() == sizeof(id), "store key '", key, "' holds ", bytes.size(),
             " bytes, expected an NCCL unique id of ", sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  HS_CUDA_CHECK(cudaSetDevice(device_));
  HS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HS_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  HS_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
}

NcclTransport::~NcclTransport() {
  if (comm_ != nullptr) {
    if (aborted_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
  }
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string NcclTransport::name() const {
  return str("nccl(rank ", rank_, " of ", size_, ", device ", device_, ")");
}

void NcclTransport::exchange(const std::vector<PeerBuffer>& sends,
                             const std::vector<PeerBuffer>& recvs,
                             std::chrono::milliseconds timeout) {
  HS_CHECK(!aborted_, "NcclTransport was aborted by an earlier timeout; make a new one");
  for (const auto* list : {&sends, &recvs}) {
    for (const PeerBuffer& b : *list) {
      HS_CHECK(b.peer >= 0 && b.peer < size_, "peer ", b.peer, " outside group of size ", size_);
      HS_CHECK(b.buffer.is_cuda() && b.buffer.get_device() == device_, "buffer for peer ", b.peer,
               " must be a CUDA tensor on device ", device_);
      HS_CHECK(b.buffer.is_contiguous(), "buffer for peer ", b.peer, " is not contiguous");
    }
  }
  HS_CUDA_CHECK(cudaSetDevice(device_));
  HS_CUDA_CHECK(cudaDeviceSynchronize());
  HS_NCCL_CHECK(ncclGroupStart());
  for (const PeerBuffer& b : sends) {
    HS_NCCL_CHECK(ncclSend(b.buffer.data_ptr(), b.buffer.nbytes(), ncclUint8, b.peer, comm_, stream_));
  }
  for (const PeerBuffer& b : recvs) {
    HS_NCCL_CHECK(ncclRecv(b.buffer.data_ptr(), b.buffer.nbytes(), ncclUint8, b.peer, comm_, stream_));
  }
  HS_NCCL_CHECK(ncclGroupEnd());
  HS_CUDA_CHECK(cudaEventRecord(done_, stream_));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    cudaError_t state = cudaEventQuery(done_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) HS_CUDA_CHECK(state);
    ncclResult_t async = ncclSuccess;
    HS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
      for (const auto* list : {&sends, &recvs}) {
        for (const PeerBuffer& b : *list) abandoned_.push_back(b.buffer);
      }
      aborted_ = true;
      std::string peers;
      for (const PeerBuffer& b : recvs) peers += str(peers.empty() ? "" : ", ", b.peer);
      std::string msg = str("transport: NCCL exchange on rank ", rank_, " with receive peers [", peers,
                            "] ", async != ncclSuccess ? str("failed: ", ncclGetErrorString(async))
                                                       : str("timed out after ", timeout.count(), " ms"));
      HS_LOG_WARN("transport", msg);
      if (async != ncclSuccess) throw Fault(msg);
      throw Timeout(msg);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace hotswitch
