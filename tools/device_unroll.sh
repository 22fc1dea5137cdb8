#!/usr/bin/env bash
# The classic pipeline on ECE408: bench rows for every GEMM and tile, per-kernel times on one stream,
# ncu on the 3xTF32 GEMM and the implicit-GEMM conv kernel. Usage: . .device/setup.sh && bash tools/device_unroll.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=${CNNINFER_CACHE:-/tmp/cnninfer-cache}
cnninfer bench "$data/testfull.hdf5" "$data/model.hdf5" 10000 --no-torch-compile | tee "$out/bench_unroll.txt"
python3 tools/device_profile.py 28x28x1,5:32,5:64,128 10000 unroll | tee "$out/profile_unroll.txt"
for algo in unroll implicit-tc; do
  CNNINFER_GRAPHS=0 ncu --clock-control none -k regex:'gemm_kernel3|conv_kernel1' --launch-skip 4 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active \
    cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" --streams 1 --conv-algo $algo > "$out/ncu_$algo.txt" 2>&1
  grep -E "gemm_kernel3|conv_kernel1|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|hmma|pipe_fma|Issue Slots Busy|No Eligible" "$out/ncu_$algo.txt" | head -30
done
