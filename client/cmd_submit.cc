// ftctl submit [SPEC.json|SPEC.yaml|- | --default] [--set field=value]... [--name N] [--priority P] [--wait]
//              [--dry-run]
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/render.h"
#include "client/shared_flags.h"
#include "client/spec_input.h"
#include "spec/paths.h"
#include "spec/spec.h"

namespace ftd::client {

namespace {

struct SubmitFlags {
  std::string spec_path, name, request_id, owner, kind = "finetune";
  bool use_default = false, wait = false, max_attempts_given = false, dry_run = false;
  std::vector<std::string> sets;
  int priority = 0, max_attempts = 0;
};

int RunSubmit(const SubmitFlags& f, Context& ctx) {
  if (f.spec_path.empty() == !f.use_default) return Usage("submit takes a spec file or --default (one of them)");
  ftd::v1::SubmitJobRequest req;
  if (f.use_default) {
    *req.mutable_spec() = ftd::spec::DefaultTrainSpec(/*gpu=*/false);
  } else {
    auto spec = ReadSpec(f.spec_path, std::cin);
    if (!spec.ok()) return Usage(std::string(spec.status().message()));
    *req.mutable_spec() = *spec;
  }
  for (const auto& kv : f.sets) {
    if (auto st = ftd::spec::ApplySetOverride(kv, req.mutable_spec()); !st.ok()) return Usage(std::string(st.message()));
  }
  // Relative paths mean the caller's directory, not the daemon's.
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (ec) return Usage(absl::StrCat("cannot resolve the spec's relative paths: no current directory (", ec.message(), ")"));
  if (auto st = ftd::spec::ResolveSpecPaths(cwd.string(), req.mutable_spec()); !st.ok()) return Fail(st);
  req.set_kind(f.kind == "profile" ? ftd::v1::PROFILE : ftd::v1::FINETUNE);
  req.set_name(f.name);
  req.set_priority(f.priority);
  if (f.max_attempts_given) req.set_max_attempts(f.max_attempts);  // unset: ftd's default
  req.set_owner(f.owner);  // empty: ftd records the authenticated caller
  // Always idempotent: a submit retried after a lost answer cannot create a second job.
  req.set_request_id(RequestIdOr(f.request_id));
  if (f.dry_run) {
    req.set_validate_only(true);
    auto r = ctx.client().Submit(req);
    if (!r.ok()) return Fail(r.status());
    std::cout << "valid; predicted peak memory "
              << (r->predicted_peak_bytes() > 0 ? FormatBytes(static_cast<uint64_t>(r->predicted_peak_bytes()))
                                                : std::string("unknown"))
              << "; " << r->placement() << " (nothing was submitted)" << std::endl;
    for (const auto& n : r->notes()) std::cout << "  " << n << std::endl;
    return kExitOk;
  }
  return Submitted(ctx.client(), ctx.client().Submit(req), f.wait);
}

}  // namespace

Command AddSubmit(CLI::App& app) {
  auto f = std::make_shared<SubmitFlags>();
  auto* c = app.add_subcommand("submit", "Submit a job; prints its id");
  c->add_option("spec", f->spec_path, "TrainSpec file, JSON or YAML, or - for stdin (docs/job-spec.md)")
      ->type_name("FILE");
  c->add_flag("--default", f->use_default, "the embedded default job (tiny LLaMA on the arithmetic dataset)");
  AddSetFlag(c, &f->sets, "--set steps=20 --set optimizer.lr=1e-4");
  c->add_option("--name", f->name, "a name for the job");
  AddKindFlag(c, &f->kind);
  c->add_option("--priority", f->priority, "higher runs first, in [-1000, 1000] (default 0)");
  c->add_option("--owner", f->owner, "submit for another user (admins only; default: you, as ftd authenticates you)");
  c->add_option("--max-attempts", f->max_attempts, "attempts for infrastructure failures, 1..20 (default: ftd's)")
      ->each([f](const std::string&) { f->max_attempts_given = true; });
  c->add_flag("--dry-run", f->dry_run,
              "validate through ftd (spec, files, memory, quotas), print the predicted peak memory and where the "
              "job would run; submit nothing");
  AddCreateFlags(c, &f->request_id, &f->wait, "submit", "job");
  return {c, [f](Context& ctx) { return RunSubmit(*f, ctx); }};
}

}  // namespace ftd::client
