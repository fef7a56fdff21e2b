// ftctl resubmit ID [--set field=value]... [--resume] [--name N] [--request-id R] [--wait]
#include <iostream>
#include "client/commands.h"
#include "client/follow.h"
#include "client/shared_flags.h"

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
  req.set_request_id(RequestIdOr(f.request_id));  // idempotent, like submit
  return Submitted(ctx.client(), ctx.client().Resubmit(req), f.wait);
}

}  // namespace

Command AddResubmit(CLI::App& app) {
  auto f = std::make_shared<ResubmitFlags>();
  auto* c = app.add_subcommand("resubmit", "Submit a copy of a job, with overrides; prints the new id");
  c->add_option("id", f->id, "the job to copy")->required();
  AddSetFlag(c, &f->sets, "--set steps=200 --set optimizer.lr=1e-4");
  c->add_flag("--resume", f->resume, "continue a failed or cancelled job from its last checkpoint");
  c->add_option("--name", f->name, "a name for the new job (default: the original's)");
  AddCreateFlags(c, &f->request_id, &f->wait, "resubmit", "new job");
  return {c, [f](Context& ctx) { return RunResubmit(*f, ctx); }};
}

}  // namespace ftd::client
