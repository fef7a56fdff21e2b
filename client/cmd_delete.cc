// ftctl delete ID...; ftctl prune [--older-than AGE] [--state S]... [--owner O] [--dry-run]
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/render.h"
#include "client/shared_flags.h"
#include "spec/duration.h"

namespace ftd::client {

namespace {

std::string Size(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double b = static_cast<double>(bytes);
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", b, units[u]);
}

struct PruneFlags {
  std::string older_than, owner;
  std::vector<std::string> states;
  bool dry_run = false;
};

int RunPrune(const PruneFlags& f, Context& ctx) {
  ftd::v1::PruneJobsRequest req;
  if (!f.older_than.empty()) {
    auto ms = ftd::spec::ParseAge(f.older_than);
    if (!ms.ok()) return Usage(absl::StrFormat("--older-than: %s", ms.status().message()));
    req.set_older_than_seconds(*ms / 1000);
  }
  for (const auto& s : f.states) {
    ftd::v1::JobState state;
    if (!ftd::v1::JobState_Parse(absl::AsciiStrToUpper(s), &state)) {
      return Usage(absl::StrFormat("--state %s: use succeeded, failed or cancelled", s));
    }
    req.add_states(state);
  }
  req.set_owner(f.owner);
  req.set_dry_run(f.dry_run);
  auto r = ctx.client().Prune(req);
  if (!r.ok()) return Fail(r.status());
  for (const auto& id : r->ids()) std::cout << Shown(id) << "\n";
  std::cerr << (f.dry_run ? "would delete " : "deleted ") << r->ids_size() << " job(s), "
            << (f.dry_run ? "freeing " : "freed ") << Size(r->freed_bytes()) << std::endl;
  return kExitOk;
}

}  // namespace

Command AddDelete(CLI::App& app) {
  auto ids = std::make_shared<std::vector<std::string>>();
  auto* c = app.add_subcommand("delete", "Delete finished jobs with their checkpoints, trace and log");
  c->add_option("ids", *ids, "job ids")->required();
  return {c, [ids](Context& ctx) {
            int rc = kExitOk;
            for (const auto& id : *ids) {
              auto r = ctx.client().Delete(id);
              if (!r.ok()) {
                rc = Fail(r.status());
                continue;
              }
              std::cout << Shown(r->id()) << " deleted (" << Size(r->freed_bytes()) << " freed)" << std::endl;
            }
            return rc;
          }};
}

Command AddPrune(CLI::App& app) {
  auto f = std::make_shared<PruneFlags>();
  auto* c = app.add_subcommand("prune", "Delete finished jobs by age and state; prints their ids");
  c->add_option("--older-than", f->older_than, "finished at least this long ago: 7d, 12h, 90m (default: any age)");
  c->add_option("--state", f->states, "only these states (repeatable; default: all three)")
      ->check(OneOf({"succeeded", "failed", "cancelled"}));
  AddOwnerFilter(c, &f->owner);
  c->add_flag("--dry-run", f->dry_run, "list what would be deleted, delete nothing");
  return {c, [f](Context& ctx) { return RunPrune(*f, ctx); }};
}

}  // namespace ftd::client
