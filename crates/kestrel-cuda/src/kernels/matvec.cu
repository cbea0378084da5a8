// Quantized mat-vec (decode and batches of up to 8 tokens): out[t][row] = W[row] . x[t].
//
// The hot kernels of decode. One warp per weight row; each lane takes "units" of the row
// (32 or 64 weights), loads their blocks straight from device memory once and dots them with
// every token's activations (int8, one scale per 32, quantized by the norm/quantize kernels):
// NT tokens cost one pass over the weights. Device layout (weights.rs): Q4_K blocks as in GGUF
// (144 bytes, 16-byte aligned); Q6_K / Q8_0 / Q4_0 / Q5_0 with their f16 scale moved to a
// plane after all blocks, so every payload is 4- or 16-byte aligned.
//
// EPI: 0 store, 1 add into out (the residual), 2 silu(W.x) * (W2.x) (the MLP's gate and up).

// Payload bytes per block in plane A, and weights per block.
template <int TY> struct Blk;
template <> struct Blk<T_Q4_0> { enum { QK = 32, A = 16, UNIT = 32 }; };
template <> struct Blk<T_Q5_0> { enum { QK = 32, A = 20, UNIT = 32 }; };
template <> struct Blk<T_Q8_0> { enum { QK = 32, A = 32, UNIT = 32 }; };
template <> struct Blk<T_Q4_K> { enum { QK = 256, A = 144, UNIT = 64 }; };
template <> struct Blk<T_Q6_K> { enum { QK = 256, A = 208, UNIT = 64 }; };

__device__ __forceinline__ int spread4(u32 b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

__device__ __forceinline__ void get_scale_min_k4(int j, const u8* q, int& d, int& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// One 32-weight piece in int8 form: value_i = a(i) * q_i + b, a = a0 for i < 16, a1 after.
struct Piece {
    int q[8];
    float a0, a1, b;
};

// Adds piece P's dot with every token's activations.
template <int NT>
__device__ __forceinline__ void piece_acc(const Piece& w, int P, const i8* __restrict__ xq,
                                          const float2* __restrict__ xd, int xld, float* acc) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int4* xp = (const int4*)(xq + (u64)t * xld + 32 * P);
        int4 x0 = xp[0], x1 = xp[1];
        int lo = __dp4a(w.q[0], x0.x, __dp4a(w.q[1], x0.y, __dp4a(w.q[2], x0.z, __dp4a(w.q[3], x0.w, 0))));
        int hi = __dp4a(w.q[4], x1.x, __dp4a(w.q[5], x1.y, __dp4a(w.q[6], x1.z, __dp4a(w.q[7], x1.w, 0))));
        float2 ds = xd[t * (xld / 32) + P];
        acc[t] += ds.x * (w.a0 * (float)lo + w.a1 * (float)hi) + w.b * ds.y;
    }
}

