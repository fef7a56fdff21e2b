#include "client/shared_flags.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_help.h"

namespace ftd::client {

CLI::Option* AddKindFlag(CLI::App* cmd, std::string* kind) {
  return cmd->add_option("--kind", *kind, "finetune or profile")->check(OneOf({"finetune", "profile"}));
}

CLI::Option* AddOwnerFilter(CLI::App* cmd, std::string* owner) {
  return cmd->add_option("--owner", *owner, "only this owner's jobs");
}

CLI::Option* AddSetFlag(CLI::App* cmd, std::vector<std::string>* sets, const std::string& example) {
  return cmd->add_option("--set", *sets, absl::StrCat("override a spec field: ", example));
}

void AddCreateFlags(CLI::App* cmd, std::string* request_id, bool* wait, const std::string& verb, const std::string& job) {
  cmd->add_option("--request-id", *request_id,
                  absl::StrCat("idempotency key: a repeated ", verb, " returns the same job"));
  cmd->add_flag("--wait", *wait,
                absl::StrCat("wait for the ", job, " to end; exit 0 succeeded, 1 failed, 2 cancelled"));
}

std::string RequestIdOr(const std::string& given) {
  if (!given.empty()) return given;
  std::random_device rd;
  return absl::StrFormat("ftctl-%08x%08x%08x", rd(), rd(), rd());
}

}  // namespace ftd::client
