// Row-wise kernels: RMSNorm (with the 8-bit quantization of its output for the mat-vec fused
// in), quantize, the q/k/v epilogue (bias, per-head norm, RoPE, KV-cache write, fused), token
// embeddings, row picking, and dequantization to f16 for the cuBLAS prefill path.

// Rows of n over grid (rows, parts), 256 threads: block (r, p) writes the 32-wide chunks
// p*8 + warp, p*8 + warp + 8*parts, ... of row r: out = x / rms(x) * w, and the int8 blocks of
// `out` when q is not null (n a multiple of 32). Every block sums the squares of the whole row
// itself (a few KB from L2), so a decode step's norm is many blocks, not one. `out` may be `x`
// only with one part. A decode norm is latency: the weights of the warp's first chunk are
// loaded before the wait on the previous kernel, and after it the row's loads go out at once
// (16-byte loads, four in flight a thread, with the first chunk's inputs), one round trip.
extern "C" __global__ void __launch_bounds__(256) rms_norm_q(const float* x, const float* w, float* out,
                                                             i8* q, float2* qd, int n, float eps) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int first = (blockIdx.y * 8 + warp) * 32;
    const float w0 = first + lane < n ? w[first + lane] : 0.f;
    GRID_DEP();
    const float* xr = x + (u64)blockIdx.x * n;
    const float x0 = first + lane < n ? xr[first + lane] : 0.f;
    const float scale = rms_scale_256(xr, n, eps);
    float* orow = out + (u64)blockIdx.x * n;
    for (int base = first; base < n; base += gridDim.y * 256) {
        int i = base + lane;
        float xi = base == first ? x0 : i < n ? xr[i] : 0.f;
        float wi = base == first ? w0 : i < n ? w[i] : 0.f;
        float v = i < n ? xi * scale * wi : 0.f;
        if (i < n) orow[i] = v;
        if (q != nullptr) quant32(v, q + (u64)blockIdx.x * n + base, qd + (u64)blockIdx.x * (n / 32) + base / 32);
    }
}

// int8 blocks of rows of n (a multiple of 32), grid (rows, parts) as rms_norm_q.
extern "C" __global__ void __launch_bounds__(256) quantize_q(const float* x, i8* q, float2* qd, int n) { GRID_DEP();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int base = (blockIdx.y * 8 + warp) * 32; base < n; base += gridDim.y * 256) {
        quant32(x[(u64)blockIdx.x * n + base + lane], q + (u64)blockIdx.x * n + base,
                qd + (u64)blockIdx.x * (n / 32) + base / 32);
    }
}

extern "C" __global__ void to_f16(const float* x, u16* out, u64 n) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(x[i]);
}

