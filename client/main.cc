// ftctl: the command-line client of ftd (docs/ftctl.md). Each command lives in cmd_<name>.cc; this
// file parses the command line, resolves the connection settings and runs the chosen command.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <grpc/support/log.h>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "client/cli_help.h"
#include "client/commands.h"
#include "client/context.h"

namespace {

// gRPC's own lines about a failed TLS handshake (an OpenSSL error, several per call as it retries):
// ftctl's message says what failed and what to check instead (client/tls_probe.h).
void GrpcLog(gpr_log_func_args* args) {
  if (args->file != nullptr && (absl::EndsWith(args->file, "ssl_transport_security.cc") ||
                                absl::EndsWith(args->file, "security_handshaker.cc") ||
                                absl::EndsWith(args->file, "ssl_utils.cc"))) {
    return;
  }
  // Every other line as gRPC writes it: severity, source location, message.
  const char* file = args->file != nullptr ? args->file : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  std::fprintf(stderr, "%s %s:%d] %s\n", gpr_log_severity_string(args->severity), file, args->line, args->message);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ftd::client;
  // Block the signals the interrupt thread waits for before gRPC starts any thread.
  BlockInterruptSignals();
  gpr_set_log_function(&GrpcLog);

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
  app.add_option("--ca-file", flags.ca_file, "TLS: the PEM CA that signed ftd's certificate (default: the context's ca_file)")
      ->type_name("FILE");
  app.add_option("--cert-file", flags.cert_file,
                 "TLS: a PEM client certificate, CN your user name (mutual TLS; with --key-file)")
      ->type_name("FILE");
  app.add_option("--key-file", flags.key_file, "TLS: the PEM private key of --cert-file")->type_name("FILE");

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
