#!/usr/bin/env bash
# Every geometry of issue 10 (and more) through `cnninfer bench`: each algorithm against PyTorch eager
# and torch.compile + CUDA graphs, on random He-initialized weights and images.
# Usage:  . .device/setup.sh && bash tools/device_geometry.sh [--no-torch-compile]
set -uo pipefail
extra=("$@")
out="${OUT:-device-out}"; mkdir -p "$out"
export CNNINFER_CACHE=${CNNINFER_CACHE:-/tmp/cnninfer-cache}
{
  for case in "28x28x1,5:32,5:64,128 10000" "32x32x3,5:32,5:64,256 10000" "28x28x1,3:16,3:32,64 10000" \
              "28x28x1,5:64,5:128,256 10000" "64x64x1,5:32,5:64,128 2000" "29x31x3,7:12,3:20,50,7 10000" \
              "32x32x3,3:64,3:128,256 5000" "128x128x3,7:32,5:64,128 500" "96x96x3,5:32,5:64,256 1000"; do
    read -r spec count <<<"$case"
    echo "== $spec, $count images"
    cnninfer bench --random "$spec" "$count" "${extra[@]}" 2>&1 | tail -n +1
  done
} | tee "$out/geometry.txt"
