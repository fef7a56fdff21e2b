// ftctl profile ID [--trace FILE] [--top N] [-o table|json|yaml]: a PROFILE job's per-op table.
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/output.h"
#include "client/render.h"
#include "spec/profile_table.h"

namespace ftd::client {

absl::StatusOr<ftd::v1::ProfileReport> FetchProfile(JobClient& client, const std::string& id) {
  auto job = client.Get(id, /*full=*/true);
  if (!job.ok()) return job.status();
  if (job->kind() != ftd::v1::PROFILE) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, " is a FINETUNE job, not a PROFILE job: profile one with ftctl submit SPEC --kind profile (ftctl list --kind profile lists them)"));
  }
  // A profile is ready once the job has one; a job still running has none yet.
  if (!job->has_profile()) {
    return absl::FailedPreconditionError(absl::StrCat(id, " has no profile yet (", ftd::v1::JobState_Name(job->state()),
                                                      " ", job->reason(), "); ftctl wait ", id, " first"));
  }
  return job->profile();
}

namespace {

struct ProfileFlags {
  std::string id, trace_path;
  OutputFormat output = OutputFormat::kTable;
  int top = 25;
};

int RunProfile(const ProfileFlags& f, Context& ctx) {
  auto p = FetchProfile(ctx.client(), f.id);
  if (!p.ok()) return Fail(p.status());
  if (!f.trace_path.empty()) {
    std::ofstream out(f.trace_path, std::ios::binary | std::ios::trunc);
    if (!out) return Usage(absl::StrCat("cannot write --trace ", f.trace_path));
    int64_t bytes = 0;
    if (auto st = ctx.client().DownloadTrace(f.id, out, &bytes); !st.ok()) return Fail(st);
    std::cerr << "ftctl: wrote " << bytes << " bytes of trace to " << f.trace_path
              << " (open it in https://ui.perfetto.dev or chrome://tracing)" << std::endl;
  }
  std::cout << (f.output == OutputFormat::kTable ? ftd::spec::ProfileTable(*p, f.top) : Emit(ToJsonValue(*p), f.output));
  return kExitOk;
}

}  // namespace

Command AddProfile(CLI::App& app) {
  auto f = std::make_shared<ProfileFlags>();
  auto* c = app.add_subcommand("profile", "Show a PROFILE job's per-op table; --trace downloads its trace");
  c->add_option("id", f->id, "job id")->required();
  c->add_option("--trace", f->trace_path, "write the Chrome/Perfetto trace JSON to this file")->type_name("FILE");
  c->add_option("--top", f->top, "rows of the table (0: all)")->check(WholeNumberAtLeast(0));
  AddOutputFlag(c, &f->output);
  return {c, [f](Context& ctx) { return RunProfile(*f, ctx); }};
}

}  // namespace ftd::client
