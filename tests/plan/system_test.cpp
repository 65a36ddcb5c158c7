// System files: the shipped systems round-trip through TOML, bad files are refused by key, and the
// efficiency tables interpolate between their points.
#include "megaton/plan/system.h"

#include <gtest/gtest.h>

#include "megaton/core/error.h"
#include "megaton/plan/collective_cost.h"
#include "megaton/plan/shipped_systems.h"

using namespace megaton;
using namespace megaton::plan;

TEST(System, ShippedSystemsRoundTripThroughToml) {
  for (const std::string& name : shipped_system_names()) {
    SCOPED_TRACE(name);
    const SystemSpec s = *shipped_system(name);
    EXPECT_EQ(s.source, "datasheet");
    const SystemSpec back = parse_system(to_toml(s), name);
    EXPECT_EQ(to_toml(back), to_toml(s));
    EXPECT_EQ(back.peak_flops, s.peak_flops);
    EXPECT_EQ(back.gemm.size(), s.gemm.size());
    EXPECT_DOUBLE_EQ(back.intra_node.efficiency.at(Collective::AllToAll), s.intra_node.efficiency.at(Collective::AllToAll));
  }
  // A calibrated link's busy-send delay survives the round trip; a file from before it reads as 0.
  SystemSpec cpu = *shipped_system("h100");
  cpu.inter_node.busy_send_delay_s = 2.5e-3;
  EXPECT_DOUBLE_EQ(parse_system(to_toml(cpu), "cpu.toml").inter_node.busy_send_delay_s, 2.5e-3);
  std::string old = to_toml(cpu);
  const size_t at = old.find("busy_send_delay_s = 0.0025\n");
  ASSERT_NE(at, std::string::npos);
  old.erase(at, std::string("busy_send_delay_s = 0.0025\n").size());
  EXPECT_EQ(parse_system(old, "old.toml").inter_node.busy_send_delay_s, 0.0);
  EXPECT_DOUBLE_EQ(shipped_system("h100")->peak("bf16"), 989e12);
  EXPECT_DOUBLE_EQ(shipped_system("h200")->memory_bytes, 141e9);
  EXPECT_FALSE(shipped_system("a100")->peak_flops.count("fp8"));
}

TEST(System, BadFilesAreRefusedNamingTheKey) {
  const std::string good = to_toml(*shipped_system("h100"));
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& words) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      parse_system(text, "sys.toml");
      ADD_FAILURE() << "accepted: " << to;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("devices_per_node = 8", "devices_per_node = 0", "devices_per_node");
  refused("devices_per_node = 8", "devices_per_node = 8\ncolour = 1", "unknown key 'colour'");
  refused("devices_per_node = 8", "devices_per_nod = 8", "missing key 'devices_per_node'");
  refused("source = \"datasheet\"", "source = \"guess\"", "source");
  refused("all_to_all = 0.6", "all_to_all = 1.5", "all_to_all");
  refused("all_to_all = 0.6", "", "missing key 'all_to_all'");
  refused("dtype = \"bf16\"", "dtype = \"bf17\"", "bf17");
  refused("bandwidth_Bps = 3.35e+12", "bandwidth_Bps = nan", "bandwidth_Bps");
  refused("busy_send_delay_s = 0", "busy_send_delay_s = -1e-3", "busy_send_delay_s");
  EXPECT_THROW(parse_system("name = [", "x.toml"), Error);
  EXPECT_THROW(resolve_system("no-such-system"), Error);
}

TEST(System, EfficiencyIsTheMeasuredPointOnItAndBetweenNeighboursBetween) {
  SystemSpec s = *shipped_system("h100");
  s.gemm = {{"bf16", 1024, 1024, 1024, 0.2}, {"bf16", 4096, 4096, 4096, 0.8}};
  EXPECT_DOUBLE_EQ(s.gemm_efficiency("bf16", 1024, 1024, 1024), 0.2);
  EXPECT_DOUBLE_EQ(s.gemm_efficiency("bf16", 4096, 4096, 4096), 0.8);
  const double mid = s.gemm_efficiency("bf16", 2048, 2048, 2048);
  EXPECT_NEAR(mid, 0.5, 1e-12);  // equidistant in log space
  EXPECT_GT(s.gemm_efficiency("bf16", 3000, 3000, 3000), mid);
  EXPECT_NEAR(s.gemm_efficiency("bf16", 65536, 65536, 65536), 0.8, 0.01);  // flat beyond the table
  EXPECT_THROW(s.gemm_efficiency("fp8", 1, 1, 1), Error);
}

TEST(CollectiveCost, RingFormulas) {
  LinkSpec link{1e9, 1e-5, {}};
  for (Collective c : kCollectives) link.efficiency[c] = 0.5;
  // 4 ranks, 1 MB: all-reduce 2(n-1) steps of latency + 2(n-1)/n of the bytes at 0.5 GB/s.
  EXPECT_DOUBLE_EQ(collective_time(Collective::AllReduce, link, 4, 1e6), 6e-5 + 1.5e6 / 5e8);
  EXPECT_DOUBLE_EQ(collective_time(Collective::AllGather, link, 4, 1e6), 3e-5 + 0.75e6 / 5e8);
  EXPECT_DOUBLE_EQ(collective_time(Collective::SendRecv, link, 2, 1e6), 1e-5 + 1e6 / 5e8);
  EXPECT_DOUBLE_EQ(collective_time(Collective::AllReduce, link, 1, 1e6), 0.0);
}

TEST(System, TheCalibratedCpuSystemsShippedInConfigsLoad) {
  for (const char* file : {"cpu-epyc-2core.toml", "cpu-xeon-2core.toml"}) {
    const SystemSpec s = load_system(std::string(MEGATON_SOURCE_DIR) + "/configs/systems/" + file);
    EXPECT_EQ(s.source, "calibrated") << file;
    EXPECT_GT(s.gemm.size(), 20u) << file;
    EXPECT_GT(s.peak("f32"), 0.0) << file;
  }
}
