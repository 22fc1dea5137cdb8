#!/usr/bin/env bash
# Streaming on the device: 1,000,000-image files (testfull tiled 100 times) in every layout
# tools/make_big.py writes (float32 and uint8 contiguous, big-endian, gzip 1/6,
# shuffle, lzf, fletcher32, chunks cutting images, and hdf5plugin's Blosc, Blosc2, Zstd, LZ4 and
# Bitshuffle: hdf5plugin on the path): `cnninfer bench --stream` on four of them (the run beside
# the raw parallel read, the GPU alone and --decode gpu where it applies), 3 fresh `cnninfer run`s
# of each (images/s, reader, peak RSS; the deflate, LZF, Zstd and Blosc lz4 ones also with --decode gpu), and every run's 1M
# predictions against the contiguous file's.
# Usage:  . .device/setup.sh && bash tools/device_stream.sh   (logs in $OUT, or ./device-out)
set -uo pipefail
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
runs = [(name, "host") for name in layouts] + [(name, "gpu") for name in ("big_gz1", "big_gz6", "big_shuf_gz1", "big_shuf_gz6", "big_lzf",
                                                   "big_shuf_lzf", "big_blosc_lz4", "big_zstd", "big_shuf_zstd")]
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
