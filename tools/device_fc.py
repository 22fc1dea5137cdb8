"""GPU time of the classifier kernels alone (fc1 -> ReLU -> fc2 -> argmax) on random features:
fc_kernel4 (FP32) against fc_kernel5 (tensor cores); CUDA events,
warm-up, median of 20. Usage on the device:
    . .device/setup.sh && python3 tools/device_fc.py [N] [FEATURES] [HIDDEN]"""
import sys

import numpy as np
import pycuda.driver as cuda

from infer import reference
from infer.bench import _median_events
from infer.gpu.backend import Build
from infer.gpu.device import Device
from infer.gpu.launch import FullyConnected
from infer.gpu.profile import NullProfiler
from infer.network import Geometry

n, flat, hidden = (int(v) for v in (sys.argv[1:] + ["10000", "1024", "128"][len(sys.argv) - 1:])[:3])
gpu = Device(0)
try:
    build = Build(gpu.arch, False, None, NullProfiler(), "auto", gpu.l2_bytes, gpu.sms)
    g = Geometry(h=28, w=28, c=1, k1=5, c1=32, k2=5, c2=flat // 16, hidden=hidden, classes=10)
    rng = np.random.default_rng(0)
    feat = rng.random((n, flat), dtype=np.float32)
    fc1 = (rng.standard_normal((flat, hidden)) * np.sqrt(2 / flat)).astype(np.float32)
    fc2 = (rng.standard_normal((hidden, 10)) * np.sqrt(2 / hidden)).astype(np.float32)
    expected = reference.argmax(reference.fc(reference.relu(reference.fc(feat, fc1)), fc2))
    dev = [cuda.to_device(a) for a in (feat, fc1, fc2)]
    labels, overflow = cuda.mem_alloc(4 * n), cuda.to_device(np.array([2**31 - 1], np.int32))
    print(f"{n} images, {flat} features, {hidden} hidden, {gpu.describe()}")
    for name, tc in (("fc_kernel4 (FP32)", False), ("fc_kernel5 (tensor cores)", True)):
        if tc and (int(gpu.arch[3:]) < 80 or hidden > FullyConnected.TC_MAX_HIDDEN):
            continue
        fc = FullyConnected(build, g, tc)
        partial = cuda.mem_alloc(max(4, 4 * fc.partial_floats(n)))
        run = lambda: fc(None, dev[0], dev[1], dev[2], labels, n, overflow, 0, partial)  # noqa: E731
        run()
        got = np.empty(n, np.int32)
        cuda.memcpy_dtoh(got, labels)
        ms = _median_events(run, 5, 20)
        print(f"{name:32} {1e3 * ms:8.1f} us  {2 * n * flat * hidden / ms / 1e9:6.1f} TFLOP/s (FP32 work)  "
              f"{np.count_nonzero(got == expected)}/{n} labels as the reference")
finally:
    gpu.close()
