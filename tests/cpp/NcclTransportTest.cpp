#include "transport/NcclTransport.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace hotswitch {
namespace {

// One rank exchanging with itself: the grouped send/receive path end to end on one GPU.
TEST(NcclTransportTest, SelfExchangeOnOneGpu) {
  if (!NcclTransport::deviceAvailable()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto store = c10::make_intrusive<::c10d::HashStore>();
  NcclTransport transport(store, 0, 1, 0);
  auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0);
  at::Tensor send = at::arange(0, 200, opts);
  at::Tensor recv = at::zeros({200}, opts);
  transport.exchange({{0, send}}, {{0, recv}}, std::chrono::seconds(30));
  EXPECT_TRUE(recv.equal(send));
}

TEST(NcclTransportTest, DeviceProbeNeverThrows) {
  EXPECT_NO_THROW(NcclTransport::deviceAvailable());
}

}  // namespace
}  // namespace hotswitch
