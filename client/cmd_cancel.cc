// ftctl cancel ID
#include <iostream>

#include "client/commands.h"

namespace ftd::client {

Command AddCancel(CLI::App& app) {
  auto id = std::make_shared<std::string>();
  auto* c = app.add_subcommand("cancel", "Cancel a queued or running job");
  c->add_option("id", *id, "job id")->required();
  return {c, [id](Context& ctx) {
            auto job = ctx.client().Cancel(*id);
            if (!job.ok()) return Fail(job.status());
            std::cout << job->id() << " " << ftd::v1::JobState_Name(job->state()) << " " << job->reason() << ": "
                      << job->message() << std::endl;
            return kExitOk;
          }};
}

}  // namespace ftd::client