// The q/k/v epilogue of attention, one block per (token, head) over the Q heads, then the K
// heads, then the V heads: + bias (if given), RMSNorm of the head (if a weight is given),
// RoPE (q and k, if rope_dim > 0), then K and V go to the cache as f16 at row kv_row[t] and Q
// back in place (K and V too, in place, when kc is null). blockDim = head_dim rounded up to 32.
// The bias and norm weights, the position and its rotation, and the cache row never come from
// the previous kernel: all before the wait, only q / k / v after it.
extern "C" __global__ void qkv_epilogue(float* Q, float* K, float* V, int n_heads, int n_kv,
                                        int hd, const float* bq, const float* bk, const float* bv,
                                        const float* qn, const float* kn, float eps, const int* pos,
                                        int rope_dim, float theta_scale, int neox, u16* kc, u16* vc,
                                        const int* kv_row) {
    __shared__ float s[256];
    int t = blockIdx.y, h = blockIdx.x, i = threadIdx.x;
    int kind = h < n_heads ? 0 : (h < n_heads + n_kv ? 1 : 2);
    int hh = kind == 0 ? h : (kind == 1 ? h - n_heads : h - n_heads - n_kv);
    int kv_dim = n_kv * hd;
    const float* bias = kind == 0 ? bq : (kind == 1 ? bk : bv);
    const float b = bias != nullptr && i < hd ? bias[hh * hd + i] : 0.f;
    const float* nw = kind == 0 ? qn : (kind == 1 ? kn : nullptr);
    const float wn = nw != nullptr && i < hd ? nw[i] : 0.f;
    const bool rope = kind < 2 && rope_dim > 0;
    const int half = rope_dim / 2;
    int pair = 0;
    bool first = true;
    float c = 1.f, sn = 0.f;
    if (rope && i < rope_dim) {
        pair = neox ? (i < half ? i : i - half) : i / 2;
        first = neox ? i < half : (i % 2 == 0);
        // theta = pos * theta_scale^pair, by repeated f32 products as ggml (and the CPU) do
        float theta = (float)pos[t];
        for (int k = 0; k < pair; k++) theta *= theta_scale;
        c = cosf(theta);
        sn = sinf(theta);
    }
    const u64 row = kind > 0 && kc != nullptr ? (u64)kv_row[t] : 0;
    GRID_DEP();
    const float* src = kind == 0 ? Q + (u64)t * n_heads * hd : (kind == 1 ? K : V) + (u64)t * kv_dim;
    src += hh * hd;
    float v = i < hd ? src[i] + b : 0.f;
    if (nw != nullptr) {
        float ss = block_sum(v * v);
        if (i < hd) v = v * rsqrtf(ss / (float)hd + eps) * wn;
    }
    if (rope) {
        if (i < hd) s[i] = v;
        __syncthreads();
        if (i < rope_dim) {
            float x0 = neox ? s[pair] : s[2 * pair];
            float x1 = neox ? s[pair + half] : s[2 * pair + 1];
            v = first ? fmaf(x0, c, -(x1 * sn)) : fmaf(x0, sn, x1 * c);
        }
    }
    if (i >= hd) return;
    if (kind == 0) {
        Q[(u64)t * n_heads * hd + hh * hd + i] = v;
    } else if (kc == nullptr) {
        (kind == 1 ? K : V)[(u64)t * kv_dim + hh * hd + i] = v;
    } else {
        u16* cache = kind == 1 ? kc : vc;
        cache[row * kv_dim + hh * hd + i] = f2h(v);
    }
}

