// ftctl's commands, one file each (cmd_<name>.cc). Each adds its subcommand to the app, binding its
// flags, and returns what runs it once the command line is parsed (docs/ftctl.md).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/cli_help.h"
#include "client/context.h"
#include "ftd/v1/jobs.pb.h"

namespace ftd::client {

Command AddSubmit(CLI::App& app);
Command AddList(CLI::App& app);
Command AddGet(CLI::App& app);
Command AddWatch(CLI::App& app);
Command AddWait(CLI::App& app);
Command AddCancel(CLI::App& app);
Command AddProfile(CLI::App& app);
Command AddCompare(CLI::App& app);
Command AddCompletion(CLI::App& app);
Command AddWhoAmI(CLI::App& app);
Command AddAdmin(CLI::App& app);
Command AddLogs(CLI::App& app);
Command AddDelete(CLI::App& app);
Command AddPrune(CLI::App& app);
Command AddResubmit(CLI::App& app);
Command AddPause(CLI::App& app);
Command AddResume(CLI::App& app);
Command AddScheduler(CLI::App& app);
Command AddPrepare(CLI::App& app);

// A PROFILE job's report once it has one (profile, compare); FAILED_PRECONDITION saying why not.
absl::StatusOr<ftd::v1::ProfileReport> FetchProfile(JobClient& client, const std::string& id);

}  // namespace ftd::client
