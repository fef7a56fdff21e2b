#include "client/cli_help.h"

#include <gtest/gtest.h>

namespace ftd::client {
namespace {

TEST(ClosestMatch, FindsTyposAndNothingFarOff) {
  const std::vector<std::string> cmds = {"submit", "list", "get", "watch", "cancel", "wait", "profile", "compare"};
  EXPECT_EQ(ClosestMatch("lsit", cmds), "list");
  EXPECT_EQ(ClosestMatch("sumbit", cmds), "submit");
  EXPECT_EQ(ClosestMatch("cancle", cmds), "cancel");
  EXPECT_EQ(ClosestMatch("wathc", cmds), "watch");
  EXPECT_EQ(ClosestMatch("kubectl", cmds), "");
  EXPECT_EQ(ClosestMatch("--ouptut", {"--output", "-o", "--owner"}), "--output");
}

struct Fixture {
  CLI::App app{"test"};
  std::string addr, out, state;
  Fixture() {
    app.add_option("--addr", addr);
    auto* list = app.add_subcommand("list");
    list->add_option("-o,--output", out);
    list->add_option("--state", state);
    list->add_flag("--oldest-first");
    app.add_subcommand("submit");
  }
};

TEST(DidYouMean, NamesTheUnknownCommandOrFlag) {
  Fixture f;
  EXPECT_EQ(DidYouMean(f.app, {"lst"}).rfind("unknown command \"lst\"; did you mean \"list\"?", 0), 0u)
      << DidYouMean(f.app, {"lst"});
  EXPECT_EQ(DidYouMean(f.app, {"--addr", "h:1", "lits"}).rfind("unknown command \"lits\"; did you mean \"list\"?", 0), 0u);
  EXPECT_EQ(DidYouMean(f.app, {"list", "--stat", "queued"}).rfind(
                "unknown flag \"--stat\" for ftctl list; did you mean \"--state\"?", 0),
            0u)
      << DidYouMean(f.app, {"list", "--stat", "queued"});
  EXPECT_NE(DidYouMean(f.app, {"list", "--oldestfirst"}).find("did you mean \"--oldest-first\"?"), std::string::npos);
  EXPECT_NE(DidYouMean(f.app, {"--adr", "x"}).find("did you mean \"--addr\"?"), std::string::npos);
  // A value that looks like a command is a value; valid command lines have no hint.
  EXPECT_EQ(DidYouMean(f.app, {"list", "--state", "lst", "-o", "json"}), "");
  EXPECT_EQ(DidYouMean(f.app, {"list", "--addr=h:1"}), "");
  EXPECT_NE(DidYouMean(f.app, {"frobnicate"}).find("unknown command \"frobnicate\" (ftctl --help"), std::string::npos);
}

TEST(Completion, ScriptsNameEveryCommandAndFlag) {
  Fixture f;
  const std::string bash = CompletionScript(f.app, "bash");
  EXPECT_NE(bash.find("complete -o default -F _ftctl ftctl"), std::string::npos);
  EXPECT_NE(bash.find("\"list submit --help -h --addr\""), std::string::npos) << bash;
  EXPECT_NE(bash.find("list) COMPREPLY=($(compgen -W \"--help -h --output -o --state --oldest-first --addr\" -- \"$cur\"));;"),
            std::string::npos)
      << bash;
  const std::string zsh = CompletionScript(f.app, "zsh");
  EXPECT_EQ(zsh.rfind("autoload -U +X bashcompinit && bashcompinit", 0), 0u);
}

}  // namespace
}  // namespace ftd::client
