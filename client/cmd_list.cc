// ftctl list [--state S]... [--owner O] [--kind K] [--name GLOB] [--limit N] [--oldest-first] [-o table|json|yaml]
#include <fnmatch.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/shared_flags.h"
#include "client/output.h"
#include "client/render.h"

namespace ftd::client {

namespace {

struct ListFlags {
  std::vector<std::string> states;
  std::string owner, kind, name;
  int limit = 0;
  bool oldest_first = false;
  OutputFormat output = OutputFormat::kTable;
};

int RunList(const ListFlags& f, Context& ctx) {
  ftd::v1::ListJobsRequest req;
  for (const auto& s : f.states) {
    ftd::v1::JobState v;
    if (!ftd::v1::JobState_Parse(absl::AsciiStrToUpper(s), &v) || v == ftd::v1::JOB_STATE_UNSPECIFIED) {
      return Usage(absl::StrCat("--state ", s, " is not a state (queued, running, succeeded, failed, cancelled)"));
    }
    req.add_states(v);
  }
  req.set_owner(f.owner);
  if (!f.kind.empty()) req.set_kind(f.kind == "profile" ? ftd::v1::PROFILE : ftd::v1::FINETUNE);
  req.set_newest_first(!f.oldest_first);
  // --name is matched here, so with it pages are read until --limit jobs matched.
  auto wanted = [&](const ftd::v1::Job& j) {
    return f.name.empty() || fnmatch(f.name.c_str(), j.name().c_str(), 0) == 0;
  };
  std::vector<ftd::v1::Job> jobs;
  const auto full = [&] { return f.limit > 0 && static_cast<int>(jobs.size()) >= f.limit; };
  do {
    req.set_page_size(f.limit > 0 && f.name.empty() ? std::min(500, f.limit - static_cast<int>(jobs.size())) : 500);
    auto resp = ctx.client().List(req);
    if (!resp.ok()) return Fail(resp.status());
    for (const auto& j : resp->jobs()) {
      if (wanted(j) && !full()) jobs.push_back(j);
    }
    req.set_page_token(resp->next_page_token());
  } while (!req.page_token().empty() && !full());
  if (f.output == OutputFormat::kTable) {
    std::cout << JobsTable(jobs, NowUnixMs());
  } else {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& j : jobs) a.push_back(ToJsonValue(j));
    std::cout << Emit(a, f.output);
  }
  return kExitOk;
}

}  // namespace

Command AddList(CLI::App& app) {
  auto f = std::make_shared<ListFlags>();
  auto* c = app.add_subcommand("list", "List jobs, newest first");
  c->add_option("--state", f->states, "only these states (repeatable)")
      ->check(OneOf({"queued", "running", "succeeded", "failed", "cancelled"}));
  AddOwnerFilter(c, &f->owner);
  AddKindFlag(c, &f->kind);
  c->add_option("--name", f->name, "only jobs whose name matches this (a shell pattern: 'sweep-*')");
  c->add_option("--limit", f->limit, "the newest N jobs (with --oldest-first the oldest N; default: all)")
      ->check(WholeNumberAtLeast(0));
  c->add_flag("--oldest-first", f->oldest_first, "in submission order instead");
  AddOutputFlag(c, &f->output);
  return {c, [f](Context& ctx) { return RunList(*f, ctx); }};
}

}  // namespace ftd::client
