#include "server/api/handshake_log.h"

#include <gtest/gtest.h>

namespace ftd::server {
namespace {

using std::chrono::seconds;

TEST(LineLimiter, LetsSomeLinesThroughPerWindowAndCountsTheRest) {
  LineLimiter l(3, seconds(60));
  const auto t0 = std::chrono::steady_clock::time_point() + seconds(1000);
  int64_t left_out = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(l.Admit(t0 + seconds(i), &left_out));
    EXPECT_EQ(left_out, 0);
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(l.Admit(t0 + seconds(10), &left_out));
  // The next window's first line says how many were left out.
  EXPECT_TRUE(l.Admit(t0 + seconds(61), &left_out));
  EXPECT_EQ(left_out, 5);
  EXPECT_TRUE(l.Admit(t0 + seconds(62), &left_out));
  EXPECT_EQ(left_out, 0);
}

TEST(HandshakeAdvice, NamesWhatTheClientShouldCheck) {
  EXPECT_NE(HandshakeAdvice("wrong version number").find("--ca-file"), std::string::npos);
  EXPECT_NE(HandshakeAdvice("certificate verify failed").find("--tls-client-ca"), std::string::npos);
  EXPECT_NE(HandshakeAdvice("tlsv1 alert unknown ca").find("--tls-cert"), std::string::npos);
  EXPECT_EQ(HandshakeAdvice("something new"), "");
}

}  // namespace
}  // namespace ftd::server
