#include "planner/Packer.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "TestUtil.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

double quadratic(int64_t s) { return 100.0 * s + 1.0 * s * s; }

// Awkward batches: a length-1 sequence, primes, one huge outlier, fewer sequences than
// replicas, and random long-tailed ones.
std::vector<std::vector<int64_t>> batches() {
  std::vector<std::vector<int64_t>> out = {
      {1},
      {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 97, 1025},
      {4000, 3, 3, 3, 3, 3, 3, 3},
      {50, 60},
  };
  std::mt19937 gen(7);
  std::lognormal_distribution<double> dist(5.0, 1.2);
  for (int b = 0; b < 20; ++b) {
    std::vector<int64_t> l;
    for (int i = 0; i < 200; ++i) l.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(gen)), 1, 4096));
    out.push_back(l);
  }
  return out;
}

TEST(PackerTest, EverySequenceOnceAndBudgetsHeld) {
  for (const auto& lengths : batches()) {
    for (int replicas : {1, 2, 3, 8}) {
      for (int minMb : {1, 4}) {
        PackOptions o{4096, minMb};
        Packing p = Packer::pack(lengths, replicas, o, quadratic);
        ASSERT_EQ(p.microBatches.size(), static_cast<size_t>(replicas));
        std::vector<int> seen(lengths.size(), 0);
        double maxItem = 0, total = 0;
        for (int64_t s : lengths) {
          maxItem = std::max(maxItem, quadratic(s));
          total += quadratic(s);
        }
        for (int r = 0; r < replicas; ++r) {
          double cost = 0;
          size_t seqs = 0;
          for (const auto& mb : p.microBatches[r]) {
            int64_t tokens = 0;
            EXPECT_FALSE(mb.empty());
            for (int i : mb) {
              ++seen[i];
              tokens += lengths[i];
              cost += quadratic(lengths[i]);
            }
            seqs += mb.size();
            EXPECT_LE(tokens, 4096);
            std::vector<int64_t> cu = Packer::cuSeqlens(lengths, mb);
            EXPECT_EQ(cu.back(), tokens);
          }
          EXPECT_DOUBLE_EQ(cost, p.replicaCost[r]);
          // LPT: no replica exceeds the mean by more than one sequence.
          EXPECT_LE(cost, total / replicas + maxItem + 1e-6);
          if (seqs >= static_cast<size_t>(minMb)) EXPECT_GE(p.microBatches[r].size(), static_cast<size_t>(minMb));
        }
        for (int c : seen) EXPECT_EQ(c, 1);
      }
    }
  }
}

TEST(PackerTest, DeterministicAndBalancedByTimeNotTokens) {
  // One 1000-token sequence costs as much as many short ones: by time, it gets a replica alone.
  std::vector<int64_t> lengths = {1000};
  for (int i = 0; i < 20; ++i) lengths.push_back(100);
  Packing a = Packer::pack(lengths, 2, {4096, 1}, quadratic);
  Packing b = Packer::pack(lengths, 2, {4096, 1}, quadratic);
  EXPECT_EQ(a.microBatches, b.microBatches);
  // quadratic(1000) = 1.1e6, quadratic(100) = 2e4: the long one's replica takes few others.
  size_t withLong = a.microBatches[0][0][0] == 0 ? 0 : 1;
  size_t count = 0;
  for (const auto& mb : a.microBatches[withLong]) count += mb.size();
  EXPECT_LT(count, 5u);
}

