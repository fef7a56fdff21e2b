#include "spec/duration.h"

#include <gtest/gtest.h>

namespace ftd::spec {
namespace {

TEST(ParseAge, UnitsAndRefusals) {
  EXPECT_EQ(ParseAge("7d").value(), 7 * 86400'000LL);
  EXPECT_EQ(ParseAge("12h").value(), 12 * 3600'000LL);
  EXPECT_EQ(ParseAge("90m").value(), 90 * 60'000LL);
  EXPECT_EQ(ParseAge("0s").value(), 0);
  for (const char* bad : {"", "7", "d", "7w", "-1d", "1.5d", "7 d", "x7d"}) {
    const auto r = ParseAge(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseAge("7w").status().message().find("7d, 12h, 90m"), std::string_view::npos);
}

}  // namespace
}  // namespace ftd::spec
