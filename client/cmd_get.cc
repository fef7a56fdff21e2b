// ftctl get ID [--spec] [-o table|json|yaml]
#include <iostream>

#include "client/commands.h"
#include "client/output.h"
#include "client/render.h"

namespace ftd::client {

namespace {

struct GetFlags {
  std::string id;
  bool spec = false;
  OutputFormat output = OutputFormat::kTable;
};

int RunGet(const GetFlags& f, Context& ctx) {
  auto job = ctx.client().Get(f.id, /*full=*/f.spec);
  if (!job.ok()) return Fail(job.status());
  if (f.spec) {
    // A spec file `ftctl submit` takes back: JSON unless -o yaml.
    std::cout << Emit(ToJsonValue(job->spec()), f.output == OutputFormat::kYaml ? f.output : OutputFormat::kJson);
    return kExitOk;
  }
  std::cout << (f.output == OutputFormat::kTable ? JobText(*job, NowUnixMs()) : Emit(ToJsonValue(*job), f.output));
  return kExitOk;
}

}  // namespace

Command AddGet(CLI::App& app) {
  auto f = std::make_shared<GetFlags>();
  auto* c = app.add_subcommand("get", "Show one job");
  c->add_option("id", f->id, "job id")->required();
  c->add_flag("--spec", f->spec,
              "print only the job's spec, as JSON (-o yaml: YAML) that ftctl submit takes back; the owner's and admins' only");
  AddOutputFlag(c, &f->output);
  return {c, [f](Context& ctx) { return RunGet(*f, ctx); }};
}

}  // namespace ftd::client
