// Zstandard frames (hdf5plugin's Zstd filter: one frame a chunk) decoded on the GPU, each into its
// own output buffer. Arguments: arrays of `count` source pointers, source sizes, output capacities,
// decoded sizes (out), output pointers and statuses (out: ZSTD_OK, _BAD, _FULL), as inflate_kernel2's.
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

#ifndef ZWARPS
#define ZWARPS 3  // warps a frame: one carries the sequences out, the others decode blocks apart
#endif

// zstd_kernel2: a block of ZWARPS warps a frame. Thread 0 plans the frame's blocks (zstd_plan) and
//   claims its scratch memory from the launch's pool (scratch, scratch_bytes; *scratch_used counts
//   what is taken, 0 before the launch); warps 1.. decode the compressed blocks apart, each with tables
//   of its own (block j by warp 1 + j % (ZWARPS - 1)), while warp 0 carries their sequences out in
//   order as each is ready. A frame of more than ZMAX_BLOCKS blocks, or with no room left in the
//   pool, is decoded whole by warp 0 (zstd_frame, zstd_kernel1's way). (ZWARPS - 1) x 15 KB of
//   dynamic shared memory for the tables and 7 KB for the plan; the scratch memory takes a frame's
//   Huffman-coded literals and 12 bytes a sequence.
extern "C" __global__ void __launch_bounds__(32 * ZWARPS) zstd_kernel2(const unsigned char* const* __restrict__ src_ptrs,
                                                                       const unsigned long long* __restrict__ src_bytes,
                                                                       const unsigned long long* __restrict__ dst_bytes,
                                                                       unsigned long long* __restrict__ actual_bytes,
                                                                       unsigned char* const* __restrict__ dst_ptrs,
                                                                       int* __restrict__ statuses,
                                                                       unsigned char* __restrict__ scratch,
                                                                       unsigned long long scratch_bytes,
                                                                       unsigned long long* __restrict__ scratch_used) {
    extern __shared__ __align__(16) unsigned char tables_bytes[];  // (ZWARPS - 1) x ZTABLES_BYTES
    ZTables* tables = reinterpret_cast<ZTables*>(tables_bytes);
    __shared__ ZPlan plan;
    __shared__ unsigned long long base;
    const int c = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned char* src = src_ptrs[c];
    const zi64 size = (zi64)src_bytes[c], cap = (zi64)min(dst_bytes[c], (unsigned long long)ZOUT_MAX);
    if (threadIdx.x == 0) {
        zi64 at;
        plan.blocks = 0;
        plan.head = zframe_head(src, size, cap, &at, &plan.fhd, &plan.fcs_bytes, &plan.content);
        if (plan.head == ZSTD_OK) {
            const unsigned long long need = (unsigned long long)zstd_plan(&plan, src, size, at);
            base = plan.blocks ? atomicAdd(scratch_used, need) : 0;
            if (base + need > scratch_bytes) plan.blocks = 0;
        }
        for (int j = 0; j < plan.blocks; ++j) plan.ready[j] = 0;
    }
    __syncthreads();
    zi64 decoded = 0;
    int status;
    if (plan.blocks == 0) {  // decoded whole by warp 0, with the first decoder's tables
        if (warp) return;
        status = zstd_frame(&tables[0], src, size, dst_ptrs[c], cap, &decoded, lane);
    } else if (warp) {
        for (int j = warp - 1; j < plan.blocks; j += ZWARPS - 1) {
            if (plan.kind[j] != 2) continue;
            const int s = zstd_block_apart(&tables[warp - 1], &plan, j, src, scratch + base, lane);
            __threadfence_block();  // its scratch memory and plan entries written before it is marked ready
            __syncwarp();
            if (lane == 0) {
                plan.status[j] = s;
                __threadfence_block();
                plan.ready[j] = 1;
            }
        }
        return;
    } else {
        status = zstd_run(&plan, src, size, scratch + base, dst_ptrs[c], cap, &decoded, lane);
    }
    if (lane == 0) {
        statuses[c] = status;
        actual_bytes[c] = (unsigned long long)decoded;
    }
}