// Unit u of row `row` (UNIT weights): its one or two pieces, accumulated into acc.
template <int TY, int NT>
__device__ __forceinline__ void unit_acc(const u8* __restrict__ W, u64 nblk, int row, int bpr, int u,
                                         const i8* __restrict__ xq, const float2* __restrict__ xd,
                                         int xld, float* acc) {
    Piece w;
    if (TY == T_Q4_0 || TY == T_Q5_0 || TY == T_Q8_0) {
        u64 blk = (u64)row * bpr + u;
        const u8* a = W + blk * Blk<TY>::A;
        float d = h2f(((const u16*)(W + nblk * Blk<TY>::A))[blk]);
        w.a0 = w.a1 = d;
        if (TY == T_Q8_0) {
            int4 v0 = ((const int4*)a)[0], v1 = ((const int4*)a)[1];
            w.q[0] = v0.x; w.q[1] = v0.y; w.q[2] = v0.z; w.q[3] = v0.w;
            w.q[4] = v1.x; w.q[5] = v1.y; w.q[6] = v1.z; w.q[7] = v1.w;
            w.b = 0.f;
        } else if (TY == T_Q4_0) {
            int4 v = *(const int4*)a;
            int vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w.q[i] = vs[i] & 0x0F0F0F0F;
                w.q[4 + i] = (vs[i] >> 4) & 0x0F0F0F0F;
            }
            w.b = -8.f * d;
        } else {  // Q5_0: qh (4 bytes) then qs (16 bytes)
            const u32* p = (const u32*)a;
            u32 qh = p[0];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 qs = p[1 + i];
                w.q[i] = (int)(qs & 0x0F0F0F0Fu) | spread4(qh >> (4 * i));
                w.q[4 + i] = (int)((qs >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * i));
            }
            w.b = -16.f * d;
        }
        piece_acc<NT>(w, u, xq, xd, xld, acc);
    } else if (TY == T_Q4_K) {
        // unit = 64 weights: sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) of chunk c
        int b = u >> 2, c = u & 3;
        const u8* blk = W + ((u64)row * bpr + b) * 144;
        float d = h2f(*(const u16*)blk), dmin = h2f(*(const u16*)(blk + 2));
        const u8* sc = blk + 4;
        const int4* qp = (const int4*)(blk + 16 + 32 * c);
        int4 v0 = qp[0], v1 = qp[1];
        int vs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int s, m;
            get_scale_min_k4(2 * c + h, sc, s, m);
#pragma unroll
            for (int i = 0; i < 8; i++) w.q[i] = (vs[i] >> (4 * h)) & 0x0F0F0F0F;
            w.a0 = w.a1 = d * (float)s;
            w.b = -dmin * (float)m;
            piece_acc<NT>(w, b * 8 + 2 * c + h, xq, xd, xld, acc);
        }
    } else if (TY == T_Q6_K) {
        // unit = pieces pp and pp + 2 of half n: they share the ql bytes (low / high nibbles)
        int b = u >> 2, n = (u >> 1) & 1, pp = u & 1;
        u64 bi = (u64)row * bpr + b;
        const u8* blk = W + bi * 208;
        float d = h2f(((const u16*)(W + nblk * 208))[bi]);
        const int4* qlp = (const int4*)(blk + 64 * n + 32 * pp);
        const int4* qhp = (const int4*)(blk + 128 + 32 * n);
        const i8* sc = (const i8*)(blk + 192 + 8 * n);
        int4 l0 = qlp[0], l1 = qlp[1], h0 = qhp[0], h1 = qhp[1];
        int ls[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        int hs[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int p = pp + 2 * h;  // piece within the half
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int lo = (ls[i] >> (4 * h)) & 0x0F0F0F0F;
                int hi = ((hs[i] >> (2 * p)) & 0x03030303) << 4;
                w.q[i] = __vsubss4(lo | hi, 0x20202020);
            }
            w.a0 = d * (float)sc[2 * p];
            w.a1 = d * (float)sc[2 * p + 1];
            w.b = 0.f;
            piece_acc<NT>(w, b * 8 + 4 * n + p, xq, xd, xld, acc);
        }
    }
}

// Sums each row's partial dots over its WPR warps and applies the epilogue.
template <int NT, int EPI, int WPR>
__device__ __forceinline__ void mv_finish(float* acc, float* acc2, bool active, int row, float* __restrict__ out, int old) {
    __shared__ float red[4][NT], red2[4][NT];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        float v2 = EPI == 2 ? warp_sum(acc2[t]) : 0.f;
        if (WPR > 1) {
            if (lane == 0) { red[warp][t] = v; red2[warp][t] = v2; }
        } else if (lane == 0 && active) {
            float* o = out + (u64)t * old + row;
            if (EPI == 0) *o = v;
            else if (EPI == 1) *o += v;
            else *o = silu(v) * v2;
        }
    }
    if (WPR > 1) {
        __syncthreads();
        if (lane == 0 && warp % WPR == 0 && active) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = 0.f, v2 = 0.f;
                for (int k = 0; k < WPR; k++) { v += red[warp + k][t]; v2 += red2[warp + k][t]; }
                float* o = out + (u64)t * old + row;
                if (EPI == 0) *o = v;
                else if (EPI == 1) *o += v;
                else *o = silu(v) * v2;
            }
        }
    }
}

