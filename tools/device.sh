#!/usr/bin/env bash
# The maintainers' device measurements, one job a call, logs under $OUT (or ./device-out). On a GPU
# machine, in the project's root after staging (bash ../shared/device/stage.sh makes .device/):
#     . .device/setup.sh && bash tools/device.sh JOB [ARGS]
# JOB: run, ncu [ALGO], unroll, geometry [--no-torch-compile], stream, scale [cpu], multi-stream,
# serve DIR [BENCH ARGS]
# (tools/README.md says what each measures; the per-kernel profile of one algorithm on a random
# geometry is tools/device_profile.py).
set -uo pipefail

# run: One device call: gpu tests, the run matrix (algorithms x tile widths x streams), --profile,
# `cnninfer bench`, and the fused kernel's SASS mix. Logs go to $OUT (or ./device-out).
job_run() {
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
python3 -c "import json,sys; from infer.bench import gpu as bench; print('\n'.join(bench.table(json.load(open(sys.argv[1])))))" "$out/bench.json" \
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
}

# ncu: ncu on the fused kernels of --conv-algo ${1:-auto} (one launch each, warm-ups skipped) and where a cold
job_ncu() {
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
}

# unroll: The classic pipeline on ECE408: bench rows for every GEMM and tile, per-kernel times on one stream,
# ncu on one chunk of the wgmma pipeline's kernels (unroll_kernel3 and gemm_kernel4: conv1, conv2,
job_unroll() {
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
}

# geometry: Every geometry of issue 10 (and more) through `cnninfer bench`: each algorithm against PyTorch eager
# and torch.compile + CUDA graphs, on random He-initialized weights and images.
job_geometry() {
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
}

# stream: Streaming on the device: 1,000,000-image files (testfull tiled 100 times) in every layout
# tools/make_big.py writes (float32 and uint8 contiguous, big-endian, gzip 1/6,
# shuffle, lzf, fletcher32, chunks cutting images, and hdf5plugin's Blosc, Blosc2, Zstd, LZ4 and
# Bitshuffle: hdf5plugin on the path): `cnninfer bench --stream` on four of them (the run beside
# the raw parallel read, the GPU alone and --decode gpu where it applies), 3 fresh `cnninfer run`s
# of each (images/s, reader, peak RSS; the deflate, LZF, Zstd and Blosc lz4 ones also with --decode gpu), and every run's 1M
# predictions against the contiguous file's.
job_stream() {
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=/tmp/cnninfer-cache
layouts="big big_u8 big_be $(python3 -c 'import sys; sys.path.insert(0, "tools"); import make_big; print(" ".join("big_" + k for k in make_big.LAYOUTS))')"
python3 tools/make_big.py "$data" /tmp $layouts 2>&1 | tee "$out/files.txt"
for f in big big_u8 big_gz1 big_shuf_gz1; do
  cnninfer bench --stream /tmp/$f.hdf5 "$data/model.hdf5" 2>&1 | tee "$out/stream-$f.txt"
done
python3 - "$data" $layouts <<'PY' 2>&1 | tee "$out/stream-runs.txt"
import json, subprocess, sys, numpy as np
data, layouts = sys.argv[1], sys.argv[2:]
runs = [(name, "host") for name in layouts] + [(name, "gpu") for name in ("big_gz1", "big_gz6", "big_shuf_gz1", "big_shuf_gz6", "big_shuf_gz6_1024", "big_lzf",
                                                   "big_shuf_lzf", "big_blosc_lz4", "big_blosc_lz4_1024", "big_zstd", "big_shuf_zstd",
                                                   "big_lz4", "big_lz4_64k", "big_bshuf_lz4", "big_blosc2_lz4_1024",
                                                   "big_blosc_lz4_cut", "big_blosc_zstd_cut", "big_blosc_default",
                                                   "big_gz1_f32", "big_lzf_f32")]
for name, decode in runs:
    for i in range(3):
        r = subprocess.run(["/usr/bin/time", "-f", "%M", "cnninfer", "run", f"/tmp/{name}.hdf5", f"{data}/model.hdf5",
                            "--json", "-q", "--decode", decode, "--predictions", f"/tmp/p_{name}_{decode}.npy"],
                           capture_output=True, text=True)
        if r.returncode:
            print(name, "failed:", r.stderr.strip()); break
        d, t = json.loads(r.stdout), json.loads(r.stdout)["timing_ms"]
        print(f"{name}: correct {d['correct']}, {d['n'] / t['forward'] * 1e3 / 1e6:.2f}M images/s, reader {d['reader']}, "
              f"busy {t.get('read', 0):.0f} ms, waited {t.get('wait', 0):.0f} ms, peak RSS {int(r.stderr.split()[-1]) / 1024:.0f} MB")
ref = np.load("/tmp/p_big_host.npy")
for name, decode in runs:
    p = np.load(f"/tmp/p_{name}_{decode}.npy")
    print(f"{name} --decode {decode}: {int((p == ref).sum())} of {len(ref)} predictions equal the float32 contiguous file's")
PY
}

