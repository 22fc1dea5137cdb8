#!/usr/bin/env bash
# ncu on the fused kernels of --conv-algo ${1:-auto} (one launch each, warm-ups skipped) and where a cold
# process's start-up goes. Usage on the device:  . .device/setup.sh && bash tools/device_ncu.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=/tmp/cnninfer-cache
algo="${1:-auto}"
cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" --streams 1 --chunk 10000 --conv-algo "$algo" >/dev/null  # fill the cache
ncu --clock-control none -k regex:'fused_kernel|fc_kernel' --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
  cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" --streams 1 --chunk 10000 --conv-algo "$algo" > "$out/ncu.txt" 2>&1
grep -E "fused_kernel|fc_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|L1/TEX Hit|L2 Hit|Stall|Bank" "$out/ncu.txt" | head -70
python3 -X importtime -c "import infer.cli" 2> "$out/importtime.txt"; sort -t'|' -k2 -n "$out/importtime.txt" | tail -12
python3 - <<'PY'
import time
t = time.perf_counter(); import infer.cli; t1 = time.perf_counter()
import pycuda.driver as d; t2 = time.perf_counter()
d.init(); t3 = time.perf_counter()
c = d.Device(0).retain_primary_context(); c.push(); t4 = time.perf_counter()
c.pop(); c.detach()
print(f"import infer.cli {t1-t:.3f} s, import pycuda.driver {t2-t1:.3f} s, cuInit {t3-t2:.3f} s, primary context {t4-t3:.3f} s")
PY
