#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds kernelsearch into ./build.
#  - installs the Debian packages the build and the tests need (apt-get; sudo
#    when not root);
#  - expects the CUDA toolkit (13.0) at /usr/local/cuda or $CUDA_HOME: it is not
#    a Debian package (NVRTC and the CUDA headers come from it; no GPU needed);
#  - configures with CMake + Ninja and builds everything.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev nlohmann-json3-dev libcurl4-openssl-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libfmt-dev libcpp-httplib-dev
  python3 python3-torch python3-numpy
  python3-pytest  # tests/export: the exported module's Python, tested as Python
  chromium  # the report test loads `kernelsearch report` pages in headless Chromium
  slurmctld slurmd slurm-client munge  # the Slurm test starts a one-node cluster on loopback (issue 13)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ] && [ ! -e "$cuda/include/nvrtc.h" ]; then
  echo "setup: the CUDA toolkit is not at $cuda (set CUDA_HOME); kernelsearch needs its NVRTC and headers" >&2
  exit 1
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda"
cmake --build build -j"$(nproc)"
