// Attention over the paged f16 KV cache (flash-decoding): each query's context 0..=pos is cut
// into n_splits equal ranges, one block of 4 warps per (head, token, range) keeps an online
// softmax, and attn_combine merges the ranges. The split count is fixed per launch and the
// range length is computed from the token's position on the device, so one captured graph
// serves every step of a decode.
//
// Cache layout: row = block_id * block_size + pos % block_size, each row [n_kv * hd] f16; a
// token's block table is tables[tbl_off[t] ..].

#define ATT_WARPS 4
#define ATT_MAXE 8  // head_dim <= 256

// partial[(t * n_heads + h) * n_splits + s] = {m, l, acc[hd]} (stride hd + 2 floats)
extern "C" __global__ void __launch_bounds__(128) attn_split(
    const float* Q, int n_heads, int n_kv, int hd, const u16* kc, const u16* vc, int block_size,
    const int* pos, const int* tbl_off, const int* tables, int n_splits, float scale, float* partial) { GRID_DEP();
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (n_heads / n_kv);
    int kv_dim = n_kv * hd;
    int len = pos[t] + 1;
    int chunk = (len + n_splits - 1) / n_splits;
    int p0 = s * chunk, p1 = min(len, p0 + chunk);
    const float* q = Q + (u64)t * n_heads * hd + h * hd;
    float qr[ATT_MAXE], acc[ATT_MAXE];
#pragma unroll
    for (int e = 0; e < ATT_MAXE; e++) {
        int i = lane + 32 * e;
        qr[e] = i < hd ? q[i] * scale : 0.f;
        acc[e] = 0.f;
    }
    const int* tbl = tables + tbl_off[t];
    float m = -INFINITY, l = 0.f;
    for (int p = p0 + warp; p < p1; p += ATT_WARPS) {
        u64 row = (u64)tbl[p / block_size] * block_size + p % block_size;
        const u16* k = kc + row * kv_dim + kvh * hd;
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; e++) {
            int i = lane + 32 * e;
            if (i < hd) d += qr[e] * h2f(k[i]);
        }
        d = warp_sum(d);
        float m2 = fmaxf(m, d);
        float corr = __expf(m - m2), w = __expf(d - m2);
        l = l * corr + w;
        const u16* v = vc + row * kv_dim + kvh * hd;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; e++) {
            int i = lane + 32 * e;
            acc[e] = acc[e] * corr + (i < hd ? w * h2f(v[i]) : 0.f);
        }
        m = m2;
    }
    // merge the 4 warps
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], sacc[ATT_WARPS][32 * ATT_MAXE];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int e = 0; e < ATT_MAXE; e++) sacc[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    float* out = partial + ((u64)(t * n_heads + h) * n_splits + s) * (hd + 2);
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) a += sm[w] == -INFINITY ? 0.f : sacc[w][i] * __expf(sm[w] - M);
        out[2 + i] = a;
    }
    if (threadIdx.x == 0) {
        float L = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) L += sm[w] == -INFINITY ? 0.f : sl[w] * __expf(sm[w] - M);
        out[0] = M;
        out[1] = L;
    }
}

// Grid (tokens, parts), 256 threads: merges the splits of every head into out [q_dim] and,
// when q is not null, quantizes the row for the output projection; block (t, p) takes the
// 32-wide chunks p*8 + warp, p*8 + warp + 8*parts, ... of token t.
extern "C" __global__ void __launch_bounds__(256) attn_combine(const float* partial, int n_heads, int hd,
                                                               int n_splits, float* out, i8* q, float2* qd) { GRID_DEP();
    int t = blockIdx.x, qdim = n_heads * hd;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = blockIdx.y * 8 + warp; c < (qdim + 31) / 32; c += gridDim.y * 8) {
        int i = 32 * c + lane;
        float v = 0.f;
        if (i < qdim) {
            int h = i / hd, e = i % hd;
            const float* p = partial + (u64)(t * n_heads + h) * n_splits * (hd + 2);
            float M = -INFINITY;
#pragma unroll 8
            for (int s = 0; s < n_splits; s++) M = fmaxf(M, p[s * (hd + 2)]);
            float a = 0.f, L = 0.f;
#pragma unroll 8
            for (int s = 0; s < n_splits; s++) {
                float ms = p[s * (hd + 2)];
                if (ms == -INFINITY) continue;
                float f = __expf(ms - M);
                L += p[s * (hd + 2) + 1] * f;
                a += p[s * (hd + 2) + 2 + e] * f;
            }
            v = a / L;
            out[(u64)t * qdim + i] = v;
        }
        if (q != nullptr) quant32(v, q + (u64)t * qdim + 32 * c, qd + (u64)t * (qdim / 32) + c);
    }
}

