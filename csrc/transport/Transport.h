#pragma once

// How a switch moves bytes between ranks. The implementation is C10dTransport, over a
// torch.distributed ProcessGroup: gloo on CPU, NCCL on GPU.

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace hotswitch {

struct PeerBuffer {
  int peer = 0;       // rank in the transport's group
  at::Tensor buffer;  // contiguous; its bytes are sent or overwritten
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Sends every sends[i].buffer to sends[i].peer and fills every recvs[j].buffer from
  // recvs[j].peer, all posted at once; blocks until all have completed. At most one buffer
  // per peer and direction; a receive buffer must have exactly the size the peer sends.
  // Every rank of the group calls exchange() the same number of times, in the same order;
  // calls may be empty on some ranks.
  //
  // Throws Timeout naming the peer and direction when a transfer has not completed within
  // `timeout` of the call, and Fault for any other failure (a peer that died). After a
  // throw the receive buffers hold unspecified bytes; the transport keeps every buffer of
  // the failed call alive until it is destroyed, since a late peer may still touch them.
  // Not thread-safe: one exchange at a time.
  virtual void exchange(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                        std::chrono::milliseconds timeout) = 0;

  // exchange(), with the caller's work overlapped where the transport can: pack(i) fills
  // sends[i].buffer before it is sent, and unpack(j) consumes recvs[j].buffer once it has
  // arrived. Each is called once per buffer, on the calling thread, in index order. The
  // default packs everything, exchanges, then unpacks; throws as exchange().
  virtual void exchangeOverlapped(const std::vector<PeerBuffer>& sends,
                                  const std::vector<PeerBuffer>& recvs,
                                  std::chrono::milliseconds timeout,
                                  const std::function<void(size_t)>& pack,
                                  const std::function<void(size_t)>& unpack) {
    for (size_t i = 0; i < sends.size(); ++i) pack(i);
    exchange(sends, recvs, timeout);
    for (size_t j = 0; j < recvs.size(); ++j) unpack(j);
  }
};

}  // namespace hotswitch
