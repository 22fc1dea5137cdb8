// Zstandard frames (hdf5plugin's Zstd filter: one frame a chunk) decoded on the GPU, each into its
// own output buffer. Arguments: arrays of `count` source pointers, source sizes, output capacities,
// decoded sizes (out), output pointers and statuses (out: ZSTD_OK, _BAD, _FULL), as inflate_kernel1's.
// zstd_kernel1: a block of one warp per frame (cuda/zstd.cuh: the lanes step through the frame in
//   lockstep and share its copies, up to 256 bytes a step, and a block's 4 literal streams); the
//   tables (Huffman 2^11 entries, FSE 2 x 2^9 + 2^8) in 15 KB of shared memory; literals decoded into
//   the end of the output and copied down as the sequences take them: reads the frame once (the
//   bitstreams as aligned 8-byte words), writes the output about twice where literals are Huffman
//   coded. Outputs up to ZOUT_MAX (1 GiB - 1) bytes: positions are 32-bit.

#include "zstd.cuh"

extern "C" __global__ void __launch_bounds__(32) zstd_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                              const unsigned long long* __restrict__ src_bytes,
                                                              const unsigned long long* __restrict__ dst_bytes,
                                                              unsigned long long* __restrict__ actual_bytes,
                                                              unsigned char* const* __restrict__ dst_ptrs,
                                                              int* __restrict__ statuses) {
    __shared__ ZTables tables;
    const int c = blockIdx.x;
    zi64 decoded;
    const int status = zstd_frame(&tables, src_ptrs[c], (zi64)src_bytes[c], dst_ptrs[c],
                                  (zi64)min(dst_bytes[c], (unsigned long long)ZOUT_MAX), &decoded, threadIdx.x);
    if (threadIdx.x == 0) {
        statuses[c] = status;
        actual_bytes[c] = (unsigned long long)decoded;
    }
}
