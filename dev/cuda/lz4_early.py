"""The c-blosc lz4 decoder's first version (dev/cuda/lz4_early.cu: blosc_lz4_kernel1, each sequence's
bytes loaded as the parse reaches them), validated and timed beside the product's blosc_lz4_kernel2
(cuda/lz4.cu) on the chunks of an HDF5 file written with hdf5plugin's Blosc (lz4, bitshuffle), such
as tools/make_big.py's big_blosc_lz4 (1,000-image chunks) or big_blosc_lz4_1024. Needs a GPU:

    . .device/setup.sh && python dev/cuda/lz4_early.py /tmp/big_blosc_lz4_1024.hdf5 \\
        [--chunks 80,400,1000] [--repeats 5] [--kernels blosc_lz4_kernel1,blosc_lz4_kernel2]

One row a kernel and number of chunks (the file's first, all in one launch, each into its own
output): the median of --repeats launches after one warm-up (CUDA events) and the output's GB/s.
Every launch is checked: no chunk flagged, and every kernel's output equal to the first kernel's
byte for byte (a mismatch stops the script, exit 1). 80 chunks is a streamed run's group;
tests/test_gpu_lz4.py validates both kernels against the host's bitshuffle."""
import argparse
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "dev" / "cuda")]

import devbuild  # noqa: E402
from infer.gpu import launch  # noqa: E402


class BloscLz4Early(launch.BloscLz4):
    """blosc_lz4_kernel1, with launch.BloscLz4's geometry and arguments."""
    source, kernel = "dev/cuda/lz4_early", "blosc_lz4_kernel1"

    def __init__(self, build):
        devbuild.load(build, "lz4_early", tuple(sorted(self.defines().items())))
        super().__init__(build)


KERNELS = {"blosc_lz4_kernel1": BloscLz4Early, "blosc_lz4_kernel2": launch.BloscLz4}


def stored_chunks(path):
    """(the stored bytes of each chunk of path's 'x', c-blosc's chunk bytes, its block bytes)."""
    import h5py

    with h5py.File(path, "r") as f:
        d = f["x"]
        chunks = [d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset)[1] for i in range(d.id.get_num_chunks())]
    _, _, _, _, chunk_bytes, block_bytes, _ = struct.unpack("<BBBBIII", chunks[0][:16])
    return chunks, chunk_bytes, block_bytes


def timed(decoder, chunks, chunk_bytes, block_bytes, repeats):
    """(the median ms of launches decoding the chunks, their outputs); SystemExit where one is flagged."""
    import pycuda.driver as cuda

    n = len(chunks)
    at = np.concatenate([[0], np.cumsum([len(c) for c in chunks])[:-1]])
    src = cuda.to_device(np.frombuffer(b"".join(chunks), np.uint8))
    out = cuda.mem_alloc(chunk_bytes * n)
    table = cuda.to_device(np.array([int(src) + at, [len(c) for c in chunks], int(out) + chunk_bytes * np.arange(n)],
                                    np.uint64))
    bad = cuda.to_device(np.array([2**31 - 1], np.int32))
    t = int(table)
    stream, start, end = cuda.Stream(), cuda.Event(), cuda.Event()
    ms = []
    for r in range(repeats + 1):
        start.record(stream)
        decoder(stream, n, t, t + 8 * n, t + 16 * n, chunk_bytes, block_bytes, 4, 0, bad)
        end.record(stream)
        end.synchronize()
        if r:
            ms.append(start.time_till(end))
    flag = int(cuda.from_device(bad, 1, np.int32)[0])
    result = np.empty(chunk_bytes * n, np.uint8)
    cuda.memcpy_dtoh(result, out)
    for buf in (src, out, table, bad):
        buf.free()
    if flag != 2**31 - 1:
        raise SystemExit(f"{decoder.kernel}: chunk {flag} of {n} flagged as damaged")
    return float(np.median(ms)), result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="an HDF5 file whose 'x' is stored by hdf5plugin's Blosc (lz4, bitshuffle)")
    p.add_argument("--chunks", default="80,400,1000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kernels", default=",".join(KERNELS), help="which of them, by name")
    a = p.parse_args(argv)
    from infer.gpu.device import Device
    from infer.gpu.profile import NullProfiler

    chunks, chunk_bytes, block_bytes = stored_chunks(a.data)
    print(f"{len(chunks)} chunks of {chunk_bytes:,} bytes in blocks of {block_bytes:,}, "
          f"{sum(map(len, chunks)):,} bytes stored")
    gpu = Device(0)
    try:
        b = launch.Build(gpu.arch, False, None, NullProfiler(), "auto", gpu.l2_bytes, gpu.sms)
        for n in sorted({min(int(c), len(chunks)) for c in a.chunks.split(",")}):
            first = None
            for name in a.kernels.split(","):
                ms, result = timed(KERNELS[name](b), chunks[:n], chunk_bytes, block_bytes, a.repeats)
                if first is None:
                    first = result
                elif not np.array_equal(result, first):
                    raise SystemExit(f"{name}: {n} chunks decoded otherwise than by {a.kernels.split(',')[0]}")
                print(f"{name}  {n:5d} chunks  {ms:8.2f} ms  {n * chunk_bytes / ms / 1e6:6.1f} GB/s out", flush=True)
    finally:
        gpu.close()


if __name__ == "__main__":
    main()
