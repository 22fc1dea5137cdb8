#!/usr/bin/env bash
# One device call: gpu tests, the run matrix (algorithms x tile widths x streams), --profile,
# `cnninfer bench`, and the fused kernel's SASS mix. Logs go to $OUT (or ./device-out).
# Usage on the device:  . .device/setup.sh && bash tools/device_run.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE="${CNNINFER_CACHE:-/tmp/cnninfer-cache}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$out/gpu.txt"
cnninfer info | tee -a "$out/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/gpu-tests.log" | tail -30
{
  for algo in fused-wgmma implicit-wgmma fused-tc unroll; do
    for tw in 8 16 32; do
      [ "$algo" != unroll ] && [ "$tw" != 16 ] && continue
      for s in 1 2 4 8; do
        printf '%-14s tile %-2s streams %s: ' "$algo" "$tw" "$s"
        cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" 10000 --backend cuda --conv-algo "$algo" \
          --tile-width "$tw" --streams "$s" | tail -1
      done
    done
  done
} 2>&1 | tee "$out/runs.log"
for algo in fused-wgmma implicit-wgmma unroll; do
  cnninfer run "$data/testfull.hdf5" "$data/model.hdf5" 10000 --backend cuda --conv-algo "$algo" --profile
done 2>&1 | tee "$out/profile.log"
cnninfer bench "$data/testfull.hdf5" "$data/model.hdf5" --json > "$out/bench.json" 2> "$out/bench.err"
python3 -c "import json,sys; from infer import bench; print('\n'.join(bench.table(json.load(open(sys.argv[1])))))" "$out/bench.json" \
  | tee "$out/bench.txt" || cat "$out/bench.err"
cubin=$(for c in "$CNNINFER_CACHE"/kernels/fused-*.cubin; do  # the one holding fused-wgmma's kernel
  cuobjdump --dump-sass "$c" | grep -q "Function : fused_kernel3" && echo "$c"; done | head -1)
cuobjdump --dump-sass "$cubin" | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z][A-Z0-9.]*' | awk '{print $2}' | sort | uniq -c | sort -rn | head -15 | tee "$out/fused-sass.txt"
# A whole cold process with the kernels already in the disk cache: wall time and peak RSS.
python3 - "$data" <<'PY' | tee "$out/cold.txt"
import resource, subprocess, sys, time
for i in range(3):
    t = time.perf_counter()
    r = subprocess.run(["cnninfer", "run", f"{sys.argv[1]}/testfull.hdf5", f"{sys.argv[1]}/model.hdf5", "10000", "--json"],
                       capture_output=True, text=True)
    print(f"cold process {i}: {time.perf_counter() - t:.3f} s wall, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB (max so far), {r.stdout.strip()[:400]}")
t = time.perf_counter()
subprocess.run([sys.executable, "-c", "import infer.cli, pycuda.driver as d; d.init()"])
print(f"imports + cuInit alone: {time.perf_counter() - t:.3f} s")
PY
