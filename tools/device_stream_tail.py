"""Where a streamed run's time goes, first run against later ones: fresh processes, 3 runs each on
one GPU, timing when the first and the last block came in, when the GPU was done (streams synced)
and when the outputs were in place; two arms alternated ABBA: the outputs' pages faulted in on a
reader thread during the run (the code as it is) and not (written fresh after the GPU, as before
stop 22). Usage (after tools/make_big.py):
    python3 tools/device_stream_tail.py "$CNNINFER_DATA/model.hdf5" /tmp/big_u8.hdf5 [PROCESSES]"""
import json
import statistics
import subprocess
import sys

CHILD = r'''
import json, os, sys, time
os.environ["CNNINFER_HOST_BUDGET_MB"] = "0"  # stream whatever the file's size
import infer
from infer import stream
from infer.gpu import backend
model, path, arm = sys.argv[1:4]
if arm == "fresh":
    backend._fault_in = lambda *arrays: None
marks = {}
iterate, run_stream, check = stream.Ring.__iter__, backend.CudaBackend.stream, backend.CudaBackend._check_flags

def blocks(self):
    for item in iterate(self):
        marks.setdefault("first", time.perf_counter())
        marks["last"] = time.perf_counter()
        yield item

def timed_stream(self, *args):
    marks["start"] = time.perf_counter()
    out = run_stream(self, *args)
    marks["end"] = time.perf_counter()
    return out

def gpu_done(self, run):
    marks["gpu_done"] = time.perf_counter()
    return check(self, run)

stream.Ring.__iter__, backend.CudaBackend.stream, backend.CudaBackend._check_flags = blocks, timed_stream, gpu_done
runs = []
with infer.Session(model) as s:
    for _ in range(3):
        marks.clear()
        forward = s.evaluate(path).timing["forward"]
        runs.append(dict(forward=forward, **{k: (v - marks["start"]) * 1e3 for k, v in marks.items()}))
print(json.dumps(runs))
'''
ARMS = ("faulted", "fresh")


def main(model, path, processes=8):
    runs = {arm: [] for arm in ARMS}
    for p in range(int(processes)):
        for arm in ARMS if p % 2 == 0 else ARMS[::-1]:
            r = subprocess.run([sys.executable, "-c", CHILD, model, path, arm], capture_output=True, text=True)
            if r.returncode:
                print(f"{arm} process {p} failed: {r.stderr.strip()[-2000:]}")
                continue
            for i, d in enumerate(json.loads(r.stdout.strip().splitlines()[-1])):
                runs[arm].append((i, d["end"] - d["gpu_done"], d["forward"]))
                print(f"{arm} process {p} run {i}: forward {d['forward']:.1f} ms; first block in at {d['first']:.1f}, "
                      f"last at {d['last']:.1f}, GPU done at {d['gpu_done']:.1f}, outputs in place at {d['end']:.1f}", flush=True)
    for arm in ARMS:
        for first in (True, False):
            sel = [r for r in runs[arm] if (r[0] == 0) == first]
            if sel:
                print(f"{arm}, {'first runs' if first else 'later runs'}: GPU done to outputs in place "
                      f"{statistics.median(r[1] for r in sel):.2f} ms, forward {statistics.median(r[2] for r in sel):.1f} ms (medians)")


if __name__ == "__main__":
    main(*sys.argv[1:])