// Scale and min of sub-block j (< 8) of a Q4_K block, read from its scale bytes q.
__device__ __forceinline__ void get_scale_min_k4(int j, const u8* q, int& d, int& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// A weight element as f32, from the device layout of its type (see matvec.cu).
__device__ float deq(int ty, const u8* W, int rows, int cols, u64 r, int c) {
    switch (ty) {
    case T_F32: return ((const float*)W)[r * cols + c];
    case T_F16: return h2f(((const u16*)W)[r * cols + c]);
    case T_Q5_0: case T_Q5_1: {
        u64 nb = (u64)rows * (cols / 32), blk = r * (cols / 32) + c / 32;
        int j = c % 32;
        const u8* a = W + blk * 20;
        u32 qh = (u32)a[0] | ((u32)a[1] << 8) | ((u32)a[2] << 16) | ((u32)a[3] << 24);
        u32 byte = a[4 + (j & 15)];
        u32 lo = j < 16 ? (byte & 0xFu) : (byte >> 4);
        int q = (int)(lo | (((qh >> j) & 1u) << 4));
        if (ty == T_Q5_0) return h2f(((const u16*)(W + nb * 20))[blk]) * (float)(q - 16);
        u32 dm = ((const u32*)(W + nb * 20))[blk];
        return h2f((u16)(dm & 0xFFFF)) * (float)q + h2f((u16)(dm >> 16));
    }
    case T_Q4_1: {
        u64 nb = (u64)rows * (cols / 32), blk = r * (cols / 32) + c / 32;
        int j = c % 32;
        const u8* a = W + blk * 16;
        u32 dm = ((const u32*)(W + nb * 16))[blk];
        return h2f((u16)(dm & 0xFFFF)) * (float)((j < 16 ? a[j] : a[j - 16] >> 4) & 0xF) + h2f((u16)(dm >> 16));
    }
    case T_Q5_K: {
        const u8* b = W + (r * (cols / 256) + c / 256) * 176;
        int e = c % 256, j = e / 32, l = e % 32, ch = j / 2;
        int s, m;
        get_scale_min_k4(j, b + 4, s, m);
        int q = ((b[48 + 32 * ch + l] >> (4 * (j & 1))) & 0xF) | (((b[16 + l] >> j) & 1) << 4);
        return h2f(*(const u16*)b) * (float)s * (float)q - h2f(*(const u16*)(b + 2)) * (float)m;
    }
    case T_Q4_0: case T_Q8_0: {
        int A = ty == T_Q4_0 ? 16 : 32;
        u64 blk = r * (cols / 32) + c / 32;
        int j = c % 32;
        const u8* a = W + blk * A;
        float d = h2f(((const u16*)(W + (u64)rows * (cols / 32) * A))[blk]);
        if (ty == T_Q8_0) return d * (float)((const i8*)a)[j];
        return d * (float)(((j < 16 ? a[j] : a[j - 16] >> 4) & 0xF) - 8);
    }
    case T_Q4_K: {
        const u8* b = W + (r * (cols / 256) + c / 256) * 144;
        int e = c % 256, j = e / 32, l = e % 32, ch = j / 2;
        int s, m;
        get_scale_min_k4(j, b + 4, s, m);
        int q = (b[16 + 32 * ch + l] >> (4 * (j & 1))) & 0xF;
        return h2f(*(const u16*)b) * (float)s * (float)q - h2f(*(const u16*)(b + 2)) * (float)m;
    }
    case T_Q6_K: {
        u64 bi = r * (cols / 256) + c / 256;
        const u8* b = W + bi * 208;
        float d = h2f(((const u16*)(W + (u64)rows * (cols / 256) * 208))[bi]);
        int e = c % 256, n = e / 128, p = (e % 128) / 32, l = e % 32;
        int ql = (b[64 * n + 32 * (p & 1) + l] >> (4 * (p >> 1))) & 0xF;
        int qh = (b[128 + 32 * n + l] >> (2 * p)) & 3;
        int sc = ((const i8*)(b + 192 + 8 * n))[2 * p + l / 16];
        return d * (float)sc * (float)((ql | (qh << 4)) - 32);
    }
    }
    return 0.f;
}

// out[t] = row ids[t] of the table (vocab, dim); one block per token.
extern "C" __global__ void embed_rows(int ty, const u8* W, int rows, int cols, const u32* ids, float* out) { GRID_DEP();
    u32 r = ids[blockIdx.x];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[(u64)blockIdx.x * cols + c] = deq(ty, W, rows, cols, r, c);
}

// Rows r0 .. r0 + n_rows of W as f16, for a cuBLAS GEMM.
extern "C" __global__ void dequant_f16(int ty, const u8* W, int rows, int cols, int r0, int n_rows, u16* out) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= (u64)n_rows * cols) return;
    u64 r = i / cols;
    int c = (int)(i % cols);
    out[i] = f2h(deq(ty, W, rows, cols, r0 + r, c));
}

