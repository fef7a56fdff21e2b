// ftctl get ID [-o table|json|yaml]
#include <iostream>

#include "client/commands.h"
#include "client/output.h"
#include "client/render.h"

namespace ftd::client {

namespace {

struct GetFlags {
  std::string id;
  OutputFormat output = OutputFormat::kTable;
};

int RunGet(const GetFlags& f, Context& ctx) {
  auto job = ctx.client().Get(f.id);
  if (!job.ok()) return Fail(job.status());
  std::cout << (f.output == OutputFormat::kTable ? JobText(*job, NowUnixMs()) : Emit(ToJsonValue(*job), f.output));
  return kExitOk;
}

}  // namespace

Command AddGet(CLI::App& app) {
  auto f = std::make_shared<GetFlags>();
  auto* c = app.add_subcommand("get", "Show one job");
  c->add_option("id", f->id, "job id")->required();
  AddOutputFlag(c, &f->output);
  return {c, [f](Context& ctx) { return RunGet(*f, ctx); }};
}

}  // namespace ftd::client