// WPR warps share one row (long rows: more loads in flight per row, shorter chains).
template <int TY, int NT, int EPI, int WPR>
__device__ __forceinline__ void mv_q(const u8* __restrict__ W, const u8* __restrict__ W2, int rows,
                                     int cols, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                     int xld, float* __restrict__ out, int old) {
    int warp = threadIdx.x >> 5;
    int row = blockIdx.x * (4 / WPR) + warp / WPR;
    int lr = (warp % WPR) * 32 + (threadIdx.x & 31);
    bool active = row < rows;
    int bpr = cols / Blk<TY>::QK;
    u64 nblk = (u64)rows * bpr;
    int units = active ? cols / Blk<TY>::UNIT : 0;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.f;
#pragma unroll 2
    for (int u = lr; u < units; u += 32 * WPR) {
        unit_acc<TY, NT>(W, nblk, row, bpr, u, xq, xd, xld, acc);
        if (EPI == 2) unit_acc<TY, NT>(W2, nblk, row, bpr, u, xq, xd, xld, acc2);
    }
    mv_finish<NT, EPI, WPR>(acc, acc2, active, row, out, old);
}

// One token, R rows per warp (decode): each lane keeps R rows' (and, for the SwiGLU, both
// matrices') loads in flight before it waits, instead of one unit at a time; no branch between
// them (rows past the end re-read the last row, only the stores are guarded). Rows
// row0 .. row0 + R - 1 of W (and W2); out gets the epilogue as in mv_finish.
template <int TY, int EPI, int R>
__device__ __forceinline__ void rows_acc(const u8* __restrict__ W, const u8* __restrict__ W2, int rows,
                                         int cols, int row0, const i8* __restrict__ xq,
                                         const float2* __restrict__ xd, float* __restrict__ out) {
    int lane = threadIdx.x & 31;
    int bpr = cols / Blk<TY>::QK;
    u64 nblk = (u64)rows * bpr;
    int units = cols / Blk<TY>::UNIT;
    float acc[R][1], acc2[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = acc2[r][0] = 0.f;
#pragma unroll 2
    for (int u = lane; u < units; u += 32) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(row0 + r, rows - 1);
            unit_acc<TY, 1>(W, nblk, row, bpr, u, xq, xd, cols, acc[r]);
            if (EPI == 2) unit_acc<TY, 1>(W2, nblk, row, bpr, u, xq, xd, cols, acc2[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r][0]);
        float v2 = EPI == 2 ? warp_sum(acc2[r][0]) : 0.f;
        if (lane == 0 && row0 + r < rows) {
            float* o = out + row0 + r;
            if (EPI == 0) *o = v;
            else if (EPI == 1) *o += v;
            else *o = silu(v) * v2;
        }
    }
}

// Before it waits on the previous kernel (GRID_DEP), a one-token mat-vec starts pulling the
// first 512 bytes of each of its n rows from row0 into L2: weights never depend on an earlier
// kernel, and the DRAM latency of the first loads then overlaps the previous kernel's tail.
template <int TY>
__device__ __forceinline__ void prefetch_rows(const u8* W, int rows, int cols, int row0, int n) {
    int lane = threadIdx.x & 31;
    u64 rb = (u64)(cols / Blk<TY>::QK) * Blk<TY>::A;
    int lines = (int)min((rb + 127) / 128, (u64)4);
    for (int i = lane; i < n * lines; i += 32) {
        u64 r = (u64)min(row0 + i / lines, rows - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(W + r * rb + (u64)(i % lines) * 128));
    }
}

