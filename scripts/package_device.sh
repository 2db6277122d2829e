#!/usr/bin/env bash
# Packages kernelsearch for a GPU machine that lacks our Debian libraries:
# dist/bin (kernelsearch, ks-worker, gpu test binaries), dist/lib (the ldd closure
# minus glibc, libstdc++, libgcc, libcuda and libnvrtc, which the target has),
# dist/share/kernelsearch (bridge, prompts, problems, export). Binaries find dist/lib by
# their RPATH ($ORIGIN/../lib) and NVRTC in /usr/local/cuda/lib64.
# Usage: scripts/package_device.sh [build-dir]   (writes ./dist, git-ignored)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dist=$root/dist
read -r -a targets <<< "${KS_PACKAGE_TARGETS:-kernelsearch ks-worker gpu_eval_test adversarial_test}"
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
rm -rf "$dist"
mkdir -p "$dist/bin" "$dist/lib" "$dist/share/kernelsearch"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -n1)
  [ -n "$f" ] || { echo "package: $t not built" >&2; exit 1; }
  cp "$f" "$dist/bin/"
  strip --strip-debug "$dist/bin/$t"
done
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnvrtc)'
for b in "$dist"/bin/*; do
  ldd "$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ ! $name =~ $skip ]] && [ ! -e "$dist/lib/$name" ]; then
      cp -L "$path" "$dist/lib/$name"
    fi
  done
done
strip --strip-unneeded "$dist"/lib/* 2>/dev/null || true
# The bridge's Python only (its C++ client lives beside it in the source tree), as `install` does.
(cd "$root/evaluator" && find reference -name '*.py' -print0 | xargs -0 cp --parents -t "$dist/share/kernelsearch")
cp -r "$root/prompts" "$root/problems" "$root/export" "$dist/share/kernelsearch/"
find "$dist" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$dist"
