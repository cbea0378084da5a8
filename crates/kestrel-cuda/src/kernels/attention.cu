// Decode attention over the paged f16 KV cache (flash-decoding, grouped): one block of 4 warps
// per (KV head, group of up to 4 of its query heads, token, context split) reads each K/V row
// once for the whole group (GQA: the query heads of a KV head share its rows), keeps an online
// softmax per head, and the block that finishes a (token, group) last merges the splits,
// writes the output and quantizes it for the output projection: one kernel, no combine pass.
//
// A token's context 0..=pos is cut into ns = min(n_splits, ceil(len / 32)) equal ranges:
// long contexts spread over n_splits blocks per group, short ones take as many as they fill
// (one range writes its result directly). ns is computed on the device from the position, so
// one captured graph serves every step of a decode.
//
// Lanes: LPP lanes hold one position's head vector, EPL = head_dim / LPP contiguous dims each
// (16-byte loads); a warp takes 2 * 32 / LPP positions per step (two per lane group, their K
// and V loads issued together).
//
// Cache layout: row = block_id * block_size + pos % block_size, each row [n_kv * hd] f16; a
// token's block table is tables[tbl_off[t] ..]. partial[((t * n_heads + h) * n_splits + s) *
// (hd + 2)] = {m, l, acc[hd]}; count[t * gridDim.x + blockIdx.x] counts finished ranges (zero
// between launches: the merging block resets it).

#define ATT_WARPS 4
#define ATT_GQ 4       // query heads per block at most
#define ATT_MINLEN 32  // positions per context range at least

