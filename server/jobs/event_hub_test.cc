#include "server/jobs/event_hub.h"

#include <gtest/gtest.h>

#include <thread>

namespace ftd::server {
namespace {

using Clock = std::chrono::steady_clock;

TEST(EventHub, APublicationAfterSubscribingIsSeenOnce) {
  EventHub hub;
  auto sub = hub.Subscribe("j-000001");
  hub.Publish("j-000001");  // before the wait: not lost
  EXPECT_TRUE(sub->WaitForNew(Clock::now()));
  EXPECT_FALSE(sub->WaitForNew(Clock::now()));
}

TEST(EventHub, OnlyTheJobsWatchersAreWoken) {
  EventHub hub;
  auto a = hub.Subscribe("j-000001");
  auto a2 = hub.Subscribe("j-000001");
  auto b = hub.Subscribe("j-000002");
  hub.Publish("j-000001");
  hub.Publish("j-000003");  // nobody watches: nothing to do
  EXPECT_TRUE(a->WaitForNew(Clock::now()));
  EXPECT_TRUE(a2->WaitForNew(Clock::now()));
  EXPECT_FALSE(b->WaitForNew(Clock::now()));
}

// A minute's deadline; the wake-up must come from the publication, long before it.
constexpr auto kLong = std::chrono::seconds(60);
constexpr auto kWoken = std::chrono::seconds(30);

TEST(EventHub, AWaitEndsWhenSomethingIsPublished) {
  EventHub hub;
  auto sub = hub.Subscribe("j-000001");
  const auto t0 = Clock::now();
  std::thread publisher([&] { hub.Publish("j-000001"); });
  EXPECT_TRUE(sub->WaitForNew(t0 + kLong));
  EXPECT_LT(Clock::now() - t0, kWoken);
  publisher.join();
}

TEST(EventHub, ShutdownEndsEveryWait) {
  EventHub hub;
  auto sub = hub.Subscribe("j-000001");
  const auto t0 = Clock::now();
  std::thread stopper([&] { hub.Shutdown(); });
  EXPECT_FALSE(sub->WaitForNew(t0 + kLong));
  stopper.join();
  EXPECT_FALSE(hub.Subscribe("j-000002")->WaitForNew(t0 + kLong));
  EXPECT_LT(Clock::now() - t0, kWoken);
}

TEST(EventHub, ALaterSubscriberStartsFromNow) {
  EventHub hub;
  auto first = hub.Subscribe("j-000001");
  hub.Publish("j-000001");
  auto second = hub.Subscribe("j-000001");
  EXPECT_FALSE(second->WaitForNew(Clock::now()));
  EXPECT_TRUE(first->WaitForNew(Clock::now()));
}

}  // namespace
}  // namespace ftd::server