// One token, short rows: a K-quant row of 1024 columns is 16 units, so a warp per row leaves
// half its lanes idle (every mat-vec of a 1024-wide model, the 248k-row output included). Here
// each half-warp takes rows instead: lane l of half h takes units l, l + 16, ... of rows
// row0 + 2r + h (r < R), sums over its half (xor shuffles below 16 stay in it), and lane 0 of
// the half stores. Rows past the end re-read the last row; only the stores are guarded.
__device__ __forceinline__ float half_warp_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int TY, int EPI, int R>
__device__ __forceinline__ void half_rows_acc(const u8* __restrict__ W, const u8* __restrict__ W2,
                                              int rows, int cols, int row0, const i8* __restrict__ xq,
                                              const float2* __restrict__ xd, float* __restrict__ out) {
    int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    int bpr = cols / Blk<TY>::QK;
    u64 nblk = (u64)rows * bpr;
    int units = cols / Blk<TY>::UNIT;
    float acc[R][1], acc2[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = acc2[r][0] = 0.f;
#pragma unroll 2
    for (int u = hl; u < units; u += 16) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(row0 + 2 * r + half, rows - 1);
            unit_acc<TY, 1>(W, nblk, row, bpr, u, xq, xd, cols, acc[r]);
            if (EPI == 2) unit_acc<TY, 1>(W2, nblk, row, bpr, u, xq, xd, cols, acc2[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = half_warp_sum(acc[r][0]);
        float v2 = EPI == 2 ? half_warp_sum(acc2[r][0]) : 0.f;
        int row = row0 + 2 * r + half;
        if (hl == 0 && row < rows) {
            float* o = out + row;
            if (EPI == 0) *o = v;
            else if (EPI == 1) *o += v;
            else *o = silu(v) * v2;
        }
    }
}

// mv_<type>_1_<epi>_h<R>: 2R rows per warp, R per half-warp.
#define MVH1(NAME, TY, EPI, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) mv_##NAME##_1_##EPI##_h##R(                \
        const u8* W, const u8* W2, int rows, int cols, const i8* xq, const float2* xd, int xld,  \
        const float* xf, float* out, int old) {                                                  \
        int row0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * 2 * R;                               \
        prefetch_rows<TY>(W, rows, cols, row0, 2 * R);                                           \
        if (EPI == 2) prefetch_rows<TY>(W2, rows, cols, row0, 2 * R);                            \
        GRID_DEP();                                                                              \
        half_rows_acc<TY, EPI, R>(W, W2, rows, cols, row0, xq, xd, out);                         \
    }
#define MVH(NAME, TY) MVH1(NAME, TY, 0, 1) MVH1(NAME, TY, 1, 1) MVH1(NAME, TY, 2, 1) \
    MVH1(NAME, TY, 0, 2) MVH1(NAME, TY, 1, 2) MVH1(NAME, TY, 2, 2)
MVH(q4_0, T_Q4_0)
MVH(q5_0, T_Q5_0)
MVH(q8_0, T_Q8_0)
MVH(q4_k, T_Q4_K)
MVH(q6_k, T_Q6_K)

#define MVR1(NAME, TY, EPI, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) mv_##NAME##_1_##EPI##_r##R(                \
        const u8* W, const u8* W2, int rows, int cols, const i8* xq, const float2* xd, int xld,  \
        const float* xf, float* out, int old) {                                                  \
        int row0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * R;                                   \
        prefetch_rows<TY>(W, rows, cols, row0, R);                                               \
        if (EPI == 2) prefetch_rows<TY>(W2, rows, cols, row0, R);                                \
        GRID_DEP();                                                                              \
        rows_acc<TY, EPI, R>(W, W2, rows, cols, row0, xq, xd, out);                              \
    }
