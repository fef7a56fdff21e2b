// ftctl's command-line conveniences that CLI11 does not provide: "did you mean" for a mistyped
// command or flag, and shell completion scripts generated from the commands and flags defined.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace ftd::client {

// The candidate closest to `typed` by edit distance, if close enough to be a typo (at most 2 edits,
// or a third of its length); "" otherwise.
std::string ClosestMatch(const std::string& typed, const std::vector<std::string>& candidates);

// After a failed parse of `args` (argv without the program name): a hint naming the unknown command
// or flag and what was probably meant ("unknown command \"lsit\"; did you mean \"list\"?"), or "".
std::string DidYouMean(const CLI::App& app, const std::vector<std::string>& args);

// A completion script for `shell` ("bash" or "zsh") covering `app`'s commands and their flags.
std::string CompletionScript(const CLI::App& app, const std::string& shell);

}  // namespace ftd::client