template <int N>
__device__ __forceinline__ void load_raw(const u16* p, u32* r) {  // N halves as N / 2 words
    if constexpr (N % 8 == 0) {
#pragma unroll
        for (int c = 0; c < N / 8; c++) {
            uint4 v = ((const uint4*)p)[c];
            r[4 * c] = v.x; r[4 * c + 1] = v.y; r[4 * c + 2] = v.z; r[4 * c + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int c = 0; c < N / 2; c++) r[c] = ((const u32*)p)[c];
    }
}
__device__ __forceinline__ float lo_h(u32 w) { return h2f((u16)(w & 0xFFFF)); }
__device__ __forceinline__ float hi_h(u32 w) { return h2f((u16)(w >> 16)); }

template <int LPP>
__device__ __forceinline__ float group_sum(float v) {  // over the LPP lanes of a position
#pragma unroll
    for (int o = 1; o < LPP; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int EPL, int LPP>
__device__ __forceinline__ void attn_decode_g(const float* __restrict__ Q, int n_heads, int n_kv,
                                              const u16* __restrict__ kc, const u16* __restrict__ vc,
                                              int block_size, const int* pos, const int* tbl_off,
                                              const int* tables, int n_splits, float scale, float* partial,
                                              int* count, float* out, i8* xq, float2* xd) {
    constexpr int HD = EPL * LPP, PPG = 32 / LPP;  // head size, lane groups per warp
    const int G = n_heads / n_kv, subs = (G + ATT_GQ - 1) / ATT_GQ, per = (G + subs - 1) / subs;
    const int kvh = blockIdx.x / subs, sub = blockIdx.x % subs;
    const int h0 = kvh * G + sub * per, nq = min(per, G - sub * per);
    const int t = blockIdx.y, s = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / LPP, gl = lane % LPP;
    const int len = pos[t] + 1;
    const int ns = min(n_splits, (len + ATT_MINLEN - 1) / ATT_MINLEN);
    if (s >= ns) return;
    const int chunk = (len + ns - 1) / ns;
    const int p0 = s * chunk, p1 = min(len, p0 + chunk);
    const int kv_dim = n_kv * HD;

    float qr[ATT_GQ][EPL], acc[ATT_GQ][EPL], m[ATT_GQ], l[ATT_GQ];
#pragma unroll
    for (int j = 0; j < ATT_GQ; j++) {
        const float* q = Q + ((u64)t * n_heads + h0 + min(j, nq - 1)) * HD + gl * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) { qr[j][e] = j < nq ? q[e] * scale : 0.f; acc[j][e] = 0.f; }
        m[j] = -INFINITY;
        l[j] = 0.f;
    }
    const int* tbl = tables + tbl_off[t];
    const u64 col = (u64)kvh * HD + gl * EPL;
    for (int base = p0 + 2 * PPG * warp; base < p1; base += 2 * PPG * ATT_WARPS) {
        int pa = base + g, pb = base + PPG + g;
        bool oka = pa < p1, okb = pb < p1;
        u32 ka[EPL / 2], kb[EPL / 2], va[EPL / 2], vb[EPL / 2];
        u64 ra = oka ? (u64)tbl[pa / block_size] * block_size + pa % block_size : 0;
        u64 rb = okb ? (u64)tbl[pb / block_size] * block_size + pb % block_size : 0;
        load_raw<EPL>(kc + ra * kv_dim + col, ka);
        load_raw<EPL>(kc + rb * kv_dim + col, kb);
        load_raw<EPL>(vc + ra * kv_dim + col, va);
        load_raw<EPL>(vc + rb * kv_dim + col, vb);
        float fka[EPL], fkb[EPL];
#pragma unroll
        for (int c = 0; c < EPL / 2; c++) {
            fka[2 * c] = lo_h(ka[c]); fka[2 * c + 1] = hi_h(ka[c]);
            fkb[2 * c] = lo_h(kb[c]); fkb[2 * c + 1] = hi_h(kb[c]);
        }
#pragma unroll
        for (int j = 0; j < ATT_GQ; j++) {
            if (j >= nq) break;
            float da = 0.f, db = 0.f;
#pragma unroll
            for (int e = 0; e < EPL; e++) { da += qr[j][e] * fka[e]; db += qr[j][e] * fkb[e]; }
            da = group_sum<LPP>(da);
            db = group_sum<LPP>(db);
            da = oka ? da : -INFINITY;
            db = okb ? db : -INFINITY;
            float m2 = fmaxf(m[j], fmaxf(da, db));
            if (m2 == -INFINITY) continue;  // neither position is in range (whole lane group)
            float corr = __expf(m[j] - m2), wa = __expf(da - m2), wb = __expf(db - m2);
            l[j] = l[j] * corr + wa + wb;
#pragma unroll
            for (int c = 0; c < EPL / 2; c++) {
                acc[j][2 * c] = acc[j][2 * c] * corr + wa * lo_h(va[c]) + wb * lo_h(vb[c]);
                acc[j][2 * c + 1] = acc[j][2 * c + 1] * corr + wa * hi_h(va[c]) + wb * hi_h(vb[c]);
            }
            m[j] = m2;
        }
    }
    // merge the warp's lane groups (lanes gl, gl + LPP, ... hold the same dims)
#pragma unroll
    for (int off = LPP; off < 32; off <<= 1) {
#pragma unroll
        for (int j = 0; j < ATT_GQ; j++) {
            float mo = __shfl_xor_sync(0xffffffffu, m[j], off), lo = __shfl_xor_sync(0xffffffffu, l[j], off);
            float M = fmaxf(m[j], mo);
            float a = m[j] == -INFINITY ? 0.f : __expf(m[j] - M), b = mo == -INFINITY ? 0.f : __expf(mo - M);
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[j][e] = acc[j][e] * a + __shfl_xor_sync(0xffffffffu, acc[j][e], off) * b;
            l[j] = l[j] * a + lo * b;
            m[j] = M;
        }
    }
    // then the block's warps: per head its maximum, sum and accumulator
    __shared__ float sm[ATT_WARPS][ATT_GQ], sl[ATT_WARPS][ATT_GQ], sacc[ATT_WARPS][ATT_GQ][HD];
    __shared__ float bm[ATT_GQ], bl[ATT_GQ];
    __shared__ int last;
#pragma unroll
    for (int j = 0; j < ATT_GQ; j++) {
        if (lane == 0) { sm[warp][j] = m[j]; sl[warp][j] = l[j]; }
        if (g == 0) {
#pragma unroll
            for (int e = 0; e < EPL; e++) sacc[warp][j][gl * EPL + e] = acc[j][e];
        }
    }
    __syncthreads();
    if (threadIdx.x < nq) {
        int j = threadIdx.x;
        float M = -INFINITY, L = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][j]);
        for (int w = 0; w < ATT_WARPS; w++) L += sm[w][j] == -INFINITY ? 0.f : sl[w][j] * __expf(sm[w][j] - M);
        bm[j] = M;
        bl[j] = L;
    }
    __syncthreads();
    const int qdim = n_heads * HD, n = nq * HD;
    float* orow = out + (u64)t * qdim + (u64)h0 * HD;
    if (ns == 1) {  // one range: the block's result is the output
        for (int b0 = 0; b0 < n; b0 += 32 * ATT_WARPS) {
            int i = b0 + threadIdx.x, j = i / HD, e = i % HD;
            float v = 0.f;
            if (i < n) {
                float a = 0.f;
                for (int w = 0; w < ATT_WARPS; w++)
                    a += sm[w][j] == -INFINITY ? 0.f : sacc[w][j][e] * __expf(sm[w][j] - bm[j]);
                v = a / bl[j];
                orow[i] = v;
            }
            if (xq != nullptr && b0 + 32 * warp < n) {
                u64 c = ((u64)t * qdim + (u64)h0 * HD + b0 + 32 * warp) / 32;
                quant32(v, xq + 32 * c, xd + c);
            }
        }
        return;
    }
    // several ranges: store this one's, and the last block of the (token, group) merges them
    for (int i = threadIdx.x; i < n; i += 32 * ATT_WARPS) {
        int j = i / HD, e = i % HD;
        float a = 0.f;
        for (int w = 0; w < ATT_WARPS; w++)
            a += sm[w][j] == -INFINITY ? 0.f : sacc[w][j][e] * __expf(sm[w][j] - bm[j]);
        partial[(((u64)t * n_heads + h0 + j) * n_splits + s) * (HD + 2) + 2 + e] = a;
    }
    if (threadIdx.x < nq) {
        float* p = partial + (((u64)t * n_heads + h0 + threadIdx.x) * n_splits + s) * (HD + 2);
        p[0] = bm[threadIdx.x];
        p[1] = bl[threadIdx.x];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* c = count + (u64)t * gridDim.x + blockIdx.x;
        last = atomicAdd(c, 1) == ns - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int b0 = 0; b0 < n; b0 += 32 * ATT_WARPS) {
        int i = b0 + threadIdx.x, j = i / HD, e = i % HD;
        float v = 0.f;
        if (i < n) {
            const float* p = partial + ((u64)t * n_heads + h0 + j) * n_splits * (HD + 2);
            float M = -INFINITY, L = 0.f, a = 0.f;
            for (int r = 0; r < ns; r++) M = fmaxf(M, __ldcg(p + r * (HD + 2)));
            for (int r = 0; r < ns; r++) {
                float mr = __ldcg(p + r * (HD + 2));
                if (mr == -INFINITY) continue;
                float f = __expf(mr - M);
                L += __ldcg(p + r * (HD + 2) + 1) * f;
                a += __ldcg(p + r * (HD + 2) + 2 + e) * f;
            }
            v = a / L;
            orow[i] = v;
        }
        if (xq != nullptr && b0 + 32 * warp < n) {
            u64 c = ((u64)t * qdim + (u64)h0 * HD + b0 + 32 * warp) / 32;
            quant32(v, xq + 32 * c, xd + c);
        }
    }
}

// attn_decode_e<EPL>_l<LPP>: head size EPL * LPP. Grid (n_kv * ceil(G / ceil(G / ...)), t,
// n_splits) as ops.rs computes it (`attn_groups`), 128 threads.
#define ATTD(EPL, LPP)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_decode_e##EPL##_l##LPP(                  \
        const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc, int block_size,         \
        const int* pos, const int* tbl_off, const int* tables, int n_splits, float scale,            \
        float* partial, int* count, float* out, i8* xq, float2* xd) { GRID_DEP();                  \
        attn_decode_g<EPL, LPP>(Q, n_heads, n_kv, kc, vc, block_size, pos, tbl_off, tables, n_splits, \
                                scale, partial, count, out, xq, xd);                                 \
    }
ATTD(2, 8) ATTD(4, 8) ATTD(6, 8) ATTD(8, 8) ATTD(10, 8) ATTD(12, 8) ATTD(14, 8) ATTD(16, 8)
ATTD(12, 16) ATTD(16, 16)