# scale: Scale on the device: a 1,000,000-image file (testfull tiled 100 times, 3.1 GB, in /tmp) through
# `cnninfer run` on the cuda and cpu backends (images/s, peak RSS, reading vs computing), and the
job_scale() {
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=/tmp/cnninfer-cache
python3 tools/make_big.py "$data" /tmp big
measure() {  # label, then the cnninfer arguments; prints images/s, RSS and the timing split
  python3 - "$@" <<'PY'
import json, resource, subprocess, sys
label, args = sys.argv[1], sys.argv[2:]
r = subprocess.run(["cnninfer", "run", *args, "--json", "-q"], capture_output=True, text=True)
if r.returncode:
    print(label, "failed:", r.stderr.strip()); sys.exit()
d = json.loads(r.stdout); t = d["timing_ms"]
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
read = f", reading {t['read']:.0f} ms ({100 * t['read'] / t['forward']:.0f}% of forward), compute waited {t['wait']:.0f} ms" if "read" in t else ""
print(f"{label}: {d['n']} images, correct {d['correct']}, forward {t['forward']:.0f} ms = {d['n'] / t['forward'] * 1e3:,.0f} images/s, "
      f"peak RSS {rss:.0f} MB, streamed {d['streamed']}{read}; {d['device']}")
PY
}
gpus=$(nvidia-smi -L | wc -l)
{
  measure "cuda 1M" /tmp/big.hdf5 "$data/model.hdf5" --backend cuda
  measure "cuda 1M again (page cache warm)" /tmp/big.hdf5 "$data/model.hdf5" --backend cuda
  if [ "$gpus" -gt 1 ]; then
    measure "cuda 1M, all $gpus GPUs" /tmp/big.hdf5 "$data/model.hdf5" --backend cuda --devices all
    for dev in 0 all; do
      for i in 1 2 3; do measure "cuda 160k in memory, devices $dev" /tmp/big.hdf5 "$data/model.hdf5" 160000 --backend cuda --devices $dev; done
    done
    cnninfer run /tmp/big.hdf5 "$data/model.hdf5" 160000 --devices 0 -q --predictions /tmp/p1.npy >/dev/null
    cnninfer run /tmp/big.hdf5 "$data/model.hdf5" 160000 --devices all -q --predictions /tmp/p2.npy >/dev/null
    python3 -c "import numpy as np; a, b = np.load('/tmp/p1.npy'), np.load('/tmp/p2.npy'); print('predictions 1 GPU vs all:', 'identical' if (a == b).all() else f'{(a != b).sum()} differ')"
  fi
  if [ "${1:-}" = cpu ]; then measure "cpu 1M" /tmp/big.hdf5 "$data/model.hdf5" --backend cpu; fi
} 2>&1 | tee "$out/scale.txt"
}

