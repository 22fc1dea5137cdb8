"""On the device: the Python API's first and second call against the command line's cold process,
10,000 testfull images on the GPU. Usage:  . .device/setup.sh && python3 tools/device_api.py"""
import os
import subprocess
import sys
import time

data = os.environ["CNNINFER_DATA"]
t = time.perf_counter()
r = subprocess.run(["cnninfer", "run", f"{data}/testfull.hdf5", f"{data}/model.hdf5"], capture_output=True, text=True)
print(f"cold `cnninfer run` process: {time.perf_counter() - t:.3f} s wall; {r.stdout.strip().splitlines()[-1]}")
t0 = time.perf_counter()
import h5py  # noqa: E402

import cnninfer  # noqa: E402

with h5py.File(f"{data}/testfull.hdf5") as f:
    x = f["x"][()]
print(f"in-process: import cnninfer + h5py read {time.perf_counter() - t0:.3f} s")
with cnninfer.Session(f"{data}/model.hdf5") as s:
    for i in range(5):
        t = time.perf_counter()
        labels = s.predict(x)
        print(f"predict call {i + 1}: {(time.perf_counter() - t) * 1e3:.2f} ms, {int((labels == 0).sum())} zeros; "
              f"{s.backend.device}")
    x8 = (x * 255).round().astype("uint8")
    for i in range(3):
        t = time.perf_counter()
        s.predict(x8)
        print(f"predict uint8 call {i + 1}: {(time.perf_counter() - t) * 1e3:.2f} ms")
    for i in range(3):
        t = time.perf_counter()
        res = s.evaluate(f"{data}/testfull.hdf5")
        print(f"evaluate call {i + 1}: {(time.perf_counter() - t) * 1e3:.2f} ms wall, forward {res.timing['forward']:.2f} ms, "
              f"accuracy {res.accuracy}")
sys.exit(0)
