#!/usr/bin/env bash
# The classic pipeline on ECE408: bench rows for every GEMM and tile, per-kernel times on one stream,
# ncu on one chunk of the wgmma pipeline's kernels (unroll_kernel3 and gemm_kernel4: conv1, conv2,
# fc1, fc2) and of the 3xTF32 GEMM. Usage: . .device/setup.sh && bash tools/device_unroll.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=${CNNINFER_CACHE:-/tmp/cnninfer-cache}
cnninfer bench "$data/testfull.hdf5" "$data/model.hdf5" 10000 --no-torch-compile | tee "$out/bench_unroll.txt"
python3 tools/device_profile.py 28x28x1,5:32,5:64,128 10000 unroll | tee "$out/profile_unroll.txt"
metrics=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum.per_second
for gemm in wgmma tf32x3; do
  # The last of 5 chunks (images 8192-9999), after the warm-up's launches: the kernels of its two convs and two fcs.
  CNNINFER_GRAPHS=0 ncu --clock-control none -k regex:'gemm_kernel|unroll_kernel' --launch-skip 24 --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --metrics "$metrics" \
    cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" --streams 1 --conv-algo unroll --gemm-algo $gemm > "$out/ncu_$gemm.txt" 2>&1
  grep -E "^  [a-z_0-9]+kernel|Grid Size|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|gmma|hmma|dram__" "$out/ncu_$gemm.txt" | head -80
done