#define MVR(NAME, TY) MVR1(NAME, TY, 0, 1) MVR1(NAME, TY, 1, 1) MVR1(NAME, TY, 2, 1) \
    MVR1(NAME, TY, 0, 2) MVR1(NAME, TY, 1, 2) MVR1(NAME, TY, 2, 2)                   \
    MVR1(NAME, TY, 0, 4) MVR1(NAME, TY, 1, 4) MVR1(NAME, TY, 2, 4)
MVR(q4_0, T_Q4_0)
MVR(q5_0, T_Q5_0)
MVR(q8_0, T_Q8_0)
MVR(q4_k, T_Q4_K)
MVR(q6_k, T_Q6_K)

// Reads n16 16-byte words (four loads in flight a thread) and keeps nothing: gpu-check --perf's
// floor for a one-kernel read of as many bytes as a mat-vec's weights.
extern "C" __global__ void __launch_bounds__(128) read_floor(const int4* p, u64 n16, int* sink) {
    int4 a = make_int4(0, 0, 0, 0);
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += 4 * stride) {
        int4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j * stride < n16 ? p[i + j * stride] : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) { a.x ^= v[j].x; a.y ^= v[j].y; a.z ^= v[j].z; a.w ^= v[j].w; }
    }
    if ((a.x & a.y & a.z & a.w) == 0x7fffffff) *sink = a.x;
}

// F32 / F16 weights dot f32 activations (tiny models, norms kept as matrices, F16 outputs).
template <int TY, int NT>
__device__ __forceinline__ void unit_acc_f(const u8* __restrict__ W, int row, int cols, int u,
                                           const float* __restrict__ xf, int xld, float* acc) {
    float w[8];
    if (TY == T_F32) {
        const float4* p = (const float4*)(W + ((u64)row * cols + 8 * u) * 4);
        float4 a = p[0], b = p[1];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
        uint4 v = *(const uint4*)(W + ((u64)row * cols + 8 * u) * 2);
        u32 vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = h2f((u16)(vs[i] & 0xFFFF));
            w[2 * i + 1] = h2f((u16)(vs[i] >> 16));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4* xp = (const float4*)(xf + (u64)t * xld + 8 * u);
        float4 a = xp[0], b = xp[1];
        acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                  w[6] * b.z + w[7] * b.w;
    }
}

template <int TY, int NT, int EPI, int WPR>
__device__ __forceinline__ void mv_f(const u8* __restrict__ W, const u8* __restrict__ W2, int rows,
                                     int cols, const float* __restrict__ xf, int xld,
                                     float* __restrict__ out, int old) {
    int warp = threadIdx.x >> 5;
    int row = blockIdx.x * (4 / WPR) + warp / WPR;
    int lr = (warp % WPR) * 32 + (threadIdx.x & 31);
    bool active = row < rows;
    int units = active ? cols / 8 : 0;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.f;
    for (int u = lr; u < units; u += 32 * WPR) {
        unit_acc_f<TY, NT>(W, row, cols, u, xf, xld, acc);
        if (EPI == 2) unit_acc_f<TY, NT>(W2, row, cols, u, xf, xld, acc2);
    }
    mv_finish<NT, EPI, WPR>(acc, acc2, active, row, out, old);
}

#define MVQ1(NAME, TY, NT, EPI, WPR)                                                            \
    extern "C" __global__ void __launch_bounds__(128) mv_##NAME##_##NT##_##EPI##_##WPR(         \
        const u8* W, const u8* W2, int rows, int cols, const i8* xq, const float2* xd, int xld,  \
        const float* xf, float* out, int old) { GRID_DEP();                                                  \
        mv_q<TY, NT, EPI, WPR>(W, W2, rows, cols, xq, xd, xld, out, old);                        \
    }
