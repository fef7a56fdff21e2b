// Sizes as people read them, one rule for every message of ftd, ftd-worker and ftctl: "812 B",
// "3.2 KiB", "512 KiB", "3.2 MiB", "640 MiB", "1.5 GiB", "48.0 GiB", "1.2 TiB". A tiny model's
// memory or checkpoint is never "0.0 GiB".
#pragma once

#include <string>

namespace ftd::spec {

// KiB and MiB with one decimal below 10, none above; GiB and TiB with one decimal.
std::string FormatBytes(double bytes);

}  // namespace ftd::spec
