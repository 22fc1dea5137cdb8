"""Write the 1,000,000-image streaming files from testfull.hdf5 (tiled 100 times) into a folder:
big.hdf5 (float32 contiguous), big_u8.hdf5 (uint8 contiguous, rint(x * 255)), big_be.hdf5 (big-endian
float32, contiguous: swapped as read) and, for each filtered
layout in LAYOUTS, big_<layout>.hdf5 (float32, 1000-image chunks unless the layout says, whole images but in gz1_h). A
filtered file is written by h5py's filters (hdf5plugin's for the plugin layouts) for testfull's 10 distinct chunks,
whose stored bytes are then copied 100 times; chunks that do not tile testfull are each written through the filter
(gzip and shuffle ones deflated by every core, byte for byte what HDF5's filters store).
Usage:  python3 tools/make_big.py DATA_DIR OUT_DIR [big big_u8 big_gz1 big_lzf ...]"""
import multiprocessing
import os
import sys
import time
import zlib

import h5py
import numpy as np

ROWS = 1000
LAYOUTS = {
    "gz1": dict(compression="gzip", compression_opts=1),
    "gz6": dict(compression="gzip", compression_opts=6),
    "shuf_gz1": dict(compression="gzip", compression_opts=1, shuffle=True),
    "shuf_gz6": dict(compression="gzip", compression_opts=6, shuffle=True),
    "shuf_gz6_1024": dict(compression="gzip", compression_opts=6, shuffle=True, chunks=(1024, 28, 28, 1)),
    "lzf": dict(compression="lzf"),
    "shuf_lzf": dict(compression="lzf", shuffle=True),
    "lzf_f32": dict(compression="lzf", fletcher32=True),
    "gz1_h": dict(compression="gzip", compression_opts=1, chunks=(ROWS, 14, 28, 1)),  # chunks cutting images
    "gz1_cut": dict(compression="gzip", compression_opts=1, chunks=(256, 7, 28, 1)),  # issue 69's: each image in 4
    # hdf5plugin's filters (the `plugins` extra)
    "blosc_lz4": dict(compression=("Blosc", dict(cname="lz4", clevel=5, shuffle=2))),  # bitshuffle inside
    "blosc_lz4_1024": dict(compression=("Blosc", dict(cname="lz4", clevel=5, shuffle=2)), chunks=(1024, 28, 28, 1)),
    "blosc_zstd": dict(compression=("Blosc", dict(cname="zstd", clevel=3, shuffle=1))),
    "blosc_default": dict(compression=("Blosc", {})),  # hdf5plugin's default: lz4, byte shuffle
    "gz1_f32": dict(compression="gzip", compression_opts=1, fletcher32=True),
    # chunks cutting each image in 4 (250 images: whole tiles of testfull)
    "blosc_lz4_cut": dict(compression=("Blosc", dict(cname="lz4", clevel=5, shuffle=2)), chunks=(250, 7, 28, 1)),
    "blosc_zstd_cut": dict(compression=("Blosc", dict(cname="zstd", clevel=3, shuffle=1)), chunks=(250, 7, 28, 1)),
    "blosc2_lz4": dict(compression=("Blosc2", dict(cname="lz4", clevel=5, filters=2))),
    # 1,024-image chunks: whole 64-image b2nd blocks, so its blocks stay bitshuffled for the GPU
    "blosc2_lz4_1024": dict(compression=("Blosc2", dict(cname="lz4", clevel=5, filters=2)), chunks=(1024, 28, 28, 1)),
    "zstd": dict(compression=("Zstd", dict(clevel=3))),
    "shuf_zstd": dict(compression=("Zstd", dict(clevel=3)), shuffle=True),
    "lz4": dict(compression=("LZ4", {})),  # a block a chunk
    "lz4_64k": dict(compression=("LZ4", dict(nbytes=65536))),
    "bshuf_lz4": dict(compression=("Bitshuffle", dict(cname="lz4"))),
}


def _plugin(filters):
    """An hdf5plugin filter named in a layout, made here so the other layouts need no hdf5plugin."""
    if isinstance(filters.get("compression"), tuple):
        import hdf5plugin

        name, args = filters["compression"]
        filters["compression"] = getattr(hdf5plugin, name)(**args)
    return filters


_TILED = None  # testfull, for _deflated in the pool's workers (forked)


