#include "server/jobs/event_hub.h"

namespace ftd::server {

struct EventHub::Subscription::Topic {
  uint64_t generation = 0;
  int subscribers = 0;
  std::condition_variable cv;
};

EventHub::Subscription::Subscription(EventHub* hub, std::string job_id, std::shared_ptr<Topic> topic)
    : hub_(hub), job_id_(std::move(job_id)), topic_(std::move(topic)), seen_(topic_->generation) {}

EventHub::Subscription::~Subscription() {
  std::lock_guard<std::mutex> l(hub_->mu_);
  if (--topic_->subscribers == 0) hub_->topics_.erase(job_id_);
}

bool EventHub::Subscription::WaitForNew(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> l(hub_->mu_);
  topic_->cv.wait_until(l, deadline, [&] { return topic_->generation != seen_ || hub_->shutdown_; });
  if (topic_->generation == seen_) return false;
  seen_ = topic_->generation;
  return true;
}

std::unique_ptr<EventHub::Subscription> EventHub::Subscribe(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto& topic = topics_[job_id];
  if (topic == nullptr) topic = std::make_shared<Subscription::Topic>();
  ++topic->subscribers;
  return std::unique_ptr<Subscription>(new Subscription(this, job_id, topic));
}

void EventHub::Publish(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = topics_.find(job_id);
  if (it == topics_.end()) return;
  ++it->second->generation;
  it->second->cv.notify_all();
}

void EventHub::Shutdown() {
  std::lock_guard<std::mutex> l(mu_);
  shutdown_ = true;
  for (auto& [id, topic] : topics_) topic->cv.notify_all();
}

}  // namespace ftd::server
