// Phases 0 and 1 of fused_kernel1 and fused_kernel2, included into each kernel's body (as a function,
// ptxas allocated fused_kernel1's registers differently on sm_80 and spilled). Uses the kernel's t,
// x, img0, imgs, bad, stage and p1, and its p1 strides PSTR, RSTR, ISTR.
// PROLOGUE_LOADS: stage_images' loads at a time (STAGE_LOADS; fused_kernel1 spills on sm_80 with more than 1).
#ifndef PROLOGUE_LOADS
#define PROLOGUE_LOADS STAGE_LOADS
#endif

    // Phase 0: this block's images into shared memory (zeros past the end of the batch), checked.
    stage_images<PROLOGUE_LOADS>(stage, x, img0, imgs, bad);
    __syncthreads();

    // Phase 1: conv1 + ReLU + pool; this thread's conv1 channel is fixed, its weights in registers.
    {
        const int c = t % C1;
        float w[K1 * K1 * IN_C];
#pragma unroll
        for (int i = 0; i < K1 * K1 * IN_C; ++i) w[i] = c_w1[i * C1 + c];
        for (int pix = t / C1; pix < IMGS * P1H * P1W; pix += FUSED_THREADS / C1) {
            const int img = pix / (P1H * P1W), ph = (pix / P1W) % P1H, pw = pix % P1W;
            const float* xs = stage + ((img * IN_H + 2 * ph) * IN_W + 2 * pw) * IN_C;
            float v[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
            for (int kh = 0; kh < K1; ++kh)
#pragma unroll
                for (int kw = 0; kw < K1; ++kw)
#pragma unroll
                    for (int ci = 0; ci < IN_C; ++ci) {
                        const float wk = w[(kh * K1 + kw) * IN_C + ci];
#pragma unroll
                        for (int dy = 0; dy < 2; ++dy)
#pragma unroll
                            for (int dx = 0; dx < 2; ++dx)
                                v[dy][dx] = fmaf(xs[((kh + dy) * IN_W + kw + dx) * IN_C + ci], wk, v[dy][dx]);
                    }
            p1[img * ISTR + ph * RSTR + pw * PSTR + c] =
                (((relu(v[0][0]) + relu(v[0][1])) + relu(v[1][0])) + relu(v[1][1])) * 0.25f;
        }
    }
