// Wakes the watchers of a job when its event log grows. A watcher subscribes to one job before it
// reads the log, then waits for a publication newer than what it has seen; publishing costs one map
// lookup and wakes only that job's watchers. Nothing here reads the store.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace ftd::server {

class EventHub {
 public:
  class Subscription {
   public:
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;
    // True when something was published for the job since the last call (or since subscribing, on the
    // first call), waiting until `deadline` for it. False on the deadline or after Shutdown().
    bool WaitForNew(std::chrono::steady_clock::time_point deadline);

   private:
    friend class EventHub;
    struct Topic;
    Subscription(EventHub* hub, std::string job_id, std::shared_ptr<Topic> topic);
    EventHub* hub_;
    std::string job_id_;
    std::shared_ptr<Topic> topic_;
    uint64_t seen_;
  };

  // Subscribes before the caller reads the log, so nothing published after the read is missed.
  std::unique_ptr<Subscription> Subscribe(const std::string& job_id);
  // New events of the job are committed to the store.
  void Publish(const std::string& job_id);
  // Wakes every waiter for good (the daemon is stopping).
  void Shutdown();

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Subscription::Topic>> topics_;  // jobs with subscribers
  bool shutdown_ = false;
};

}  // namespace ftd::server
