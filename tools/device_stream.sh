#!/usr/bin/env bash
# Streaming on the device: 1,000,000-image files (testfull tiled 100 times) as float32 contiguous,
# uint8 contiguous and float32 gzip-chunked, each through `cnninfer bench --stream` (the run beside
# the raw parallel read and the GPU alone), the gzip file's rate against reader threads, peak RSS,
# and the predictions checked against testfull's. Usage:  . .device/setup.sh && bash tools/device_stream.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
data="$CNNINFER_DATA"
export CNNINFER_CACHE=/tmp/cnninfer-cache
python3 - "$data" <<'PY' 2>&1 | tee "$out/files.txt"
import sys, time, zlib, h5py, numpy as np
from concurrent.futures import ThreadPoolExecutor
t = time.perf_counter()
with h5py.File(f"{sys.argv[1]}/testfull.hdf5") as src:
    x, y = src["x"][()], src["y"][()]
u8 = np.rint(x * 255).astype(np.uint8)
for name, images in (("big", x), ("big_u8", u8)):
    with h5py.File(f"/tmp/{name}.hdf5", "w") as f:
        dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], images.dtype)
        dy = f.create_dataset("y", (100 * len(y), y.shape[1]), "f8")
        for i in range(100):
            dx[i * len(x):(i + 1) * len(x)] = images
            dy[i * len(y):(i + 1) * len(y)] = y
# gzip: 1000-image chunks; testfull's 10 distinct chunks compressed once (on threads), written 100 times
rows = 1000
with ThreadPoolExecutor(16) as pool:
    packed = list(pool.map(lambda j: zlib.compress(x[j * rows:(j + 1) * rows].tobytes(), 4), range(10)))
with h5py.File("/tmp/big_gz.hdf5", "w") as f:
    dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], "f4", chunks=(rows,) + x.shape[1:], compression="gzip")
    for i in range(1000):
        dx.id.write_direct_chunk((i * rows, 0, 0, 0), packed[i % 10])
    f.create_dataset("y", data=np.tile(y, (100, 1)))
    ratio = dx.id.get_storage_size() / (dx.size * 4)
print(f"wrote /tmp/big.hdf5, big_u8.hdf5, big_gz.hdf5 (1,000,000 images each; gzip at {ratio:.2f} of raw) in {time.perf_counter() - t:.1f} s")
PY
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
for i in range(2):
    run("float32 contiguous", "/tmp/big.hdf5", f"{data}/model.hdf5")
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
