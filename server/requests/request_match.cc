#include "server/requests/request_match.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ftd::server {

namespace {

namespace pb = google::protobuf;
using pb::util::MessageDifferencer;

// Collects the path of each differing leaf field ("optimizer.lr", "model.preset").
class PathCollector final : public MessageDifferencer::Reporter {
 public:
  explicit PathCollector(std::string prefix, std::vector<std::string>* out) : prefix_(std::move(prefix)), out_(out) {}
  void ReportAdded(const pb::Message&, const pb::Message&,
                   const std::vector<MessageDifferencer::SpecificField>& path) override {
    Add(path);
  }
  void ReportDeleted(const pb::Message&, const pb::Message&,
                     const std::vector<MessageDifferencer::SpecificField>& path) override {
    Add(path);
  }
  void ReportModified(const pb::Message&, const pb::Message&,
                      const std::vector<MessageDifferencer::SpecificField>& path) override {
    // A modified message is reported after the fields inside it that differ: those name it.
    const auto* last = path.empty() ? nullptr : path.back().field;
    if (last != nullptr && last->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) return;
    Add(path);
  }

 private:
  void Add(const std::vector<MessageDifferencer::SpecificField>& path) {
    std::string p = prefix_;
    for (const auto& f : path) {
      if (f.field == nullptr) continue;
      absl::StrAppend(&p, ".", f.field->name());
    }
    // A repeated field or a map reports each element; name the field once.
    if (out_->empty() || out_->back() != p) out_->push_back(p);
  }
  std::string prefix_;
  std::vector<std::string>* out_;
};

}  // namespace

std::vector<std::string> DifferingRequestFields(const ftd::v1::Job& existing, const ftd::v1::Job& requested) {
  std::vector<std::string> out;
  if (existing.kind() != requested.kind()) out.push_back("kind");
  if (existing.name() != requested.name()) out.push_back("name");
  if (existing.owner() != requested.owner()) out.push_back("owner");
  if (existing.priority() != requested.priority()) out.push_back("priority");
  if (existing.max_attempts() != requested.max_attempts()) out.push_back("max_attempts");
  PathCollector collector("spec", &out);
  MessageDifferencer d;
  d.set_report_matches(false);
  d.ReportDifferencesTo(&collector);
  d.Compare(existing.spec(), requested.spec());
  return out;
}

absl::Status CheckSameRequest(const ftd::v1::Job& existing, const ftd::v1::Job& requested) {
  const auto fields = DifferingRequestFields(existing, requested);
  if (fields.empty()) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "request_id \"", requested.request_id(), "\" already names job ", existing.id(),
      ", submitted with a different request (differs in: ", absl::StrJoin(fields, ", "),
      "); use a new request_id for a new job, or repeat the original request to get ", existing.id(), " back"));
}

}  // namespace ftd::server
