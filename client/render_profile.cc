// Two profiles side by side (render.h): the ops with the most time in either, the time per
// category, as a table or JSON (ftctl profile --compare).
#include "client/render.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ftd::client {

namespace {

// One (phase, op, category) of a comparison; a side without the op has nullptr.
struct ComparedOp {
  std::string phase, op, category;
  const ftd::v1::OpProfile* a = nullptr;
  const ftd::v1::OpProfile* b = nullptr;
  double a_ms() const { return a == nullptr ? 0.0 : a->device_ms(); }
  double b_ms() const { return b == nullptr ? 0.0 : b->device_ms(); }
};

// The ops of both, largest time in either first; the `top` of them (0: all).
std::vector<ComparedOp> CompareOps(const ftd::v1::ProfileReport& a, const ftd::v1::ProfileReport& b, int top) {
  std::map<std::tuple<std::string, std::string, std::string>, ComparedOp> ops;  // (phase, op, category)
  for (const auto& o : a.ops()) ops[{o.phase(), o.name(), o.category()}].a = &o;
  for (const auto& o : b.ops()) ops[{o.phase(), o.name(), o.category()}].b = &o;
  std::vector<ComparedOp> rows;
  for (auto& [key, row] : ops) {
    std::tie(row.phase, row.op, row.category) = key;
    rows.push_back(row);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const ComparedOp& x, const ComparedOp& y) {
    return std::max(x.a_ms(), x.b_ms()) > std::max(y.a_ms(), y.b_ms());
  });
  if (top > 0 && rows.size() > static_cast<size_t>(top)) rows.resize(static_cast<size_t>(top));
  return rows;
}

// Per category with time in either: (A ms, B ms).
std::map<std::string, std::pair<double, double>> CompareCategories(const ftd::v1::ProfileReport& a,
                                                                   const ftd::v1::ProfileReport& b) {
  std::map<std::string, std::pair<double, double>> cats;
  for (const auto& c : a.categories()) cats[c.category()].first = c.device_ms();
  for (const auto& c : b.categories()) cats[c.category()].second = c.device_ms();
  std::erase_if(cats, [](const auto& kv) { return kv.second.first == 0 && kv.second.second == 0; });
  return cats;
}

}  // namespace

std::string CompareTable(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                         const ftd::v1::ProfileReport& b, int top) {
  const char* unit = a.device() == "cpu" && b.device() == "cpu" ? "CPU" : "device";
  std::string out = absl::StrFormat("A = %s (%s, %.1f ms %s time/step)   B = %s (%s, %.1f ms %s time/step)\n\n",
                                    Shown(a_id), Shown(a.kernel_set()), a.step_device_ms(), unit, Shown(b_id),
                                    Shown(b.kernel_set()),
                                    b.step_device_ms(), unit);
  absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %10s %8s %8s %8s\n", "op", "phase", "category", "A ms",
                        "B ms", "B-A ms", "B/A", "A calls", "B calls");
  auto cell = [](const ftd::v1::OpProfile* o, double v) { return o == nullptr ? std::string("-") : absl::StrFormat("%.3f", v); };
  for (const auto& r : CompareOps(a, b, top)) {
    const double da = r.a_ms(), db = r.b_ms();
    const std::string op = Shown(r.op);
    std::string name = op.size() > 48 ? op.substr(0, 45) + "..." : op;
    absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %+10.3f %8s %8s %8s\n", name, Shown(r.phase),
                          Shown(r.category),
                          cell(r.a, da), cell(r.b, db), db - da,
                          da > 0 && r.b != nullptr ? absl::StrFormat("%.2fx", db / da) : "-",
                          r.a ? absl::StrFormat("%.0f", r.a->calls()) : "-",
                          r.b ? absl::StrFormat("%.0f", r.b->calls()) : "-");
  }
  absl::StrAppendFormat(&out, "\n%-14s %10s %10s %10s\n", "category", "A ms", "B ms", "B-A ms");
  for (const auto& [c, v] : CompareCategories(a, b)) {
    absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", Shown(c), v.first, v.second, v.second - v.first);
  }
  absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", "step", a.step_device_ms(), b.step_device_ms(),
                        b.step_device_ms() - a.step_device_ms());
  return out;
}

nlohmann::ordered_json CompareJson(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                                   const ftd::v1::ProfileReport& b, int top) {
  using nlohmann::ordered_json;
  auto side = [](const std::string& id, const ftd::v1::ProfileReport& p) {
    return ordered_json{{"id", id}, {"kernel_set", p.kernel_set()}, {"device", p.device()}, {"step_ms", p.step_device_ms()}};
  };
  ordered_json j{{"a", side(a_id, a)}, {"b", side(b_id, b)}, {"ops", ordered_json::array()},
                 {"categories", ordered_json::array()}};
  auto or_null = [](const ftd::v1::OpProfile* o, double v) { return o == nullptr ? ordered_json() : ordered_json(v); };
  for (const auto& r : CompareOps(a, b, top)) {
    j["ops"].push_back({{"op", r.op}, {"phase", r.phase}, {"category", r.category}, {"a_ms", or_null(r.a, r.a_ms())},
                        {"b_ms", or_null(r.b, r.b_ms())}, {"diff_ms", r.b_ms() - r.a_ms()},
                        {"ratio", r.a_ms() > 0 && r.b != nullptr ? ordered_json(r.b_ms() / r.a_ms()) : ordered_json()},
                        {"a_calls", r.a ? ordered_json(r.a->calls()) : ordered_json()},
                        {"b_calls", r.b ? ordered_json(r.b->calls()) : ordered_json()}});
  }
  for (const auto& [c, v] : CompareCategories(a, b)) {
    j["categories"].push_back({{"category", c}, {"a_ms", v.first}, {"b_ms", v.second}, {"diff_ms", v.second - v.first}});
  }
  return j;
}

}  // namespace ftd::client
