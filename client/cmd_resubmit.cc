// ftctl resubmit ID [--set field=value]... [--resume] [--name N] [--request-id R] [--wait]
#include <iostream>
#include <random>

#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/follow.h"

namespace ftd::client {

namespace {

struct ResubmitFlags {
  std::string id, name, request_id;
  std::vector<std::string> sets;
  bool resume = false, wait = false;
};

int RunResubmit(const ResubmitFlags& f, Context& ctx) {
  ftd::v1::ResubmitJobRequest req;
  req.set_id(f.id);
  for (const auto& kv : f.sets) req.add_set(kv);
  req.set_resume(f.resume);
  req.set_name(f.name);
  std::random_device rd;
  // Idempotent like submit: a resubmit retried after a lost answer cannot create a second job.
  req.set_request_id(f.request_id.empty() ? absl::StrFormat("ftctl-%08x%08x%08x", rd(), rd(), rd()) : f.request_id);
  return Submitted(ctx.client(), ctx.client().Resubmit(req), f.wait);
}

}  // namespace

Command AddResubmit(CLI::App& app) {
  auto f = std::make_shared<ResubmitFlags>();
  auto* c = app.add_subcommand("resubmit", "Submit a copy of a job, with overrides; prints the new id");
  c->add_option("id", f->id, "the job to copy")->required();
  c->add_option("--set", f->sets, "override a spec field: --set steps=200 --set optimizer.lr=1e-4");
  c->add_flag("--resume", f->resume, "continue a failed or cancelled job from its last checkpoint");
  c->add_option("--name", f->name, "a name for the new job (default: the original's)");
  c->add_option("--request-id", f->request_id, "idempotency key: a repeated resubmit returns the same job");
  c->add_flag("--wait", f->wait, "wait for the new job to end; exit 0 succeeded, 1 failed, 2 cancelled");
  return {c, [f](Context& ctx) { return RunResubmit(*f, ctx); }};
}

}  // namespace ftd::client
