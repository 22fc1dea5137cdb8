#!/usr/bin/env bash
# Streaming on the device: 1,000,000-image files (testfull tiled 100 times) as float32 contiguous,
# uint8 contiguous and float32 gzip-chunked, each through `cnninfer bench --stream` (the run beside
# the raw parallel read and the GPU alone), the gzip file's rate against reader threads, peak RSS,
# and the predictions checked against testfull's. Usage:  . .device/setup.sh && bash tools/device_stream.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=/tmp/cnninfer-cache
python3 tools/make_big.py "$data" /tmp 2>&1 | tee "$out/files.txt"
for f in big big_u8 big_gz; do
  cnninfer bench --stream /tmp/$f.hdf5 "$data/model.hdf5" 2>&1 | tee "$out/stream-$f.txt"
done
python3 - "$data" <<'PY' 2>&1 | tee "$out/stream-runs.txt"
import json, resource, subprocess, sys, numpy as np
data = sys.argv[1]
def run(label, *args):
    r = subprocess.run(["cnninfer", "run", *args, "--json", "-q"], capture_output=True, text=True, env=None)
    if r.returncode:
        print(label, "failed:", r.stderr.strip()); return None
    d = json.loads(r.stdout); t = d["timing_ms"]
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{label}: {d['n']} images, correct {d['correct']}, forward {t['forward']:.0f} ms = {d['n'] / t['forward'] * 1e3:,.0f} images/s, "
          f"reader {d['reader']}, busy {t.get('read', 0):.0f} ms, waited {t.get('wait', 0):.0f} ms, peak RSS so far {rss:.0f} MB")
    return d
for i in range(3):
    run("float32 contiguous", "/tmp/big.hdf5", f"{data}/model.hdf5")
for i in range(3):
    run("uint8 contiguous", "/tmp/big_u8.hdf5", f"{data}/model.hdf5")
for threads in (1, 2, 4, 8, 16):
    run(f"gzip float32, {threads} readers", "/tmp/big_gz.hdf5", f"{data}/model.hdf5", "--readers", str(threads))
# bit for bit: the streamed 1M predictions are testfull's, 100 times (float32 and uint8 files)
subprocess.run(["cnninfer", "run", "/tmp/big.hdf5", f"{data}/model.hdf5", "-q", "--predictions", "/tmp/p_big.npy"], check=True)
subprocess.run(["cnninfer", "run", f"{data}/testfull.hdf5", f"{data}/model.hdf5", "-q", "--backend", "cpu", "--predictions", "/tmp/p_ref.npy"], check=True)
subprocess.run(["cnninfer", "run", "/tmp/big_u8.hdf5", f"{data}/model.hdf5", "-q", "--predictions", "/tmp/p_u8.npy"], check=True)
subprocess.run(["cnninfer", "run", "/tmp/big_u8.hdf5", f"{data}/model.hdf5", "10000", "-q", "--backend", "cpu", "--predictions", "/tmp/p_u8ref.npy"], check=True)
big, ref, u8, u8ref = (np.load(f"/tmp/{n}.npy") for n in ("p_big", "p_ref", "p_u8", "p_u8ref"))
print("float32 1M vs CPU reference on testfull x100:", int((big == np.tile(ref, 100)).sum()), "of", len(big), "identical")
print("uint8 1M vs CPU (host conversion) on its first 10k x100:", int((u8 == np.tile(u8ref, 100)).sum()), "of", len(u8), "identical")
PY
