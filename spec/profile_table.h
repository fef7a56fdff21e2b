// A PROFILE job's per-op table as text, shared by `ftctl profile` and `ftd-worker profile`.
#pragma once

#include <string>

#include "ftd/v1/job_spec.pb.h"

namespace ftd::spec {

// The `top` largest rows (0: all), per phase, then the time per step by category.
std::string ProfileTable(const ftd::v1::ProfileReport& p, int top);

}  // namespace ftd::spec
