// LZF streams (h5py's lzf filter: one stream a chunk) decoded on the GPU, each into its own output
// buffer. Arguments: arrays of `count` source pointers, source sizes, output capacities, decoded
// sizes (out), output pointers and statuses (out: ZSTD_OK, _BAD, _FULL), as inflate_kernel2's.
// lzf_kernel1: a block of one warp per stream (cuda/lzf.cuh: the lanes parse up to 32 tokens at once,
//   those starting in the next 128 bytes, by pointer doubling, then build their output in a 16 KB
//   ring in shared memory: literals and references reaching before the batch a lane each,
//   references into the batch and long ones in order by the warp; each batch stored coalesced);
//   reads the stream about twice (the parse, then the literals), writes the output once. Outputs up
//   to ZOUT_MAX (1 GiB - 1) bytes.

#include "lzf.cuh"

extern "C" __global__ void __launch_bounds__(32) lzf_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                             const unsigned long long* __restrict__ src_bytes,
                                                             const unsigned long long* __restrict__ dst_bytes,
                                                             unsigned long long* __restrict__ actual_bytes,
                                                             unsigned char* const* __restrict__ dst_ptrs,
                                                             int* __restrict__ statuses) {
    __shared__ __align__(16) unsigned char ring[LZF_RING];
    __shared__ unsigned char mods[32][32];
    lzf_mods(mods, threadIdx.x);
    const int c = blockIdx.x;
    zi64 decoded;
    const int status = lzf_stream(src_ptrs[c], (zi64)src_bytes[c], dst_ptrs[c],
                                  (zi64)min(dst_bytes[c], (unsigned long long)ZOUT_MAX), &decoded, threadIdx.x, ring, mods);
    if (threadIdx.x == 0) {
        statuses[c] = status;
        actual_bytes[c] = (unsigned long long)decoded;
    }
}