#define MVF1(NAME, TY, NT, EPI, WPR)                                                            \
    extern "C" __global__ void __launch_bounds__(128) mv_##NAME##_##NT##_##EPI##_##WPR(         \
        const u8* W, const u8* W2, int rows, int cols, const i8* xq, const float2* xd, int xld,  \
        const float* xf, float* out, int old) { GRID_DEP();                                                  \
        mv_f<TY, NT, EPI, WPR>(W, W2, rows, cols, xf, xld, out, old);                            \
    }
#define MVQ(NAME, TY, NT, EPI) MVQ1(NAME, TY, NT, EPI, 1) MVQ1(NAME, TY, NT, EPI, 2) MVQ1(NAME, TY, NT, EPI, 4)
#define MVF(NAME, TY, NT, EPI) MVF1(NAME, TY, NT, EPI, 1) MVF1(NAME, TY, NT, EPI, 4)
#define MV_NT(M, NAME, TY, EPI) M(NAME, TY, 1, EPI) M(NAME, TY, 2, EPI) M(NAME, TY, 4, EPI) M(NAME, TY, 8, EPI)
#define MV_ALL(M, NAME, TY) MV_NT(M, NAME, TY, 0) MV_NT(M, NAME, TY, 1) MV_NT(M, NAME, TY, 2)
MV_ALL(MVQ, q4_0, T_Q4_0)
MV_ALL(MVQ, q5_0, T_Q5_0)
MV_ALL(MVQ, q8_0, T_Q8_0)
MV_ALL(MVQ, q4_k, T_Q4_K)
MV_ALL(MVQ, q6_k, T_Q6_K)
MV_ALL(MVF, f32, T_F32)
MV_ALL(MVF, f16, T_F16)

// Up to four matrices over the same activations in one launch (q, k and v of attention; qkv, z,
// alpha and beta of a DeltaNet layer):
// warp g of the grid takes row g of the concatenated rows, whatever each matrix's type.
template <int TY, int NT>
__device__ __forceinline__ void mvx_row(const u8* W, int rows, int cols, int row, const i8* xq,
                                        const float2* xd, const float* xf, float* out) {
    int lane = threadIdx.x & 31;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.f;
    if constexpr (TY == T_F32 || TY == T_F16) {
        for (int u = lane; u < cols / 8; u += 32) unit_acc_f<TY, NT>(W, row, cols, u, xf, cols, acc);
    } else {
        int bpr = cols / Blk<TY>::QK;
        u64 nblk = (u64)rows * bpr;
#pragma unroll 2
        for (int u = lane; u < cols / Blk<TY>::UNIT; u += 32) unit_acc<TY, NT>(W, nblk, row, bpr, u, xq, xd, cols, acc);
    }
    mv_finish<NT, 0, 1>(acc, acc2, true, row, out, rows);
}

template <int NT>
__device__ __forceinline__ void mvx(const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1,
                                    float* o1, const u8* W2, int r2, int t2, float* o2, const u8* W3,
                                    int r3, int t3, float* o3, int cols, const i8* xq, const float2* xd,
                                    const float* xf) {
    int g = blockIdx.x * 4 + (threadIdx.x >> 5);
    const u8* W;
    int rows, ty, row;
    float* out;
    if (g < r0) { W = W0; rows = r0; ty = t0; row = g; out = o0; }
    else if (g < r0 + r1) { W = W1; rows = r1; ty = t1; row = g - r0; out = o1; }
    else if (g < r0 + r1 + r2) { W = W2; rows = r2; ty = t2; row = g - r0 - r1; out = o2; }
    else if (g < r0 + r1 + r2 + r3) { W = W3; rows = r3; ty = t3; row = g - r0 - r1 - r2; out = o3; }
    else return;
    switch (ty) {
    case T_F32: mvx_row<T_F32, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_F16: mvx_row<T_F16, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q4_0: mvx_row<T_Q4_0, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q5_0: mvx_row<T_Q5_0, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q8_0: mvx_row<T_Q8_0, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q4_K: mvx_row<T_Q4_K, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q6_K: mvx_row<T_Q6_K, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    }
}

