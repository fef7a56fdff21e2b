// ftctl list [--state S]... [--owner O] [--kind K] [--limit N] [-o table|json]
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/render.h"

namespace ftd::client {

namespace {

struct ListFlags {
  std::vector<std::string> states;
  std::string owner, kind, output = "table";
  int limit = 0;
};

int RunList(const ListFlags& f, Context& ctx) {
  ftd::v1::ListJobsRequest req;
  for (const auto& s : f.states) {
    ftd::v1::JobState v;
    std::string upper;
    for (char c : s) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!ftd::v1::JobState_Parse(upper, &v) || v == ftd::v1::JOB_STATE_UNSPECIFIED) {
      return Usage(absl::StrCat("--state ", s, " is not a state (queued, running, succeeded, failed, cancelled)"));
    }
    req.add_states(v);
  }
  req.set_owner(f.owner);
  if (!f.kind.empty()) req.set_kind(f.kind == "profile" ? ftd::v1::PROFILE : ftd::v1::FINETUNE);
  std::vector<ftd::v1::Job> jobs;
  do {
    req.set_page_size(f.limit > 0 ? std::min(500, f.limit - static_cast<int>(jobs.size())) : 500);
    auto resp = ctx.client().List(req);
    if (!resp.ok()) return Fail(resp.status());
    for (const auto& j : resp->jobs()) jobs.push_back(j);
    req.set_page_token(resp->next_page_token());
  } while (!req.page_token().empty() && (f.limit == 0 || static_cast<int>(jobs.size()) < f.limit));
  if (f.output == "json") {
    std::cout << "[";
    for (size_t i = 0; i < jobs.size(); ++i) std::cout << (i ? ",\n" : "\n") << ToJson(jobs[i], false);
    std::cout << (jobs.empty() ? "]" : "\n]") << std::endl;
  } else {
    std::cout << JobsTable(jobs);
  }
  return kExitOk;
}

}  // namespace

Command AddList(CLI::App& app) {
  auto f = std::make_shared<ListFlags>();
  auto* c = app.add_subcommand("list", "List jobs, oldest first");
  c->add_option("--state", f->states, "only these states (repeatable): queued, running, succeeded, failed, cancelled");
  c->add_option("--owner", f->owner, "only this owner's jobs");
  c->add_option("--kind", f->kind, "finetune or profile")->check(CLI::IsMember({"finetune", "profile"}));
  c->add_option("--limit", f->limit, "at most this many jobs (default: all)")->check(CLI::NonNegativeNumber);
  c->add_option("-o,--output", f->output, "table or json")->check(CLI::IsMember({"table", "json"}));
  return {c, [f](Context& ctx) { return RunList(*f, ctx); }};
}

}  // namespace ftd::client
