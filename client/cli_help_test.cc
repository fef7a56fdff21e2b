#include "client/cli_help.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "spec/closest_match.h"

namespace ftd::client {
namespace {

using spec::ClosestMatch;

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

TEST(Completion, ScriptsHoldEveryCommandFlagAndValue) {
  Fixture f;
  f.app.get_subcommand("list")->get_option("--state")->check(OneOf({"queued", "running"}));
  auto* admin = f.app.add_subcommand("admin");
  admin->add_subcommand("token")->add_option("id", f.state)->type_name("FILE");
  const std::string bash = CompletionScript(f.app, "bash");
  EXPECT_NE(bash.find("complete -F _ftctl ftctl"), std::string::npos);
  EXPECT_NE(bash.find("subs['ftctl']='list submit admin'"), std::string::npos) << bash;
  EXPECT_NE(bash.find("subs['ftctl admin']='token'"), std::string::npos) << bash;
  EXPECT_NE(bash.find("flags['ftctl list']='--help -h --output -o --state --oldest-first'"), std::string::npos) << bash;
  // A value flag's values: its OneOf choices, or nothing (never the flags).
  EXPECT_NE(bash.find("values['ftctl list --state']='queued running'"), std::string::npos) << bash;
  EXPECT_NE(bash.find("values['ftctl --addr']='@none'"), std::string::npos) << bash;
  EXPECT_EQ(bash.find("values['ftctl list --oldest-first']"), std::string::npos) << bash;
  EXPECT_NE(bash.find("positionals['ftctl admin token']='@file'"), std::string::npos) << bash;
  const std::string zsh = CompletionScript(f.app, "zsh");
  EXPECT_NE(zsh.find("autoload -U +X bashcompinit && bashcompinit"), std::string::npos);
}

TEST(Validators, RefusalsNameTheValueAndWhatIsAllowed) {
  // CLI11's own checks said "Value -1 not in range 0.000000 to 17976931348623157081452742373170..."
  // and "Check jsn value in {json->1,table->0,yaml->2} OR {1,0,2} FAILED".
  CLI::App app{"test"};
  int64_t limit = 0;
  double timeout = 0;
  int format = 0;
  auto* list = app.add_subcommand("list");
  list->add_option("--limit", limit)->check(WholeNumberAtLeast(0));
  list->add_option("-o,--output", format)->transform(OneOf({"table", "json", "yaml"}, true));
  app.add_option("--timeout", timeout)->check(PositiveNumber());
  auto fails = [&](std::vector<std::string> args) -> std::string {
    std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      return UsageError(app, e);
    }
    return "";
  };
  EXPECT_EQ(fails({"list", "--limit", "-1"}),
            "--limit: must be a whole number >= 0 (got \"-1\"); ftctl list --help lists the flags");
  EXPECT_EQ(fails({"list", "-o", "jsn"}),
            "--output: must be one of table, json, yaml (got \"jsn\"); ftctl list --help lists the flags");
  EXPECT_EQ(fails({"--timeout", "0", "list"}).rfind("--timeout: must be a number > 0 (got \"0\")", 0), 0u)
      << fails({"--timeout", "0", "list"});
  EXPECT_EQ(fails({"list", "--limit", "3", "-o", "YAML"}), "");
  EXPECT_EQ(limit, 3);
  EXPECT_EQ(format, 2);
}

}  // namespace
}  // namespace ftd::client