// One token, R rows per warp: warp g takes rows g*R .. g*R + R - 1 of the concatenation, which
// lie in one matrix when every matrix's row count is a multiple of R (the host checks).
template <int R>
__device__ __forceinline__ void mvx_r(const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1,
                                      float* o1, const u8* W2, int r2, int t2, float* o2, const u8* W3,
                                      int r3, int t3, float* o3, int cols, const i8* xq, const float2* xd,
                                      const float* xf) {
    int g = (blockIdx.x * 4 + (threadIdx.x >> 5)) * R;
    const u8* W;
    int rows, ty, row;
    float* out;
    if (g < r0) { W = W0; rows = r0; ty = t0; row = g; out = o0; }
    else if (g < r0 + r1) { W = W1; rows = r1; ty = t1; row = g - r0; out = o1; }
    else if (g < r0 + r1 + r2) { W = W2; rows = r2; ty = t2; row = g - r0 - r1; out = o2; }
    else if (g < r0 + r1 + r2 + r3) { W = W3; rows = r3; ty = t3; row = g - r0 - r1 - r2; out = o3; }
    else return;
    switch (ty) {
    case T_Q4_0: rows_acc<T_Q4_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q5_0: rows_acc<T_Q5_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q8_0: rows_acc<T_Q8_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q4_K: rows_acc<T_Q4_K, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q6_K: rows_acc<T_Q6_K, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    default:  // f32 / f16 (the host takes R = 1 for those)
        for (int r = 0; r < R && row + r < rows; r++) {
            if (ty == T_F32) mvx_row<T_F32, 1>(W, rows, cols, row + r, xq, xd, xf, out);
            else mvx_row<T_F16, 1>(W, rows, cols, row + r, xq, xd, xf, out);
        }
    }
}
// As mvx_r, half-warp rows (short rows): warp g takes rows 2gR .. 2gR + 2R - 1 of the
// concatenation, inside one matrix when every matrix's row count is a multiple of 2R.
template <int R>
__device__ __forceinline__ void mvx_h(const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1,
                                      float* o1, const u8* W2, int r2, int t2, float* o2, const u8* W3,
                                      int r3, int t3, float* o3, int cols, const i8* xq, const float2* xd) {
    int g = (blockIdx.x * 4 + (threadIdx.x >> 5)) * 2 * R;
    const u8* W;
    int rows, ty, row;
    float* out;
    if (g < r0) { W = W0; rows = r0; ty = t0; row = g; out = o0; }
    else if (g < r0 + r1) { W = W1; rows = r1; ty = t1; row = g - r0; out = o1; }
    else if (g < r0 + r1 + r2) { W = W2; rows = r2; ty = t2; row = g - r0 - r1; out = o2; }
    else if (g < r0 + r1 + r2 + r3) { W = W3; rows = r3; ty = t3; row = g - r0 - r1 - r2; out = o3; }
    else return;
    switch (ty) {
    case T_Q4_0: half_rows_acc<T_Q4_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q5_0: half_rows_acc<T_Q5_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q8_0: half_rows_acc<T_Q8_0, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q4_K: half_rows_acc<T_Q4_K, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q6_K: half_rows_acc<T_Q6_K, 0, R>(W, W, rows, cols, row, xq, xd, out); break;
    default: break;  // f32 / f16: the host never picks this kernel for them
    }
}
#define MVXH(R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) mvx_1_h##R(                                \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx_h<R>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd);  \
    }
MVXH(1) MVXH(2)

#define MVXR(R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) mvx_1_r##R(                                \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx_r<R>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd, xf); \
    }
MVXR(2) MVXR(4)

#define MVX(NT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) mvx_##NT(                                  \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx<NT>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd, xf); \
    }
MVX(1) MVX(2) MVX(4) MVX(8)
