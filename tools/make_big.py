"""Write the 1,000,000-image streaming files from testfull.hdf5 (tiled 100 times) into a folder:
big.hdf5 (float32 contiguous), big_u8.hdf5 (uint8 contiguous, rint(x * 255)) and big_gz.hdf5
(float32, gzip level 4, 1000-image chunks; testfull's 10 distinct chunks compressed once).
Usage:  python3 tools/make_big.py DATA_DIR OUT_DIR [big big_u8 big_gz]"""
import os
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np


def main(data, out, names):
    t = time.perf_counter()
    with h5py.File(f"{data}/testfull.hdf5") as src:
        x, y = src["x"][()], src["y"][()]
    for name, images in (("big", x), ("big_u8", np.rint(x * 255).astype(np.uint8))):
        if name not in names:
            continue
        with h5py.File(f"{out}/{name}.hdf5", "w") as f:
            dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], images.dtype)
            dy = f.create_dataset("y", (100 * len(y), y.shape[1]), "f8")
            for i in range(100):
                dx[i * len(x):(i + 1) * len(x)] = images
                dy[i * len(y):(i + 1) * len(y)] = y
    if "big_gz" in names:
        rows = 1000
        with ThreadPoolExecutor(16) as pool:
            packed = list(pool.map(lambda j: zlib.compress(x[j * rows:(j + 1) * rows].tobytes(), 4), range(10)))
        with h5py.File(f"{out}/big_gz.hdf5", "w") as f:
            dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], "f4", chunks=(rows,) + x.shape[1:],
                                  compression="gzip")
            for i in range(1000):
                dx.id.write_direct_chunk((i * rows, 0, 0, 0), packed[i % 10])
            f.create_dataset("y", data=np.tile(y, (100, 1)))
    # On disk before any timing: otherwise the kernel writes the 4 GB back ~30 s later, in the
    # middle of the benchmarks that read them (a 2-GPU session at about that time swung from 44 to 224 ms)
    os.sync()
    print(f"wrote {', '.join(names)} (1,000,000 images each) in {out} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or ["big", "big_u8", "big_gz"])
