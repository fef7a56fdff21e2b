#include "client/cli_help.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spec/closest_match.h"

namespace ftd::client {

using spec::ClosestMatch;

namespace {

std::vector<std::string> CommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  return names;
}

// Every spelling of the flags of `app` ("--output", "-o").
std::vector<std::string> FlagNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options({})) {
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// The flags that take a value (their next argument is not a command).
bool TakesValue(const CLI::App& app, const std::string& flag) {
  for (const CLI::Option* o : app.get_options({})) {
    if (o->check_name(flag)) return o->get_type_size() != 0;
  }
  return false;
}

}  // namespace

CLI::Validator WholeNumberAtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& v) -> std::string {
        int64_t n = 0;
        if (absl::SimpleAtoi(v, &n) && n >= min) return "";
        return absl::StrCat("must be a whole number >= ", min, " (got \"", v, "\")");
      },
      absl::StrCat("INT>=", min));
}

CLI::Validator PositiveNumber() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        double x = 0;
        if (absl::SimpleAtod(v, &x) && x > 0 && std::isfinite(x)) return "";
        return absl::StrCat("must be a number > 0 (got \"", v, "\")");
      },
      "NUMBER>0");
}

CLI::Validator OneOf(std::vector<std::string> choices, bool to_index) {
  const std::string desc = absl::StrJoin(choices, "|");
  return CLI::Validator(
      [choices = std::move(choices), to_index](std::string& v) -> std::string {
        for (size_t i = 0; i < choices.size(); ++i) {
          if (absl::EqualsIgnoreCase(v, choices[i])) {
            v = to_index ? std::to_string(i) : choices[i];
            return "";
          }
        }
        return absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), " (got \"", v, "\")");
      },
      desc);
}

std::string UsageError(const CLI::App& app, const CLI::ParseError& e) {
  // The commands parsed before the error ("admin token create").
  std::string command;
  for (const CLI::App* at = &app;;) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    absl::StrAppend(&command, command.empty() ? "" : " ", at->get_name());
  }
  if (command.empty()) return absl::StrCat(e.what(), "; ftctl --help lists the commands and flags");
  return absl::StrCat(e.what(), "; ftctl ", command, " --help lists the flags");
}

std::string DidYouMean(const CLI::App& app, const std::vector<std::string>& args) {
  const std::vector<std::string> commands = CommandNames(app);
  const CLI::App* cmd = nullptr;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const CLI::App* scope = cmd == nullptr ? &app : cmd;
    if (absl::StartsWith(a, "-") && a != "-") {
      const std::string flag = a.substr(0, a.find('='));
      if (flag == "--") break;
      std::vector<std::string> known = FlagNames(*scope);
      if (cmd != nullptr) {
        for (auto& f : FlagNames(app)) known.push_back(f);  // the global flags also after the command
      }
      if (std::find(known.begin(), known.end(), flag) == known.end()) {
        const std::string where = cmd == nullptr ? "ftctl" : absl::StrCat("ftctl ", cmd->get_name());
        const std::string m = ClosestMatch(flag, known);
        return absl::StrCat("unknown flag \"", flag, "\" for ", where,
                            m.empty() ? "" : absl::StrCat("; did you mean \"", m, "\"?"), " (", where, " --help lists them)");
      }
      if (a.find('=') == std::string::npos && (TakesValue(*scope, flag) || TakesValue(app, flag))) ++i;
      continue;
    }
    if (cmd == nullptr) {
      if (std::find(commands.begin(), commands.end(), a) == commands.end()) {
        const std::string m = ClosestMatch(a, commands);
        return absl::StrCat("unknown command \"", a, "\"",
                            m.empty() ? "" : absl::StrCat("; did you mean \"", m, "\"?"),
                            " (ftctl --help lists the commands: ", absl::StrJoin(commands, ", "), ")");
      }
      cmd = app.get_subcommand(a);
    }
  }
  return "";
}

namespace {

// The words once each, in their first order.
std::string Words(const std::vector<std::string>& w) {
  std::vector<std::string> once;
  for (const auto& x : w) {
    if (std::find(once.begin(), once.end(), x) == once.end()) once.push_back(x);
  }
  return absl::StrJoin(once, " ");
}

}  // namespace

std::string CompletionScript(const CLI::App& app, const std::string& shell) {
  // Values of the flags that take one of a few words.
  const std::string values = R"(    case "$prev" in
      -o|--output) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
      --state) COMPREPLY=($(compgen -W "queued running succeeded failed cancelled" -- "$cur")); return;;
      --kind) COMPREPLY=($(compgen -W "finetune profile" -- "$cur")); return;;
      --addr|--timeout|--name|--set|--priority|--request-id|--owner|--max-attempts|--limit|--top) return;;
      --trace) COMPREPLY=($(compgen -f -- "$cur")); return;;
    esac
)";
  std::vector<std::string> global = FlagNames(app);
  std::string cases;
  for (const CLI::App* sub : app.get_subcommands({})) {
    std::vector<std::string> flags = FlagNames(*sub);
    flags.insert(flags.end(), global.begin(), global.end());
    // submit takes a spec file: complete file names where no flag is being typed.
    const std::string files = sub->get_name() == "submit" ? R"(; [[ $cur != -* ]] && COMPREPLY+=($(compgen -f -- "$cur")))" : "";
    absl::StrAppend(&cases, "      ", sub->get_name(), ") COMPREPLY=($(compgen -W \"", Words(flags), "\" -- \"$cur\"))",
                    files, ";;\n");
  }
  std::string script = absl::StrCat(R"(# ftctl completion for )", shell, R"(: generated by `ftctl completion )", shell,
                                    R"(`.
_ftctl() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      --addr|--timeout) ((i++));;
      -*) ;;
      *) cmd="${COMP_WORDS[i]}"; break;;
    esac
  done
)",
                                    values, R"(  case "$cmd" in
      "") COMPREPLY=($(compgen -W ")",
                                    Words(CommandNames(app)), " ", Words(global), R"(" -- "$cur"));;
)",
                                    cases, R"(  esac
}
)");
  if (shell == "zsh") {
    return absl::StrCat(R"(autoload -U +X bashcompinit && bashcompinit
)",
                        script, "complete -o default -F _ftctl ftctl\n");
  }
  return absl::StrCat(script, "complete -o default -F _ftctl ftctl\n");
}

}  // namespace ftd::client
