// ftctl get ID [-o text|json]
#include <iostream>

#include "client/commands.h"
#include "client/render.h"

namespace ftd::client {

namespace {

struct GetFlags {
  std::string id, output = "text";
};

int RunGet(const GetFlags& f, Context& ctx) {
  auto job = ctx.client().Get(f.id);
  if (!job.ok()) return Fail(job.status());
  std::cout << (f.output == "json" ? ToJson(*job, true) + "\n" : JobText(*job));
  return kExitOk;
}

}  // namespace

Command AddGet(CLI::App& app) {
  auto f = std::make_shared<GetFlags>();
  auto* c = app.add_subcommand("get", "Show one job");
  c->add_option("id", f->id, "job id")->required();
  c->add_option("-o,--output", f->output, "text or json")->check(CLI::IsMember({"text", "json"}));
  return {c, [f](Context& ctx) { return RunGet(*f, ctx); }};
}

}  // namespace ftd::client