def _deflated(job):
    """The chunk of 1M images at `at` (its first image, then its place in the image), of shape `chunk`,
    as HDF5's shuffle and deflate filters store it (zlib's stream of the shuffled bytes; a chunk past
    the edges padded with zeros, the fill value)."""
    at, chunk, level, shuffle = job
    block = np.zeros(chunk, "<f4")
    n = min(chunk[0], 100 * len(_TILED) - at[0])
    inner = tuple(slice(o, min(o + c, s)) for o, c, s in zip(at[1:], chunk[1:], _TILED.shape[1:]))
    box = _TILED[np.arange(at[0], at[0] + n) % len(_TILED)][(slice(None),) + inner]
    block[(slice(0, n),) + tuple(slice(0, s.stop - s.start) for s in inner)] = box
    raw = block.view(np.uint8).reshape(-1, 4).T if shuffle else block
    return at, zlib.compress(raw.tobytes(), level)


def filtered(x, y, path, filters):
    chunks = _plugin(filters).pop("chunks", (ROWS,) + x.shape[1:])
    with h5py.File(path, "w") as f:
        dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], "f4", chunks=chunks, **filters)
        if len(x) % chunks[0] == 0:
            _copied(dx, x, chunks, filters)
        elif filters.get("compression") == "gzip" and set(filters) <= {"compression", "compression_opts", "shuffle"}:
            _deflated_by_every_core(dx, x, chunks, filters)
        else:  # chunks that do not tile testfull: every chunk through the filter
            step = 64 * chunks[0]
            for lo in range(0, len(dx), step):
                hi = min(len(dx), lo + step)
                dx[lo:hi] = x[np.arange(lo, hi) % len(x)]
        f.create_dataset("y", data=np.tile(y, (100, 1)))


def _copied(dx, x, chunks, filters):
    """testfull's chunks written through the filters once, their stored bytes copied 100 times."""
    with h5py.File("tiled.tmp", "w", driver="core", backing_store=False) as small:
        d = small.create_dataset("x", data=x, chunks=chunks, **filters)
        offsets = [d.id.get_chunk_info(i).chunk_offset for i in range(d.id.get_num_chunks())]
        packed = [(at, d.id.read_direct_chunk(at)) for at in offsets]
    for i in range(100):
        for at, (mask, data) in packed:
            dx.id.write_direct_chunk((at[0] + i * len(x),) + tuple(at[1:]), data, mask)


def _deflated_by_every_core(dx, x, chunks, filters):
    """Chunks, gzip (and shuffle) only, that do not tile testfull: deflated by a pool of processes
    (HDF5's filters use one core)."""
    global _TILED
    _TILED = x  # the forked workers' copy
    grid = [-(-n // c) for n, c in zip(x.shape[1:], chunks[1:])]
    jobs = [((lo,) + tuple(i * c for i, c in zip(at, chunks[1:])), chunks, filters.get("compression_opts", 4),
             filters.get("shuffle", False)) for lo in range(0, len(dx), chunks[0]) for at in np.ndindex(*grid)]
    with multiprocessing.get_context("fork").Pool() as pool:
        for at, data in pool.imap(_deflated, jobs, chunksize=8):
            dx.id.write_direct_chunk(at, data, 0)


def main(data, out, names):
    t = time.perf_counter()
    with h5py.File(f"{data}/testfull.hdf5") as src:
        x, y = src["x"][()], src["y"][()]
    for name, images in (("big", x), ("big_u8", np.rint(x * 255).astype(np.uint8)), ("big_be", x.astype(">f4"))):
        if name not in names:
            continue
        with h5py.File(f"{out}/{name}.hdf5", "w") as f:
            dx = f.create_dataset("x", (100 * len(x),) + x.shape[1:], images.dtype)
            dy = f.create_dataset("y", (100 * len(y), y.shape[1]), "f8")
            for i in range(100):
                dx[i * len(x):(i + 1) * len(x)] = images
                dy[i * len(y):(i + 1) * len(y)] = y
    for name in names:
        if name.startswith("big_") and name[4:] in LAYOUTS:
            filtered(x, y, f"{out}/{name}.hdf5", dict(LAYOUTS[name[4:]]))
    # On disk before any timing: otherwise the kernel writes the files back ~30 s later, in the
    # middle of the benchmarks that read them (a 2-GPU session at about that time swung from 44 to 224 ms)
    os.sync()
    print(f"wrote {', '.join(names)} (1,000,000 images each) in {out} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or ["big", "big_u8", "big_gz1"])
