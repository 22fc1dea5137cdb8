"""The deflate decoder's first version (dev/cuda/inflate_early.cu: inflate_kernel1, a warp a stream
parsing and writing in lockstep), validated and timed beside inflate_kernel2 and the product's
inflate_kernel3 (cuda/inflate.cu) on copies of one HDF5 chunk's deflate stream. Needs a GPU:

    . .device/setup.sh && python dev/cuda/inflate_early.py ../shared/data/ece408/testfull.hdf5 \\
        [--images 1024] [--level 1] [--shuffle] [--copies 132,400,1000,1584] [--repeats 5] \\
        [--kernels inflate_kernel1,inflate_kernel2,inflate_kernel3] [--window 8192] [--whole] \\
        [--ring 256] [--min-blocks 16]

The stream: the file's first --images images (float32, HDF5's byte shuffle with --shuffle) deflated
at --level, as h5py's gzip filter stores a chunk. One row a kernel and number of copies (each decoded
into its own output, all in one launch): the median of --repeats launches after one warm-up (CUDA
events), and the output's GB/s. Every launch is checked: each copy's status and size, and the first,
middle and last outputs byte for byte (a mismatch stops the script, exit 1). A chunk's latency is the
row of one copy an SM; with every block slot full, the rows' GB/s is the decoder's throughput.
tests/test_inflate.py runs the validation of the three kernels; test_kernels_compile.py builds the file."""
import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "dev" / "cuda")]

import devbuild  # noqa: E402
from infer.gpu import launch  # noqa: E402


class Inflate2(launch.FrameDecoder):
    """inflate_kernel2: a block of two warps a stream (one parsing, one writing), as the product's
    inflate_kernel3 decodes each part; FrameDecoder's arguments."""
    source, kernel, arg_types, threads = "dev/cuda/inflate_early", "inflate_kernel2", "PPPPPP", 64
    WINDOW = launch.InflateParts.WINDOW

    def __init__(self, build, window=None):
        window = window or self.WINDOW
        if window < 1024 or window & (window - 1):
            raise ValueError(f"the window is a power of two of at least 1024 bytes, not {window}")
        devbuild.load(build, "inflate_early", (("WINDOW", window),))
        super().__init__(build, WINDOW=window)


class EarlyInflate(Inflate2):
    """inflate_kernel1: a block of one warp a stream."""
    kernel, threads = "inflate_kernel1", 32


KERNELS = {"inflate_kernel1": EarlyInflate, "inflate_kernel2": Inflate2, "inflate_kernel3": launch.InflateParts}


def stream_of(path, images, level, shuffle):
    """(the chunk's bytes, its raw deflate stream)."""
    import h5py

    with h5py.File(path, "r") as f:
        x = np.ascontiguousarray(f["x"][:images], dtype="<f4")
    raw = x.view(np.uint8).reshape(-1, 4).T.tobytes() if shuffle else x.tobytes()
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return raw, c.compress(raw) + c.flush()


def timed(decoder, stream_bytes, expect, copies, repeats, split=True, spread=False):
    """The median ms of launches decoding `copies` copies of the stream (inflate_kernel3's in parts
    where split, its parsers spread over the schedulers where spread); SystemExit where one is wrong."""
    import pycuda.driver as cuda

    stride = -(-(len(expect) + 64) // 256) * 256
    src = cuda.to_device(np.frombuffer(stream_bytes + bytes(16), np.uint8))
    out = cuda.mem_alloc(stride * copies)
    table = np.array([[int(src)] * copies, [len(stream_bytes)] * copies, [len(expect)] * copies, [0] * copies,
                      [int(out) + stride * i for i in range(copies)]], np.uint64)
    d_table, d_status = cuda.to_device(table), cuda.mem_alloc(4 * copies)
    scratch = ()
    if hasattr(decoder, "scratch_for"):  # inflate_kernel3's parts
        nbytes = decoder.scratch_for(copies, len(expect))
        scratch = (cuda.mem_alloc(256 + nbytes), nbytes, split, spread)
    rows = [int(d_table) + 8 * copies * j for j in range(5)]
    stream, start, end = cuda.Stream(), cuda.Event(), cuda.Event()
    ms = []
    for r in range(repeats + 1):
        cuda.memset_d32(d_status, 0xFFFFFFFF, copies)
        start.record(stream)
        decoder(stream, copies, *rows, d_status, *scratch)
        end.record(stream)
        end.synchronize()
        status = cuda.from_device(d_status, (copies,), np.int32)
        sizes = cuda.from_device_like(d_table, table)[3]
        bad = [i for i in range(copies) if status[i] != decoder.OK or sizes[i] != len(expect)]
        for i in {0, copies // 2, copies - 1} - set(bad):
            got = np.empty(len(expect), np.uint8)
            cuda.memcpy_dtoh(got, int(out) + stride * i)
            if got.tobytes() != expect:
                bad.append(i)
        if bad:
            raise SystemExit(f"{decoder.kernel}: copy {bad[0]} of {copies} decoded wrong (status {status[bad[0]]})")
        if r:
            ms.append(start.time_till(end))
    for buf in (src, out, d_table, d_status, *scratch[:1]):
        buf.free()
    return float(np.median(ms))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="an HDF5 data set with x (n, 28, 28, 1)")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--copies", default="132,400,1000,1584")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kernels", default=",".join(KERNELS), help="which of them, by name")
    p.add_argument("--window", type=int, help="shared-memory window bytes of kernels 2 and 3 (default: the product's)")
    p.add_argument("--whole", action="store_true", help="inflate_kernel3 decodes each copy whole (split=False)")
    p.add_argument("--ring", type=int, help="inflate_kernel3's tokens between parser and writer (default: the product's)")
    p.add_argument("--spread", choices=("yes", "no"),
                   help="inflate_kernel3's parsers on every scheduler (default: where --shuffle, as the product)")
    p.add_argument("--min-blocks", type=int, help="inflate_kernel3's blocks an SM its registers allow (default: the product's)")
    a = p.parse_args(argv)
    from infer.gpu.device import Device
    from infer.gpu.profile import NullProfiler

    raw, deflated = stream_of(a.data, a.images, a.level, a.shuffle)
    print(f"{a.images} images, {len(raw):,} bytes{' shuffled' if a.shuffle else ''}, deflated at level {a.level} "
          f"to {len(deflated):,}")
    gpu = Device(0)
    spread = a.shuffle if a.spread is None else a.spread == "yes"
    try:
        b = launch.Build(gpu.arch, False, None, NullProfiler(), "auto", gpu.l2_bytes, gpu.sms)
        for name in a.kernels.split(","):
            more = {"ring": a.ring, "min_blocks": a.min_blocks} if name == "inflate_kernel3" else {}
            decoder = KERNELS[name](b, window=a.window, **more)
            f = decoder.function
            print(f"{name}: {f.num_regs} registers, {f.shared_size_bytes:,} bytes of shared memory a block", flush=True)
            for copies in (int(c) for c in a.copies.split(",")):
                ms = timed(decoder, deflated, raw, copies, a.repeats, not a.whole, spread)
                print(f"{name}  {a.window or decoder.WINDOW}  {copies:5d} copies  {ms:8.2f} ms  "
                      f"{copies * len(raw) / ms / 1e6:6.1f} GB/s out", flush=True)
    finally:
        gpu.close()


if __name__ == "__main__":
    main()
