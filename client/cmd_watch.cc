// ftctl watch ID [-o text|json]: the job's events live until it ends.
#include "client/commands.h"
#include "client/follow.h"

namespace ftd::client {

Command AddWatch(CLI::App& app) {
  struct WatchFlags {
    std::string id, output = "text";
  };
  auto f = std::make_shared<WatchFlags>();
  auto* c = app.add_subcommand("watch", "Follow a job's events live until it ends (Ctrl-C stops watching, not the job)");
  c->add_option("id", f->id, "job id")->required();
  c->add_option("-o,--output", f->output, "text (one line per event) or json (one object per event)")
      ->check(OneOf({"text", "json"}));
  return {c, [f](Context& ctx) {
            return Follow(ctx.client(), f->id, f->output == "json" ? FollowOutput::kJson : FollowOutput::kText);
          }};
}

}  // namespace ftd::client
