#!/usr/bin/env bash
# Several GPUs on a streamed file (nvidia-h200-x2): the 1,000,000-image float32, uint8 and compressed
# (gzip 1, shuffle + gzip 1, Zstd, shuffle + Zstd, lzf: decoded on the GPUs) files through `cnninfer
# run` on GPU 0, on all GPUs, and on GPU 0 for half the file (what a perfect split would give each
# GPU: 3 runs), 5 runs each (images/s, peak RSS), the speed-up of the medians, and
# the predictions of both compared; then float32 and uint8 in one warm process (a process keeps the
# hardware queues of its first run: compressed files there would decode with float32's 8). Usage:  . .device/setup.sh && bash tools/device_multi_stream.sh
set -uo pipefail
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
from infer import host as S
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