TEST(PackerTest, ExchangesCloseTheGapLptLeaves) {
  // Costs 3, 3, 2, 2, 2 on two replicas: LPT gives {3, 2, 2} = 7 and {3, 2} = 5; swapping a 3
  // for a 2 gives 6 and 6, the optimum.
  const auto linear = [](int64_t s) { return static_cast<double>(s); };
  Packing p = Packer::pack({3, 3, 2, 2, 2}, 2, {100, 1}, linear);
  EXPECT_DOUBLE_EQ(p.replicaCost[0], 6);
  EXPECT_DOUBLE_EQ(p.replicaCost[1], 6);
  // Few long sequences per replica (the case of a phase of long documents): afterwards no
  // single move or swap between the slowest replica and another lowers it.
  std::mt19937 gen(3);
  std::uniform_int_distribution<int64_t> length(1000, 4000);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> lengths(40);
    for (auto& l : lengths) l = length(gen);
    Packing q = Packer::pack(lengths, 16, {4096, 1}, quadratic);
    std::vector<std::vector<double>> held(16);
    for (int r = 0; r < 16; ++r) {
      for (const auto& mb : q.microBatches[r]) {
        for (int i : mb) held[r].push_back(quadratic(lengths[i]));
      }
    }
    const int a = static_cast<int>(std::max_element(q.replicaCost.begin(), q.replicaCost.end()) -
                                   q.replicaCost.begin());
    const double top = q.replicaCost[a];
    for (int b = 0; b < 16; ++b) {
      if (b == a) continue;
      for (double x : held[a]) {
        EXPECT_GE(std::max(top - x, q.replicaCost[b] + x), top * (1 - 1e-12));
        for (double y : held[b]) {
          if (y < x) EXPECT_GE(std::max(top - x + y, q.replicaCost[b] + x - y), top * (1 - 1e-12));
        }
      }
    }
  }
}

TEST(PackerTest, TargetCostSetsTheMicroBatchCount) {
  // 12 sequences of 100 tokens, cost 2e4 each, one replica: a target of 5e4 asks for
  // ceil(2.4e5 / 5e4) = 5 micro-batches; the token budget alone would make one.
  std::vector<int64_t> lengths(12, 100);
  PackOptions o{4096, 1, 5e4};
  Packing p = Packer::pack(lengths, 1, o, quadratic);
  ASSERT_EQ(p.microBatches[0].size(), 5u);
  for (const auto& mb : p.microBatches[0]) {
    EXPECT_GE(mb.size(), 2u);  // 12 over 5 slots, balanced: 3, 3, 2, 2, 2
    EXPECT_LE(mb.size(), 3u);
  }
  EXPECT_EQ(Packer::pack(lengths, 1, {4096, 1, 0}, quadratic).microBatches[0].size(), 1u);
  // A tiny target: one sequence per micro-batch.
  EXPECT_EQ(Packer::pack(lengths, 1, {4096, 1, 1e-300}, quadratic).microBatches[0].size(), 12u);
  EXPECT_NE(testing::invalidArgumentMessage([&] { Packer::pack(lengths, 1, {4096, 1, -1}, quadratic); })
                .find("target_micro_batch_cost must be >= 0, got -1"),
            std::string::npos);
}

TEST(PackerTest, RejectsWhatCannotBePacked) {
  auto message = [](auto fn) { return testing::invalidArgumentMessage(fn); };
  EXPECT_NE(message([] { Packer::pack({10, 5000}, 1, {4096, 1}, quadratic); })
                .find("sequence 1 of length 5000 exceeds the micro-batch budget of 4096 tokens"),
            std::string::npos);
  EXPECT_NE(message([] { Packer::pack({10, 0}, 1, {4096, 1}, quadratic); }).find("length 0"),
            std::string::npos);
  EXPECT_NE(message([] { Packer::pack({10}, 0, {4096, 1}, quadratic); }).find("replicas must be >= 1, got 0"),
            std::string::npos);
  // Found by the planner fuzzer: a NaN cost broke the ordering of the load sets (the packer
  // never returned); costs must be finite and >= 0.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(message([&] { Packer::pack({10, 20}, 2, {4096, 1}, [&](int64_t s) { return s == 20 ? nan : 1.0; }); })
                .find("sequence 1 of length 20 has predicted cost nan, expected finite and >= 0"),
            std::string::npos);
  EXPECT_THROW(Packer::pack({10}, 1, {4096, 1}, [](int64_t) { return -1.0; }), InvalidArgument);
  Packing empty = Packer::pack({}, 4, {4096, 1}, quadratic);
  for (const auto& r : empty.microBatches) EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace hotswitch
