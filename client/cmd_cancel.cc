// ftctl cancel ID... [--checkpoint]
#include <iostream>

#include "client/commands.h"
#include "client/render.h"

namespace ftd::client {

Command AddCancel(CLI::App& app) {
  auto ids = std::make_shared<std::vector<std::string>>();
  auto checkpoint = std::make_shared<bool>(false);
  auto* c = app.add_subcommand("cancel", "Cancel queued or running jobs");
  c->add_option("id", *ids, "job ids")->required();
  c->add_flag("--checkpoint", *checkpoint,
              "write a checkpoint before stopping (resubmit --resume continues from it); default: stop at the next "
              "step without one");
  return {c, [ids, checkpoint](Context& ctx) {
            // Every id is tried; the exit code is the first failure's.
            int rc = kExitOk;
            for (const auto& id : *ids) {
              auto job = ctx.client().Cancel(id, *checkpoint);
              if (!job.ok()) {
                if (const int r = Fail(job.status()); rc == kExitOk) rc = r;
                if (Interrupted()) break;
                continue;
              }
              std::cout << Shown(job->id()) << " " << ftd::v1::JobState_Name(job->state()) << " "
                        << Shown(job->reason()) << ": " << Shown(job->message()) << std::endl;
            }
            return rc;
          }};
}

}  // namespace ftd::client
