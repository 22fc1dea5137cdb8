"""Per-kernel GPU time of one algorithm on a random geometry (one stream: exclusive times), and
whether CUDA graph capture works here. Usage on the device:
    . .device/setup.sh && python3 tools/device_profile.py 128x128x3,7:32,5:64,128 500 implicit-tc"""
import sys
import traceback

import numpy as np

from infer.bench import random_case
from infer.gpu import graph
from infer.gpu.backend import CudaBackend
from infer.gpu.profile import table

spec, n, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, x = random_case(spec, n)
b = CudaBackend(conv_algo=algo, streams=1, profile=True)
try:
    host = b.host_buffers(x.shape, np.float32)[0]
    host[...] = x
    b.prepare(model, x.shape)
    b.forward(host)
    b.profiler.__init__()  # only the second forward's times
    b.forward(host)
    print(f"{spec}, {n} images, {b.device}")
    print("\n".join(table(b.profile)))
    try:
        g = graph.Graph(b.streams[0], b.streams[1:], lambda: b._enqueue_all(b._run, host))
        g.launch(b.streams[0])
        b.streams[0].synchronize()
        print("graph capture and replay: ok")
    except Exception:
        traceback.print_exc()
finally:
    b.close()
