#include "redistribute/SwitchExecutor.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "TestModels.h"
#include "common/Check.h"
#include "ThreadTransport.h"

namespace hotswitch {
namespace {

using testing::forEachElement;
using testing::probeValue;
using testing::runRanks;
using testing::transformerSet;

std::vector<at::Tensor> fill(const TensorSet& set, const Placement& p, int rank) {
  std::vector<at::Tensor> out;
  for (const BufferSpec& b : p.rank(rank).buffers) out.push_back(at::full({b.numel()}, -1.0, at::kDouble));
  for (const Piece& piece : p.rank(rank).pieces) {
    double* data = out[piece.buffer].data_ptr<double>();
    forEachElement(piece, [&](const Shape& x, int64_t off) {
      data[off] = probeValue(piece.tensor, Box::full(set.specs[piece.tensor].shape), x, piece.summand);
    });
  }
  return out;
}

int64_t mismatches(const TensorSet& set, const Placement& from, const Placement& to, int rank,
                   const std::vector<at::Tensor>& got) {
  int64_t bad = 0;
  const bool partial = from.kind() == PlacementKind::kPartial;
  for (const Piece& piece : to.rank(rank).pieces) {
    const int numSummands = from.numSummands(piece.tensor);
    const double* data = got[piece.buffer].data_ptr<double>();
    forEachElement(piece, [&](const Shape& x, int64_t off) {
      double expected = 0;
      for (int k = 0; k < numSummands; ++k) {
        expected += probeValue(piece.tensor, Box::full(set.specs[piece.tensor].shape), x,
                               partial ? k : -1);
      }
      if (data[off] != expected) ++bad;
    });
  }
  return bad;
}

struct ExecCase {
  const char* from;
  PlacementKind fromKind;
  const char* to;
  PlacementKind toKind;
  int64_t maxBufferBytes;
};

class SwitchExecutorGridTest : public ::testing::TestWithParam<ExecCase> {};

TEST_P(SwitchExecutorGridTest, ShardsEqualTheSlicesOfTheFullTensors) {
  const ExecCase& c = GetParam();
  const int world = 4;
  TensorSet set = transformerSet(4, 8, false, DType::kFloat64);
  Topology topo(world, 2);
  Placement from = Placement::make(set, Layout::parse(c.from), c.fromKind);
  Placement to = Placement::make(set, Layout::parse(c.to), c.toKind);
  auto plan = RedistributionPlan::build(set, from, to, topo);
  runRanks(world, [&](int rank, std::shared_ptr<Transport> transport) {
    SwitchExecutor executor(transport);
    std::vector<at::Tensor> src = fill(set, from, rank);
    std::vector<at::Tensor> before;
    for (const auto& t : src) before.push_back(t.clone());
    SwitchOptions options;
    options.maxBufferBytes = c.maxBufferBytes;
    SwitchResult result = executor.run(plan, src, options);
    EXPECT_EQ(mismatches(set, from, to, rank, result.buffers), 0) << "rank " << rank;
    for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(src[i].equal(before[i]));
    EXPECT_EQ(result.bytesSent, plan.sendBytes[rank]);
    if (c.maxBufferBytes > 0) {
      EXPECT_LE(result.peakStagingBytes, c.maxBufferBytes);
      if (plan.stats.bytesMoved > 0) EXPECT_GT(result.rounds, 1);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    World4, SwitchExecutorGridTest,
    ::testing::Values(ExecCase{"dp4", PlacementKind::kSharded, "tp4", PlacementKind::kSharded, 0},
                      ExecCase{"tp4", PlacementKind::kSharded, "dp4", PlacementKind::kSharded, 0},
                      ExecCase{"tp2pp2", PlacementKind::kSharded, "dp2tp2", PlacementKind::kSharded, 0},
                      ExecCase{"pp4", PlacementKind::kSharded, "dp2pp2", PlacementKind::kSharded, 0},
                      ExecCase{"dp2tp2", PlacementKind::kSharded, "tp4", PlacementKind::kZero, 0},
                      ExecCase{"dp2pp2", PlacementKind::kZero, "tp2pp2", PlacementKind::kSharded, 0},
                      ExecCase{"dp4", PlacementKind::kPartial, "dp4", PlacementKind::kZero, 0},
                      ExecCase{"dp2tp2", PlacementKind::kPartial, "tp4", PlacementKind::kSharded, 0},
                      ExecCase{"tp4", PlacementKind::kSharded, "dp4", PlacementKind::kSharded, 1000},
                      ExecCase{"dp2tp2", PlacementKind::kPartial, "dp4", PlacementKind::kZero, 600}));

// Summands whose float sum depends on the order of additions: every replica of a destination
// element holds the same bits, the sum taken in summand order, however the messages arrive.
class SummandOrderTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SummandOrderTest, ReplicasOfASumAreBitwiseEqual) {
  const int world = 4;
  TensorSet set = transformerSet(2, 8, false, DType::kFloat32);
  Topology topo(world, 2);
  Placement from = Placement::make(set, Layout::parse("dp4"), PlacementKind::kPartial);
  Placement to = Placement::make(set, Layout::parse("dp2tp2"), PlacementKind::kSharded);
  auto plan = RedistributionPlan::build(set, from, to, topo);
  auto summand = [](int tensor, int64_t element, int k) {
    const float scale[] = {3e7f, 1.0f, -3e7f, 0.37f};
    return scale[k] * (1.0f + 0.001f * static_cast<float>((element * 7 + tensor * 13) % 97));
  };
  std::vector<std::vector<at::Tensor>> got(world);
  runRanks(world, [&](int rank, std::shared_ptr<Transport> transport) {
    std::vector<at::Tensor> src;
    for (const BufferSpec& b : from.rank(rank).buffers) src.push_back(at::zeros({b.numel()}, at::kFloat));
    for (const Piece& piece : from.rank(rank).pieces) {
      float* data = src[piece.buffer].data_ptr<float>();
      const Shape& shape = set.specs[piece.tensor].shape;
      forEachElement(piece, [&](const Shape& x, int64_t off) {
        int64_t flat = 0;
        for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + x[d];
        data[off] = summand(piece.tensor, flat, piece.summand);
      });
    }
    SwitchOptions options;
    options.maxBufferBytes = GetParam();
    SwitchExecutor executor(transport);
    got[rank] = executor.run(plan, src, options).buffers;
  });
  // Replicas: rank r and r + 2 hold the same shards under dp2tp2 (tp varies fastest).
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), got[r + 2].size());
    for (size_t i = 0; i < got[r].size(); ++i) {
      EXPECT_TRUE(got[r][i].equal(got[r + 2][i])) << "rank " << r << " buffer " << i;
    }
    for (const Piece& piece : to.rank(r).pieces) {
      const float* data = got[r][piece.buffer].data_ptr<float>();
      const Shape& shape = set.specs[piece.tensor].shape;
      int64_t bad = 0;
      forEachElement(piece, [&](const Shape& x, int64_t off) {
        int64_t flat = 0;
        for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + x[d];
        float expected = 0.0f;
        for (int k = 0; k < 4; ++k) expected += summand(piece.tensor, flat, k);
        if (data[off] != expected) ++bad;
      });
      EXPECT_EQ(bad, 0) << "rank " << r << " tensor " << set.specs[piece.tensor].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rounds, SummandOrderTest, ::testing::Values(int64_t{0}, int64_t{512}));

// Rounds respect the bound for every rank, down to the smallest bound and 8-byte elements,
// and carry every byte of the plan.
TEST(SwitchExecutorTest, RoundsRespectTheBoundDownToOneElement) {
  TensorSet set = transformerSet(1, 8, false, DType::kFloat64);
  auto plan = RedistributionPlan::build(set, Placement::make(set, Layout(1, 4, 1)),
                                        Placement::make(set, Layout(4, 1, 1)), Topology(4, 4));
  for (int64_t bound : {16, 24, 100, 1000}) {
    auto rounds = SwitchExecutor::rounds(plan, bound);
    int64_t carried = 0;
    for (const auto& round : rounds) {
      std::vector<int64_t> load(4, 0);
      for (const Message& m : round) {
        int64_t padded = 0;
        for (const Segment& s : m.segments) padded += plan.segmentBytes(s) + 8;
        load[m.src] += padded;
        load[m.dst] += padded;
        carried += m.bytes;
      }
      for (int64_t l : load) EXPECT_LE(l, bound);
    }
    EXPECT_EQ(carried, plan.stats.bytesMoved) << "bound " << bound;
  }
  EXPECT_THROW(SwitchExecutor::rounds(plan, 15), InvalidArgument);
}

TEST(SwitchExecutorTest, RejectsMismatchedBuffersBeforeCommunicating) {
  TensorSet set = transformerSet(2, 8, false, DType::kFloat64);
  Placement from = Placement::make(set, Layout(4, 1, 1));
  Placement to = Placement::make(set, Layout(1, 4, 1));
  auto plan = RedistributionPlan::build(set, from, to, Topology(4, 4));
  runRanks(4, [&](int rank, std::shared_ptr<Transport> transport) {
    SwitchExecutor executor(transport);
    std::vector<at::Tensor> src = fill(set, from, rank);
    src.pop_back();
    EXPECT_THROW(executor.run(plan, src), InvalidArgument);
    src = fill(set, from, rank);
    src[0] = src[0].to(at::kFloat);
    EXPECT_THROW(executor.run(plan, src), InvalidArgument);
  });
}

TEST(SwitchExecutorTest, SilentPeerTimesOutNamingIt) {
  TensorSet set = transformerSet(1, 8, false, DType::kFloat64);
  Placement from = Placement::make(set, Layout(1, 2, 1));
  Placement to = Placement::make(set, Layout(2, 1, 1));
  auto plan = RedistributionPlan::build(set, from, to, Topology(2, 2));
  runRanks(2, [&](int rank, std::shared_ptr<Transport> transport) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;  // never joins the switch
    }
    SwitchExecutor executor(transport);
    SwitchOptions options;
    options.timeout = std::chrono::milliseconds(500);
    auto start = std::chrono::steady_clock::now();
    try {
      executor.run(plan, fill(set, from, rank), options);
      ADD_FAILURE() << "expected Timeout";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  });
}

}  // namespace
}  // namespace hotswitch
