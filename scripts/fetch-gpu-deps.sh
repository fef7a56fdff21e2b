#!/usr/bin/env bash
# On the development machine: downloads the Debian packages a GPU machine (Ubuntu 24.04 with CUDA
# and torch, no gRPC/Abseil/...) lacks into .devdeps/ (git-ignored), with an install.sh that unpacks
# them there without overwriting anything. The list is the shared device kit's plus what ftd adds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kit=${FTD_DEVICE_KIT:-$root/../shared/device}
cd "$root"
bash "$kit/fetch-debs.sh"
(cd .devdeps/debs && apt-get download -qq nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 libyaml-cpp-dev libyaml-cpp0.7 libgloo-dev >/dev/null)
echo "plus nlohmann-json3-dev, libcli11-dev, libpcre2-dev, libyaml-cpp-dev and libgloo-dev: $(ls .devdeps/debs | wc -l) packages"