// Weights c .. c + 7 of row r (c a multiple of 8, so they share one block and one scale) as
// f32, decoded from the device layout with one wide load of their quants.
__device__ __forceinline__ void deq8(int ty, const u8* W, int rows, int cols, u64 r, int c, float* v) {
    switch (ty) {
    case T_F16: {
        uint4 h = *(const uint4*)(W + (r * cols + c) * 2);
        u32 w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { v[2 * i] = h2f((u16)(w[i] & 0xFFFF)); v[2 * i + 1] = h2f((u16)(w[i] >> 16)); }
        return;
    }
    case T_Q4_0: case T_Q8_0: {
        int A = ty == T_Q4_0 ? 16 : 32, j = c % 32;
        u64 blk = r * (cols / 32) + c / 32;
        float d = h2f(((const u16*)(W + (u64)rows * (cols / 32) * A))[blk]);
        const u8* a = W + blk * A;
        if (ty == T_Q8_0) {
            uint2 q = *(const uint2*)(a + j);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = d * (float)(i8)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xFF);
        } else {
            uint2 q = *(const uint2*)(a + (j & 15));
            int sh = j < 16 ? 0 : 4;
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = d * (float)((int)(((i < 4 ? q.x : q.y) >> (8 * (i & 3) + sh)) & 0xF) - 8);
        }
        return;
    }
    case T_Q5_0: case T_Q5_1: {
        u64 nb = (u64)rows * (cols / 32), blk = r * (cols / 32) + c / 32;
        int j = c % 32;
        const u8* a = W + blk * 20;
        float d, o;  // value = d q + o
        if (ty == T_Q5_0) {
            d = h2f(((const u16*)(W + nb * 20))[blk]);
            o = -16.f * d;
        } else {
            u32 dm = ((const u32*)(W + nb * 20))[blk];
            d = h2f((u16)(dm & 0xFFFF));
            o = h2f((u16)(dm >> 16));
        }
        u32 qh = *(const u32*)a;
        const u32* qs = (const u32*)(a + 4 + (j & 15));
        u32 q[2] = {qs[0], qs[1]};
        int sh = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 lo = (q[i >> 2] >> (8 * (i & 3) + sh)) & 0xFu;
            u32 hi = (qh >> (j + i)) & 1u;
            v[i] = d * (float)(int)(lo | (hi << 4)) + o;
        }
        return;
    }
    case T_Q4_1: {
        u64 nb = (u64)rows * (cols / 32), blk = r * (cols / 32) + c / 32;
        int j = c % 32;
        u32 dm = ((const u32*)(W + nb * 16))[blk];
        float d = h2f((u16)(dm & 0xFFFF)), o = h2f((u16)(dm >> 16));
        uint2 q = *(const uint2*)(W + blk * 16 + (j & 15));
        int sh = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = d * (float)(((i < 4 ? q.x : q.y) >> (8 * (i & 3) + sh)) & 0xF) + o;
        return;
    }
    case T_Q4_K: case T_Q5_K: {
        bool five = ty == T_Q5_K;
        const u8* b = W + (r * (cols / 256) + c / 256) * (five ? 176 : 144);
        int e = c % 256, j = e / 32, l = e % 32;
        int s, m;
        get_scale_min_k4(j, b + 4, s, m);
        float a = h2f(*(const u16*)b) * (float)s, o = h2f(*(const u16*)(b + 2)) * (float)m;
        uint2 q = *(const uint2*)(b + (five ? 48 : 16) + 32 * (j / 2) + l);
        // Q5_K: the fifth bits, bit j of qh bytes l .. l + 7
        uint2 h = five ? *(const uint2*)(b + 16 + l) : make_uint2(0, 0);
        int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 lo = ((i < 4 ? q.x : q.y) >> (8 * (i & 3) + sh)) & 0xF;
            u32 hi = (((i < 4 ? h.x : h.y) >> (8 * (i & 3) + j)) & 1) << 4;
            v[i] = a * (float)(lo | hi) - o;
        }
        return;
    }
    case T_Q6_K: {
        u64 bi = r * (cols / 256) + c / 256;
        const u8* b = W + bi * 208;
        float d = h2f(((const u16*)(W + (u64)rows * (cols / 256) * 208))[bi]);
        int e = c % 256, n = e / 128, p = (e % 128) / 32, l = e % 32;
        uint2 ql = *(const uint2*)(b + 64 * n + 32 * (p & 1) + l);
        uint2 qh = *(const uint2*)(b + 128 + 32 * n + l);
        float a = d * (float)((const i8*)(b + 192 + 8 * n))[2 * p + l / 16];
        int sl = 4 * (p >> 1), shh = 2 * p;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = (int)(((i < 4 ? ql.x : ql.y) >> (8 * (i & 3) + sl)) & 0xF);
            int hi = (int)(((i < 4 ? qh.x : qh.y) >> (8 * (i & 3) + shh)) & 3);
            v[i] = a * (float)((lo | (hi << 4)) - 32);
        }
        return;
    }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = deq(ty, W, rows, cols, r, c + i);
}

