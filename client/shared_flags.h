// Flags that several ftctl commands share, defined once so that their names, help and checks agree.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"

namespace ftd::client {

// --kind finetune|profile.
CLI::Option* AddKindFlag(CLI::App* cmd, std::string* kind);
// --owner as a filter: only this owner's jobs (list, prune).
CLI::Option* AddOwnerFilter(CLI::App* cmd, std::string* owner);
// --set field=value (repeatable); `example` shows it: "--set steps=20 --set optimizer.lr=1e-4".
CLI::Option* AddSetFlag(CLI::App* cmd, std::vector<std::string>* sets, const std::string& example);
// A command that creates a job (`verb`: "submit", "resubmit"; `job`: "job", "new job"):
// --request-id (its idempotency key) and --wait.
void AddCreateFlags(CLI::App* cmd, std::string* request_id, bool* wait, const std::string& verb, const std::string& job);
// `given`, or a new random request id when it is empty: a create retried after a lost answer
// cannot make a second job.
std::string RequestIdOr(const std::string& given);

}  // namespace ftd::client
