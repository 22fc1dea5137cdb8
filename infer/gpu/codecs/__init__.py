"""How the GPU decodes each HDF5 filter it takes (CODECS, for chunk_decode's stream of compressed
blocks): per codec, its kernels, the table of a group's chunks it fills, its checks, and how it
places a block's images.
- deflate (Deflate): inflate_kernel3 (cuda/inflate.cu: two warps parsing and writing each part of a
  chunk, its parts past the first starting at a deflate block they find, then joined), a kernel
  checking them (the kernel's status, the decoded size, deflate's adler32), HDF5's shuffle undone as
  they are placed. A chunk of 1,024 MNIST images at gzip 1 takes 19.5 ms alone in 2 parts (31 whole:
  H200); an SM holds eleven parts. A run whose chunks are not all in flight at once decodes them whole;
- Zstd (Zstd): zstd_kernel2 (cuda/zstd.cu: 3 warps a frame, two decoding its blocks apart into
  scratch memory, one carrying their sequences out in order), checked and unshuffled as deflate's. A
  1,000-image MNIST chunk takes 15 ms alone (H100), shuffled 23;
- LZF (Lzf): lzf_kernel1 (cuda/lzf.cu: a warp a chunk, a batch's 32 tokens parsed at once, its
  output built in a ring in shared memory), checked and unshuffled as deflate's. A 1,000-image MNIST
  chunk takes 24 ms alone (H200), shuffled 33;
- Blosc lz4 + bitshuffle (BloscLz4): blosc_lz4_kernel2 (cuda/lz4.cu: a warp per stream of a block,
  ~25 a 1,024-image chunk, the stream in a window of registers, the recent output in shared memory):
  80 such chunks alone take 5.4 ms (H200; 1,000-image chunks 16 ms, their last block one stream of
  514 KB), the bits unshuffled as they are placed; Blosc lz4 + byte shuffle (BloscLz4Bytes, its
  blocks split a stream a value byte), c-blosc's shuffle undone a block at a time as they are placed:
  --decode gpu only (host_first: the reader threads ran it faster, leaving the shuffle to the GPU);
- Blosc zstd (BloscZstd): zstd_kernel1 (a warp a frame) on each c-blosc block's frame (13 of 256 KB
  a 1,000-image MNIST chunk), c-blosc's byte shuffle undone a block at a time as they are placed;
- LZ4 (Lz4), Bitshuffle lz4 (Bitshuffle), Blosc2 lz4 + bitshuffle (Blosc2): lz4_blocks_kernel1 (a warp
  a block, as blosc_lz4_kernel2's streams) on blocks found by lz4_index_kernel1 (LZ4's and Bitshuffle's
  chained framing, a thread a chunk) or read by the host (Blosc2's table of starts). Only
  --decode gpu takes them (host_first: the reader threads ran them faster on an H200).
Chunks cutting images are assembled as they are placed: assemble_kernel1 from deflate's, LZF's,
Zstd's and LZ4's decoded chunks (HDF5's shuffle undone on the way), assemble_kernel2 from Blosc's
and Bitshuffle's as they lie (byte-shuffled a c-blosc block at a time, or bitshuffled).
Files by family: deflate.py (Deflate, Zstd, Lzf), blosc.py (BloscLz4, BloscZstd), lz4.py (Bitshuffle,
Lz4, Blosc2); here, which filter goes to which (CODECS, codec_for).
"""
import os

from ...data import reader
from .blosc import BloscLz4, BloscLz4Bytes, BloscZstd, blosc_chunks
from .deflate import Deflate, Lzf, Zstd, _copy_rows
from .lz4 import Bitshuffle, Blosc2, Lz4

__all__ = ["CODECS", "codec_for", "Deflate", "Zstd", "Lzf", "BloscLz4", "BloscLz4Bytes", "BloscZstd", "Bitshuffle", "Lz4",
           "Blosc2",
           "blosc_chunks", "_copy_rows"]


# HDF5 filter -> how the GPU decodes it (Blosc: by the codec its first chunk names, codec_for)
CODECS = {reader.FILTER_DEFLATE: Deflate, reader.FILTER_LZF: Lzf, reader.FILTER_ZSTD: Zstd,
          reader.FILTER_BLOSC: BloscLz4, reader.FILTER_BITSHUFFLE: Bitshuffle, reader.FILTER_LZ4: Lz4,
          reader.FILTER_BLOSC2: Blosc2}


def codec_for(rows):
    """How the GPU decodes the chunks of `rows` (a ChunkedRows whose filter is in CODECS)."""
    codec = CODECS[rows.codec]
    if codec is BloscLz4:
        head = os.pread(rows.fd, 3, int(rows.index[0][0]))
        if len(head) == 3 and head[2] >> 5 == BloscZstd.ZSTD:
            return BloscZstd
        if len(head) == 3 and head[2] >> 5 == BloscLz4.LZ4 and head[2] & 0x0f == BloscLz4Bytes.SHUFFLE:
            return BloscLz4Bytes
    return codec
