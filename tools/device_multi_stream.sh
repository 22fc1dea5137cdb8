#!/usr/bin/env bash
# Several GPUs on a streamed file (nvidia-h200-x2): the 1,000,000-image float32 and uint8 files
# through `cnninfer run` on GPU 0 and on all GPUs, 3 runs each (images/s, peak RSS), the speed-up
# of the medians, and the predictions of both compared. Usage:  . .device/setup.sh && bash tools/device_multi_stream.sh
set -uo pipefail
out="${OUT:-device-out}"; mkdir -p "$out"
export CNNINFER_CACHE=/tmp/cnninfer-cache
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$out/gpus.txt"
python3 tools/make_big.py "$CNNINFER_DATA" /tmp big big_u8
python3 - "$CNNINFER_DATA" <<'PY' 2>&1 | tee "$out/multi-stream.txt"
import json, resource, statistics, subprocess, sys
import numpy as np
model = f"{sys.argv[1]}/model.hdf5"
for name in ("big", "big_u8"):
    medians = {}
    for devices in ("0", "all"):
        rates = []
        for i in range(3):
            p = f"/tmp/p_{name}_{devices}.npy"
            r = subprocess.run(["cnninfer", "run", f"/tmp/{name}.hdf5", model, "--devices", devices, "--json", "-q",
                                "--predictions", p], capture_output=True, text=True)
            if r.returncode:
                print(name, devices, "failed:", r.stderr.strip()); break
            d = json.loads(r.stdout); t = d["timing_ms"]
            rates.append(d["n"] / t["forward"] * 1e3)
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            print(f"{name} --devices {devices}: forward {t['forward']:.0f} ms = {rates[-1]:,.0f} images/s, correct {d['correct']}, "
                  f"reader {d['reader']}, busy {t['read']:.0f} ms, waited {t['wait']:.0f} ms, peak RSS so far {rss:.0f} MB; {d['device'][:60]}")
        medians[devices] = statistics.median(rates) if rates else float("nan")
    same = (np.load(f"/tmp/p_{name}_0.npy") == np.load(f"/tmp/p_{name}_all.npy")).sum()
    print(f"{name}: all GPUs / one GPU = {medians['all'] / medians['0']:.2f}x (medians of 3); predictions identical: {same} of 1000000")
for readers in (12, 16):
    for i in range(3):
        r = subprocess.run(["cnninfer", "run", "/tmp/big.hdf5", model, "--devices", "all", "--readers", str(readers), "--json", "-q"],
                           capture_output=True, text=True)
        d = json.loads(r.stdout); t = d["timing_ms"]
        print(f"big --devices all --readers {readers}: forward {t['forward']:.0f} ms = {d['n'] / t['forward'] * 1e3:,.0f} images/s, busy {t['read']:.0f} ms")
PY
