"""GPU time of the default algorithm over chunk sizes and stream counts, images resident (as
`cnninfer bench` times it: CUDA events, warm-up, median of 20), to choose the in-memory chunk.
Usage on the device:
    . .device/setup.sh && python3 tools/device_chunks.py "$CNNINFER_DATA" [N] [ALGO] [CHUNK,CHUNK,...]"""
import sys

import h5py
import numpy as np

from infer import loader
from infer.bench import _median_events, _median_host
from infer.gpu.backend import CudaBackend

data, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10000
algo = sys.argv[3] if len(sys.argv) > 3 else "auto"
chunks = [int(c) for c in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
model = loader.load_model(f"{data}/model.hdf5")
with h5py.File(f"{data}/testfull.hdf5", "r") as f:
    x_all = f["x"][:n].astype(np.float32)
print(f"{n} images, --conv-algo {algo}: GPU ms (e2e ms)")
for streams in (2, 4, 8):
    for chunk in chunks or sorted({1024, 1664, 2048, 2500, 3334, 5000, n} | {-(-n // streams)}):
        if chunk > n:
            continue
        b = CudaBackend(chunk=chunk, streams=streams, conv_algo=algo)
        try:
            x = b.host_buffers(x_all.shape, np.float32)[0]
            x[...] = x_all
            b.prepare(model, x.shape)
            b.forward(x)
            gpu = _median_events(lambda: b.enqueue(b._run), 5, 20)
            e2e = _median_host(lambda: b.forward(x), 5, 20)
            print(f"streams {streams} chunk {chunk:5} ({-(-n // chunk)} chunks): {gpu:.3f} ({e2e:.3f})", flush=True)
        finally:
            b.close()