// As dequant_f16, eight weights per thread and one 16-byte store (cols a multiple of 8): the
// per-weight form spends its time on index arithmetic and repeated scale loads (~245 us for a
// 12288 x 4096 Q4_K matrix, against ~25 us to stream it).
extern "C" __global__ void dequant_f16_x8(int ty, const u8* W, int rows, int cols, int r0, int n_rows, u16* out) { GRID_DEP();
    u32 g = blockIdx.x * blockDim.x + threadIdx.x, per_row = (u32)cols / 8;
    if (g >= (u32)n_rows * per_row) return;
    u32 r = g / per_row;
    int c = (int)(g - r * per_row) * 8;
    float v[8];
    deq8(ty, W, rows, cols, (u64)r0 + r, c, v);
    uint4 o;
    o.x = (u32)f2h(v[0]) | ((u32)f2h(v[1]) << 16);
    o.y = (u32)f2h(v[2]) | ((u32)f2h(v[3]) << 16);
    o.z = (u32)f2h(v[4]) | ((u32)f2h(v[5]) << 16);
    o.w = (u32)f2h(v[6]) | ((u32)f2h(v[7]) << 16);
    ((uint4*)out)[g] = o;
}

// out[k] = x[idx[k]] for the rows whose logits are wanted; one block per picked row.
extern "C" __global__ void pick_rows(const float* x, const int* idx, int n, float* out) { GRID_DEP();
    const float* src = x + (u64)idx[blockIdx.x] * n;
    for (int c = threadIdx.x; c < n; c += blockDim.x) out[(u64)blockIdx.x * n + c] = src[c];
}

// x[t] += b (a bias that was not fused into the q/k/v epilogue).
extern "C" __global__ void add_bias(float* x, const float* b, int n, u64 total) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % n];
}

// gate = silu(gate) * up, elementwise.
extern "C" __global__ void swiglu(float* gate, const float* up, u64 total) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < total) gate[i] = silu(gate[i]) * up[i];
}

// The argmax of each of a step's logits rows (n floats each), picked as the host's sampler
// picks: the highest value, ties to the lowest index, NaN counting as -inf (a row of nothing
// but -inf / NaN gives 0). Greedy rows then download one int instead of the row. Two launches:
// argmax_part, grid (parts, rows), 256 threads: the best (value, index) of each part of each
// row into part[row * parts + p]; argmax_merge, grid (rows), 32 threads: a row's parts into
// out[row].
__device__ __forceinline__ void argmax_keep(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

__device__ __forceinline__ void argmax_warp(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        argmax_keep(v, i, ov, oi);
    }
}

#define ARGMAX_NONE 0x7fffffff

extern "C" __global__ void __launch_bounds__(256) argmax_part(const float* x, int n, float2* part) { GRID_DEP();
    int parts = gridDim.x, per = (n + parts - 1) / parts;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    const float* xr = x + (u64)blockIdx.y * n;
    float bv = -INFINITY;
    int bi = ARGMAX_NONE;
    // a thread's indices rise, so a later equal value never replaces an earlier one
#pragma unroll 4
    for (int i = lo + threadIdx.x; i < hi; i += 256) {
        float v = xr[i];
        v = v != v ? -INFINITY : v;
        if (v > bv || bi == ARGMAX_NONE) {
            bv = v;
            bi = i;
        }
    }
    argmax_warp(bv, bi);
    __shared__ float sv[8];
    __shared__ int si[8];
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = l < 8 ? sv[l] : -INFINITY;
        bi = l < 8 ? si[l] : ARGMAX_NONE;
        argmax_warp(bv, bi);
        if (l == 0) part[(u64)blockIdx.y * parts + blockIdx.x] = make_float2(bv, __int_as_float(bi));
    }
}

extern "C" __global__ void argmax_merge(const float2* part, int parts, int* out) { GRID_DEP();
    float bv = -INFINITY;
    int bi = ARGMAX_NONE;
    for (int p = threadIdx.x; p < parts; p += 32) {
        float2 e = part[(u64)blockIdx.x * parts + p];
        argmax_keep(bv, bi, e.x, __float_as_int(e.y));
    }
    argmax_warp(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == ARGMAX_NONE ? 0 : bi;
}
