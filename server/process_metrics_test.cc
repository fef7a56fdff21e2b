#include "server/process_metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(ProcessStats, ReadsTheStatFieldsAfterACommandNameWithSpacesAndParentheses) {
  const fs::path proc = fs::path(::testing::TempDir()) / "fake-proc";
  fs::remove_all(proc);
  const long tck = sysconf(_SC_CLK_TCK);
  // Fields 14/15 (utime/stime), 22 (starttime), 23 (vsize), 24 (rss pages).
  Write(proc / "self" / "stat",
        "4242 (ftd (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 " + std::to_string(3 * tck) + " " +
            std::to_string(tck) + " 0 0 20 0 12 0 " + std::to_string(50 * tck) + " 1048576000 2560 18446744073709551615\n");
  Write(proc / "stat", "cpu  1 2 3\nbtime 1764000000\nprocesses 9\n");
  Write(proc / "self" / "limits",
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            1024                 524288               files\n");
  for (int i = 0; i < 3; ++i) Write(proc / "self" / "fd" / std::to_string(i), "");
  auto s = ReadProcessStats(proc.string());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 4.0);
  EXPECT_DOUBLE_EQ(s->start_time_seconds, 1764000050.0);
  EXPECT_EQ(s->virtual_bytes, 1048576000);
  EXPECT_EQ(s->resident_bytes, 2560 * sysconf(_SC_PAGESIZE));
  EXPECT_EQ(s->open_fds, 3);
  EXPECT_EQ(s->max_fds, 1024);
  Write(proc / "self" / "stat", "4242 (ftd) S 1 2\n");
  EXPECT_FALSE(ReadProcessStats(proc.string()).ok());
}

TEST(ProcessCollector, ExportsTheProcessFamiliesAndTheBuildInfo) {
  ProcessCollector c("1.2.3", "abc123");
  std::map<std::string, prometheus::MetricFamily> fams;
  for (auto& f : c.Collect()) fams[f.name] = f;
  for (const char* name : {"process_cpu_seconds_total", "process_start_time_seconds", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds", "ftd_build_info"}) {
    ASSERT_TRUE(fams.count(name)) << name;
    ASSERT_EQ(fams[name].metric.size(), 1u) << name;
  }
  EXPECT_EQ(fams["process_cpu_seconds_total"].type, prometheus::MetricType::Counter);
  EXPECT_GT(fams["process_resident_memory_bytes"].metric[0].gauge.value, 1 << 20);
  EXPECT_GT(fams["process_open_fds"].metric[0].gauge.value, 2);  // stdin, stdout, stderr
  EXPECT_GT(fams["process_start_time_seconds"].metric[0].gauge.value, 1.7e9);
  const auto& info = fams["ftd_build_info"].metric[0];
  EXPECT_EQ(info.gauge.value, 1);
  const std::vector<prometheus::ClientMetric::Label> want = {{"commit", "abc123"}, {"version", "1.2.3"}};
  EXPECT_EQ(info.label, want);
  // Without /proc: only the build info.
  ProcessCollector none("1.2.3", "abc123", "/nonexistent");
  ASSERT_EQ(none.Collect().size(), 1u);
}

}  // namespace
}  // namespace ftd::server
