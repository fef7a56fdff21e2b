// ftctl's command-line conveniences that CLI11 does not provide: "did you mean" for a mistyped
// command or flag, and shell completion scripts generated from the commands and flags defined.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace ftd::client {

// After a failed parse of `args` (argv without the program name): a hint naming the unknown command
// or flag and what was probably meant ("unknown command \"lsit\"; did you mean \"list\"?"), or "".
std::string DidYouMean(const CLI::App& app, const std::vector<std::string>& args);

// Checks for flag values whose refusals name the value and what is allowed (CLI11's own print
// "Value -1 not in range 0.000000 to 1797693134862315708145274237317043567980...", or "Check jsn
// value in {json->1,table->0,yaml->2} OR {1,0,2} FAILED"). CLI11 puts the flag's name in front.
// A whole number >= `min`: "must be a whole number >= 0 (got \"-1\")".
CLI::Validator WholeNumberAtLeast(int64_t min);
// A number > 0: "must be a number > 0 (got \"0\")".
CLI::Validator PositiveNumber();
// One of `choices`, any case, changed into its index (for an enum option) when `to_index`:
// "must be one of table, json, yaml (got \"jsn\")".
CLI::Validator OneOf(std::vector<std::string> choices, bool to_index = false);

// A failed parse in one line that says where help is: "--limit: must be a whole number >= 0 (got
// \"-1\"); ftctl list --help lists the flags" (Usage adds the leading "ftctl: ").
std::string UsageError(const CLI::App& app, const CLI::ParseError& e);

// The name of OneOf's validators: shell completion offers their choices.
inline constexpr const char* kOneOfName = "one-of";

// A completion script for `shell` ("bash" or "zsh", through zsh's bashcompinit) made from `app`'s
// definition: the commands and subcommands, their flags, the choices of a flag's value (OneOf) or
// file names (an option whose type name is FILE), never flag names where a value is expected.
std::string CompletionScript(CLI::App& app, const std::string& shell);

}  // namespace ftd::client
