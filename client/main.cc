// ftctl: the command-line client of ftd (docs/ftctl.md). Each command lives in cmd_<name>.cc; this
// file parses the command line, resolves the connection settings and runs the chosen command.
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli_help.h"
#include "client/commands.h"
#include "client/context.h"

int main(int argc, char** argv) {
  using namespace ftd::client;
  // Block the signals the interrupt thread waits for before gRPC starts any thread.
  BlockInterruptSignals();

  CLI::App app{"ftctl: submit, list, watch and cancel ftd fine-tuning jobs"};
  app.require_subcommand(1);
  app.fallthrough();  // --addr/--timeout also after the command
  app.set_version_flag("--version", "ftctl " FTD_VERSION);
  GlobalFlags flags;
  app.add_option("--addr", flags.addr,
                 "ftd address host:port or unix:PATH (default: $FTD_ADDR, the config file, a local ftd's socket, "
                 "127.0.0.1:7070)");
  app.add_option("--timeout", flags.timeout_s, "seconds each call may take, retries included (default 30)")
      ->check(PositiveNumber());
  app.add_option("--context", flags.context, "a context of the config file (default: $FTD_CONTEXT, its current_context)");

  const std::vector<Command> commands = {AddSubmit(app), AddList(app),    AddGet(app),     AddWatch(app),
                                         AddCancel(app), AddWait(app),    AddProfile(app), AddCompare(app),
                                         AddCompletion(app), AddWhoAmI(app),  AddAdmin(app),  AddLogs(app),
                                         AddDelete(app),  AddPrune(app),   AddResubmit(app), AddPause(app),
                                         AddResume(app),  AddScheduler(app), AddPrepare(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string hint = DidYouMean(app, std::vector<std::string>(argv + 1, argv + argc));
    if (!hint.empty()) return Usage(hint);
    return Usage(UsageError(app, e));
  }

  auto opts = ResolveOptions(flags);
  if (!opts.ok()) return Usage(std::string(opts.status().message()));
  Context ctx(*opts);
  InterruptHandler interrupts(&ctx.client());
  for (const auto& c : commands) {
    if (c.app->parsed()) return c.run(ctx);
  }
  return Usage("no command (ftctl --help lists them)");
}