# multi-stream: Several GPUs on a streamed file (nvidia-h200-x2): the 1,000,000-image float32, uint8 and compressed
# (gzip 1, shuffle + gzip 1, Zstd, shuffle + Zstd, lzf: decoded on the GPUs) files through `cnninfer
# run` on GPU 0, on all GPUs, and on GPU 0 for half the file (what a perfect split would give each
# GPU: 3 runs), 5 runs each (images/s, peak RSS), the speed-up of the medians, and
# the predictions of both compared; then float32 and uint8 in one warm process (a process keeps the
job_multi_stream() {
out="${OUT:-device-out}"; mkdir -p "$out"
export CNNINFER_CACHE=/tmp/cnninfer-cache
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$out/gpus.txt"
python3 tools/make_big.py "$CNNINFER_DATA" /tmp big big_u8 big_gz1 big_shuf_gz1 big_zstd big_shuf_zstd big_lzf
python3 - "$CNNINFER_DATA" <<'PY' 2>&1 | tee "$out/multi-stream.txt"
import json, resource, statistics, subprocess, sys
import numpy as np
model = f"{sys.argv[1]}/model.hdf5"
for name in ("big", "big_u8", "big_gz1", "big_shuf_gz1", "big_zstd", "big_shuf_zstd", "big_lzf"):
    medians = {}
    for devices in ("0", "all", "half"):  # half: GPU 0 alone on the first 500,000 images, a perfect split's share
        rates = []
        for i in range(3 if devices == "half" else 5):
            p = f"/tmp/p_{name}_{devices}.npy"
            count = ["500000"] if devices == "half" else []
            r = subprocess.run(["cnninfer", "run", f"/tmp/{name}.hdf5", model, *count, "--devices",
                                "0" if devices == "half" else devices, "--json", "-q", "--predictions", p],
                               capture_output=True, text=True)
            if r.returncode:
                print(name, devices, "failed:", r.stderr.strip()); break
            d = json.loads(r.stdout); t = d["timing_ms"]
            rates.append(d["n"] / t["forward"] * 1e3)
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            print(f"{name} --devices {devices}: forward {t['forward']:.0f} ms = {rates[-1]:,.0f} images/s, correct {d['correct']}, "
                  f"reader {d['reader']}, busy {t['read']:.0f} ms, waited {t['wait']:.0f} ms, peak RSS so far {rss:.0f} MB; {d['device'][:60]}")
        medians[devices] = statistics.median(rates) if rates else float("nan")
    same = (np.load(f"/tmp/p_{name}_0.npy") == np.load(f"/tmp/p_{name}_all.npy")).sum()
    print(f"{name}: all GPUs / one GPU = {medians['all'] / medians['0']:.2f}x (medians of 5; one GPU on half the file "
          f"as fast as alone, 3 runs, would give {2 * medians['half'] / medians['0']:.2f}x); predictions identical: {same} of 1000000")
# In one warm process: a first run, then 5 more (medians of those 5); per GPU, when its first block
# came in and when it finished
import os, threading, time
os.environ["CNNINFER_HOST_BUDGET_MB"] = "0"
import infer
from infer.data import host as S
from infer.gpu import backend as B
marks, local = [], threading.local()
orig_stream, orig_iter = B.CudaBackend.stream, S.Ring.__iter__
def timed_stream(self, *a):
    local.t0, local.first = time.perf_counter(), None
    r = orig_stream(self, *a)
    marks.append((self.gpu.ordinal, local.first - local.t0, time.perf_counter() - local.t0))
    return r
def first_block(self):
    for item in orig_iter(self):
        local.first = local.first or time.perf_counter()
        yield item
B.CudaBackend.stream, S.Ring.__iter__ = timed_stream, first_block
for name in ("big", "big_u8"):
    medians = {}
    for devices in ([0], "all"):
        with infer.Session(model, devices=devices) as s:
            runs = []
            for i in range(6):
                marks.clear()
                runs.append(s.evaluate(f"/tmp/{name}.hdf5").timing["forward"])
            medians[str(devices)] = statistics.median(runs[1:])
            gpus = "; ".join(f"GPU {g}: first block in at {a * 1e3:.1f} ms, done at {b * 1e3:.1f} ms" for g, a, b in sorted(marks))
            print(f"{name} warm {devices}: first run {runs[0]:.1f} ms, then {', '.join(f'{t:.1f}' for t in runs[1:])} ms "
                  f"(median {medians[str(devices)]:.1f} = {1e6 / medians[str(devices)] * 1e3:,.0f} images/s); last run {gpus}")
    print(f"{name} warm: all GPUs / one GPU = {medians['[0]'] / medians['all']:.2f}x (medians of 5)")
PY
}

# serve DIR [ARGS]: `cnninfer bench --serve` on the staged testfull and model (ARGS added: --soak S,
# --seconds, --clients...). The device has neither wrk, h2load nor the serve extra: DIR holds the
# serve extra's wheels for CPython 3.12 (and litserve's, for its rows) and Debian's wrk, libluajit
# and nghttp2-client packages unpacked there (dpkg-deb -x), all carried (tools/README.md).
job_serve() {
out="${OUT:-device-out}"; mkdir -p "$out"
dir="$(cd "${1:?usage: bash tools/device.sh serve DIR [ARGS]}" && pwd)"; shift
if compgen -G "$dir/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$dir"/*.whl 2>&1 | grep -v WARNING
fi
export PATH="$dir/usr/bin:$PATH" LD_LIBRARY_PATH="$dir/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cnninfer bench --serve "$CNNINFER_DATA/testfull.hdf5" "$CNNINFER_DATA/model.hdf5" "$@" 2>&1 | tee "$out/serve.txt"
}

job="${1:-}"
[ -n "$job" ] && shift
case "$job" in
  run|ncu|unroll|geometry|stream|scale|multi-stream|serve) "job_${job//-/_}" "$@" ;;
  *) echo "usage: bash tools/device.sh run|ncu|unroll|geometry|stream|scale|multi-stream|serve [ARGS]" >&2; exit 2 ;;
esac
