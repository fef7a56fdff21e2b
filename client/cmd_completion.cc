// ftctl completion bash|zsh: prints a completion script; `source <(ftctl completion bash)`.
#include <iostream>

#include "client/cli_help.h"
#include "client/commands.h"

namespace ftd::client {

Command AddCompletion(CLI::App& app) {
  auto shell = std::make_shared<std::string>();
  auto* c = app.add_subcommand("completion",
                               "Print a shell completion script: source <(ftctl completion bash), or zsh");
  c->add_option("shell", *shell, "bash or zsh")->required()->check(OneOf({"bash", "zsh"}));
  return {c, [shell, &app](Context&) {
            std::cout << CompletionScript(app, *shell);
            return kExitOk;
          }};
}

}  // namespace ftd::client
