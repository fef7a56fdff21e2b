// ftctl wait ID: blocks until the job ends; the exit code is its outcome.
#include <iostream>

#include "client/commands.h"
#include "client/follow.h"

namespace ftd::client {

Command AddWait(CLI::App& app) {
  auto id = std::make_shared<std::string>();
  auto* c = app.add_subcommand("wait", "Wait for a job to end; exit 0 succeeded, 1 failed, 2 cancelled");
  c->add_option("id", *id, "job id")->required();
  return {c, [id](Context& ctx) {
            const int rc = Follow(ctx.client(), *id, FollowOutput::kNone);
            PrintOutcome(ctx.client(), *id, rc, std::cout);
            return rc;
          }};
}

}  // namespace ftd::client
