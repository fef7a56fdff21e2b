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
    if (o->check_name(flag)) return o->get_expected_max() != 0;  // a flag expects no value
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
      desc, kOneOfName);
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

// What completes the value of `o`: its OneOf choices ("table json yaml"), "@file" for a FILE, else
// "@none" (a free value: nothing is offered, never the flags).
std::string ValueWords(CLI::Option* o) {
  for (int i = 0;; ++i) {
    CLI::Validator* v = nullptr;
    try {
      v = o->get_validator(i);
    } catch (const CLI::OptionNotFound&) {
      break;
    }
    if (v->get_name() == kOneOfName) return absl::StrJoin(absl::StrSplit(v->get_description(), '|'), " ");
  }
  if (absl::StartsWith(o->get_type_name(), "FILE")) return "@file";
  return "@none";
}

// Single-quoted for the shell.
std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The tables of the completion function for the command at `path` ("ftctl", "ftctl admin token"):
// its subcommands, its flags, the values of its value flags and of its positional argument.
void Tables(CLI::App& cmd, const std::string& path, std::string* out) {
  std::vector<std::string> subs, flags;
  for (CLI::App* sub : cmd.get_subcommands([](CLI::App*) { return true; })) subs.push_back(sub->get_name());
  std::string positional;
  for (CLI::Option* o : cmd.get_options([](CLI::Option*) { return true; })) {
    if (o->get_positional() && o->get_lnames().empty() && o->get_snames().empty()) {
      if (positional.empty()) positional = ValueWords(o);
      continue;
    }
    const bool value = o->get_expected_max() != 0;  // a flag expects no value
    for (const auto& l : o->get_lnames()) {
      flags.push_back("--" + l);
      if (value) absl::StrAppend(out, "  values[", Q(path + " --" + l), "]=", Q(ValueWords(o)), "\n");
    }
    for (const auto& sn : o->get_snames()) {
      flags.push_back("-" + sn);
      if (value) absl::StrAppend(out, "  values[", Q(path + " -" + sn), "]=", Q(ValueWords(o)), "\n");
    }
  }
  absl::StrAppend(out, "  subs[", Q(path), "]=", Q(Words(subs)), "\n  flags[", Q(path), "]=", Q(Words(flags)), "\n");
  if (!positional.empty()) absl::StrAppend(out, "  positionals[", Q(path), "]=", Q(positional), "\n");
  for (CLI::App* sub : cmd.get_subcommands([](CLI::App*) { return true; })) {
    Tables(*sub, absl::StrCat(path, " ", sub->get_name()), out);
  }
}

}  // namespace

std::string CompletionScript(CLI::App& app, const std::string& shell) {
  std::string tables;
  Tables(app, "ftctl", &tables);
  // The words before the cursor are walked from the command down its subcommands; a value flag
  // takes the next word (or its own after "="). The cursor's word then completes as the value of
  // the flag before it, as a flag (of the command or a global one), as a subcommand, or as the
  // command's positional (a choice or a file).
  return absl::StrCat(R"(# ftctl completion for )", shell, R"(: generated by `ftctl completion )", shell, R"(`.
)",
                      shell == "zsh" ? "autoload -U +X bashcompinit && bashcompinit\n" : "", R"(_ftctl() {
  [[ -n ${ZSH_VERSION-} ]] && setopt localoptions ksharrays
  local cur=${COMP_WORDS[COMP_CWORD]} path=ftctl word i flag="" v=""
  local -A subs flags values positionals
)",
                      tables, R"(  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${COMP_WORDS[i]}
    if [[ -n $flag ]]; then flag=""; continue; fi
    case $word in
      -*=*) continue;;
      -*)
        if [[ -n ${values["$path $word"]+x} || -n ${values["ftctl $word"]+x} ]]; then flag=$word; fi
        continue;;
    esac
    if [[ " ${subs[$path]-} " == *" $word "* ]]; then path="$path $word"; fi
  done
  COMPREPLY=()
  if [[ -n $flag ]]; then
    v=${values["$path $flag"]-${values["ftctl $flag"]-}}
  elif [[ $cur == -*=* ]]; then
    return 0
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "${flags[$path]-} ${flags[ftctl]}" -- "$cur"))
    return 0
  elif [[ -n ${subs[$path]-} ]]; then
    v=${subs[$path]}
  else
    v=${positionals[$path]-}
  fi
  case $v in
    @file) COMPREPLY=($(compgen -f -- "$cur"));;
    @none|"") ;;
    *) COMPREPLY=($(compgen -W "$v" -- "$cur"));;
  esac
  return 0
}
complete -F _ftctl ftctl
)");
}

}  // namespace ftd::client
