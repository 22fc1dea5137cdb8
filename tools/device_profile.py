"""Per-kernel GPU time of one algorithm on a random geometry (one stream: exclusive times), and
whether CUDA graph capture works here. Usage on the device:
    . .device/setup.sh && python3 tools/device_profile.py 128x128x3,7:32,5:64,128 500 implicit-tc"""
import sys

import numpy as np

from infer.bench.gpu import random_case
from infer.gpu.backend import CudaBackend
from infer.gpu.profile import table
from infer.plan import for_backend

spec, n, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, x = random_case(spec, n)
for profile in (True, False):  # profiled launches are never captured: graphs are tried without
    b = CudaBackend(conv_algo=algo, streams=1, profile=profile)
    try:
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, for_backend(b, model, x.shape))
        b.forward(host)
        if profile:
            b.profiler.reset()  # only the second forward's times
        b.forward(host)
        if profile:
            print(f"{spec}, {n} images, {b.device}")
            print("\n".join(table(b.profile)))
        else:
            print("graph capture and replay:", "ok" if b.executor.use_graphs else "failed: kernels launched one by one")
    finally:
        b.close()
