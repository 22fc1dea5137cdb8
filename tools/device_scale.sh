#!/usr/bin/env bash
# Scale on the device: a 1,000,000-image file (testfull tiled 100 times, 3.1 GB, in /tmp) through
# `cnninfer run` on the cuda and cpu backends (images/s, peak RSS, reading vs computing), and the
# split over every GPU against one. Usage:  . .device/setup.sh && bash tools/device_scale.sh [cpu]
set -uo pipefail
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