// attn_split with four positions per warp step: each group of 8 lanes takes one position and
// holds EPL = head_dim / 8 contiguous dims of it (16-byte loads of K and V), so a position
// costs a 3-step reduction instead of a 5-step one and every load is wide. Same partials.
template <int EPL>
__device__ __forceinline__ void load_h(const u16* p, float* out) {
    if constexpr (EPL % 8 == 0) {
#pragma unroll
        for (int c = 0; c < EPL / 8; c++) {
            uint4 v = ((const uint4*)p)[c];
            u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                out[8 * c + 2 * i] = h2f((u16)(w[i] & 0xFFFF));
                out[8 * c + 2 * i + 1] = h2f((u16)(w[i] >> 16));
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) out[e] = h2f(p[e]);
    }
}

template <int EPL>
__device__ __forceinline__ void attn_split_g(const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc,
                                             int block_size, const int* pos, const int* tbl_off, const int* tables,
                                             int n_splits, float scale, float* partial) {
    const int hd = 8 * EPL;
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 3, gl = lane & 7;
    int kvh = h / (n_heads / n_kv);
    int kv_dim = n_kv * hd;
    int len = pos[t] + 1;
    int chunk = (len + n_splits - 1) / n_splits;
    int p0 = s * chunk, p1 = min(len, p0 + chunk);
    const float* q = Q + (u64)t * n_heads * hd + h * hd + gl * EPL;
    float qr[EPL], acc[EPL], kv[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) { qr[e] = q[e] * scale; acc[e] = 0.f; }
    const int* tbl = tables + tbl_off[t];
    float m = -INFINITY, l = 0.f;
    for (int base = p0 + 4 * warp; base < p1; base += 4 * ATT_WARPS) {
        int p = base + g;
        bool ok = p < p1;
        u64 row = ok ? (u64)tbl[p / block_size] * block_size + p % block_size : 0;
        float d = 0.f;
        if (ok) {
            load_h<EPL>(kc + row * kv_dim + kvh * hd + gl * EPL, kv);
#pragma unroll
            for (int e = 0; e < EPL; e++) d += qr[e] * kv[e];
        }
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        d += __shfl_xor_sync(0xffffffffu, d, 4);
        if (ok) {
            float m2 = fmaxf(m, d);
            float corr = __expf(m - m2), w = __expf(d - m2);
            l = l * corr + w;
            load_h<EPL>(vc + row * kv_dim + kvh * hd + gl * EPL, kv);
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[e] = acc[e] * corr + w * kv[e];
            m = m2;
        }
    }
    // merge the four groups of the warp (lanes gl, gl+8, gl+16, gl+24 hold the same dims)
#pragma unroll
    for (int off = 8; off <= 16; off <<= 1) {
        float mo = __shfl_xor_sync(0xffffffffu, m, off), lo = __shfl_xor_sync(0xffffffffu, l, off);
        float M = fmaxf(m, mo);
        float a = m == -INFINITY ? 0.f : __expf(m - M), b = mo == -INFINITY ? 0.f : __expf(mo - M);
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[e] = acc[e] * a + __shfl_xor_sync(0xffffffffu, acc[e], off) * b;
        l = l * a + lo * b;
        m = M;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], sacc[ATT_WARPS][256];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    if (g == 0) {
#pragma unroll
        for (int e = 0; e < EPL; e++) sacc[warp][gl * EPL + e] = acc[e];
    }
    __syncthreads();
    float* out = partial + ((u64)(t * n_heads + h) * n_splits + s) * (hd + 2);
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) a += sm[w] == -INFINITY ? 0.f : sacc[w][i] * __expf(sm[w] - M);
        out[2 + i] = a;
    }
    if (threadIdx.x == 0) {
        float L = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) L += sm[w] == -INFINITY ? 0.f : sl[w] * __expf(sm[w] - M);
        out[0] = M;
        out[1] = L;
    }
}

#define ATTG(EPL)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) attn_split_g##EPL(                            \
        const float* Q, int n_heads, int n_kv, int hd, const u16* kc, const u16* vc, int block_size, \
        const int* pos, const int* tbl_off, const int* tables, int n_splits, float scale, float* partial) { GRID_DEP(); \
        attn_split_g<EPL>(Q, n_heads, n_kv, kc, vc, block_size, pos, tbl_off, tables, n_splits, scale, partial); \
    }
ATTG(2) ATTG(8) ATTG(16) ATTG(32)
