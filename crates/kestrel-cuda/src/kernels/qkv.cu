// One token's q, k and v products with the attention epilogue in the same kernel (after
// matvec.cu, whose unit dots they share): bias, per-head norms, RoPE and the f16 cache write,
// and the RMSNorm before the products too (mvx_1_norm_rope).

// Rows rm[0] and rm[1] of W dotted with one token into acc[0][0], acc[1][0] (each lane its
// units, as rows_acc's full-warp rows).
template <int TY>
__device__ __forceinline__ void pair_acc(const u8* __restrict__ W, int rows, int cols, const int* rm,
                                         const i8* __restrict__ xq, const float2* __restrict__ xd,
                                         float (*acc)[1]) {
    int lane = threadIdx.x & 31, bpr = cols / Blk<TY>::QK, units = cols / Blk<TY>::UNIT;
    u64 nblk = (u64)rows * bpr;
#pragma unroll 2
    for (int u = lane; u < units; u += 32) units_acc<TY, 1, 2, false>(W, W, rm, nblk, bpr, u, xq, xd, cols, acc);
}

// The fused q/k/v mat-vec of one token with the attention epilogue done in place, where
// qkv_epilogue would be the next kernel. Warp g takes the two rows of a head that RoPE turns
// together (NeoX: i and i + hd/2; the normal layout: 2i and 2i + 1), pair g of the heads q,
// then k, then v (v's pairs not turned), so bias, rotation and the cache write need no other
// warp: one kernel and its link fewer a layer. A per-head RMSNorm (qwen3: weights qn / kn)
// needs the whole head: each pair's warp stores its two values, and the head's last warp to
// finish (a counter a head) normalizes and turns the whole head (head_norm_finish).
// The rows' dots are rows_acc's (the same sums in the same order), the epilogue's arithmetic
// qkv_epilogue's. Q goes to Q (f32), K and V to the cache (f16) at row kv_row[0].
struct RopePair {
    const u8* W;
    const float* hn;  // the per-head norm's weights (null: none)
    int ty, rows, kind, head, hh, ia, ib, rm[2];
    float ba, bb, c, sn, pos;
    u64 crow;
    bool active;
};

// A warp's pair, and what it needs that no earlier kernel writes (bias, rotation, cache row):
// before the wait.
__device__ __forceinline__ RopePair rope_pair_setup(const u8* Wq, int tq, const u8* Wk, int tk, const u8* Wv,
                                                    int tv, int n_heads, int n_kv, int hd, const float* bq,
                                                    const float* bk, const float* bv, const float* qn,
                                                    const float* kn, const int* pos, float theta_scale,
                                                    int neox, const int* kv_row) {
    RopePair p;
    int half = hd / 2;
    int g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int head = g / half, j = g % half;
    p.head = head;
    p.kind = head < n_heads ? 0 : (head < n_heads + n_kv ? 1 : 2);
    p.hh = p.kind == 0 ? head : (p.kind == 1 ? head - n_heads : head - n_heads - n_kv);
    p.active = head < n_heads + 2 * n_kv;
    p.W = p.kind == 0 ? Wq : (p.kind == 1 ? Wk : Wv);
    p.ty = p.kind == 0 ? tq : (p.kind == 1 ? tk : tv);
    p.hn = p.kind == 0 ? qn : (p.kind == 1 ? kn : nullptr);
    p.rows = (p.kind == 0 ? n_heads : n_kv) * hd;
    p.ia = neox ? j : 2 * j;
    p.ib = neox ? j + half : 2 * j + 1;
    p.rm[0] = p.hh * hd + p.ia;
    p.rm[1] = p.hh * hd + p.ib;
    const float* bias = p.kind == 0 ? bq : (p.kind == 1 ? bk : bv);
    p.ba = p.bb = 0.f;
    p.c = 1.f;
    p.sn = 0.f;
    p.pos = 0.f;
    p.crow = 0;
    if (p.active) {
        if (bias != nullptr) { p.ba = bias[p.rm[0]]; p.bb = bias[p.rm[1]]; }
        if (p.kind < 2) {
            // theta = pos * theta_scale^j, by repeated f32 products as qkv_epilogue does
            p.pos = (float)pos[0];
            float theta = p.pos;
            for (int k = 0; k < j; k++) theta *= theta_scale;
            p.c = cosf(theta);
            p.sn = sinf(theta);
        }
        if (p.kind > 0) p.crow = (u64)kv_row[0];
    }
    return p;
}

// The per-head norm (weights p.hn), then RoPE over the whole head, for a q or k head of at most
// 128 dimensions whose RoPE partners a warp can swap (head_norm_foldable in deferred.rs): the
// warp stores its pair's values (bias added) to Q or K (f32), and the head's last warp to
// finish (count[head], left at zero for the next kernel that counts) reads the whole head back
// (lane l: dimensions l, l + 32, ...) and does qkv_epilogue's work on it: the same sums (a
// warp's, then the warps'), the same products, the same rotation; q back into Q, k into the
// cache (f16).
__device__ __forceinline__ float slot(const float (&y)[4], int i) {
    return i == 0 ? y[0] : (i == 1 ? y[1] : (i == 2 ? y[2] : y[3]));
}
__device__ __noinline__ void head_norm_finish(const RopePair& p, int n_kv, int hd, float va, float vb,
                                              float eps, int* count, float theta_scale, int neox,
                                              float* Q, float* K, u16* kc) {
    const int lane = threadIdx.x & 31, nw = (hd + 31) / 32, half = hd / 2;
    float* h = (p.kind == 0 ? Q : K) + p.hh * hd;
    int last = 0;
    if (lane == 0) {
        h[p.ia] = va;
        h[p.ib] = vb;
        __threadfence();
        last = atomicAdd(count + p.head, 1) == half - 1;
        if (last) count[p.head] = 0;
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();
    float x[4], y[4], ss = 0.f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int e = lane + 32 * w;
        x[w] = w < nw && e < hd ? __ldcg(h + e) : 0.f;
        const float part = w < nw ? warp_sum(x[w] * x[w]) : 0.f;
        if (lane == w) ss = part;
    }
    ss = warp_sum(ss);  // block_sum's order: each warp's sum, then the warps' sums
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int e = lane + 32 * w;
        y[w] = w < nw && e < hd ? x[w] * rsqrtf(ss / (float)hd + eps) * p.hn[e] : 0.f;
    }
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int e = lane + 32 * w;
        const bool first = neox ? e % hd < half : (e % 2 == 0);
        // the partner: the next lane (normal layout), half / 32 slots away in the same lane
        // (NeoX, half a multiple of 32), or the lane half away (NeoX, hd <= 32)
        float other;
        if (!neox) other = __shfl_xor_sync(0xffffffffu, y[w], 1);
        else if (half >= 32) other = slot(y, first ? w + half / 32 : w - half / 32);
        else other = __shfl_xor_sync(0xffffffffu, y[w], half);
        if (w >= nw || e >= hd) continue;
        const int pair = neox ? (first ? e : e - half) : e / 2;
        float theta = p.pos;
        for (int k = 0; k < pair; k++) theta *= theta_scale;
        const float c = cosf(theta), sn = sinf(theta);
        const float x0 = first ? y[w] : other, x1 = first ? other : y[w];
        const float v = first ? fmaf(x0, c, -(x1 * sn)) : fmaf(x0, sn, x1 * c);
        if (p.kind == 0) h[e] = v;
        else kc[p.crow * n_kv * hd + p.hh * hd + e] = f2h(v);
    }
}

// The pair's dots with the 8-bit activations (xq, xd: global or shared memory), then bias,
// rotation and the stores. ALL as in mvx.
template <bool ALL>
__device__ __forceinline__ void rope_pair_finish(const RopePair& p, int n_kv, int hd, int cols, const i8* xq,
                                                 const float2* xd, float* Q, u16* kc, u16* vc, float eps,
                                                 float* K, int* count, float theta_scale, int neox) {
    if (!p.active) return;
    float acc[2][1] = {{0.f}, {0.f}};
    switch (p.ty) {
    case T_Q4_0: pair_acc<T_Q4_0>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q5_0: pair_acc<T_Q5_0>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q8_0: pair_acc<T_Q8_0>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q4_K: pair_acc<T_Q4_K>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q6_K: pair_acc<T_Q6_K>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q4_1: if constexpr (ALL) pair_acc<T_Q4_1>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q5_1: if constexpr (ALL) pair_acc<T_Q5_1>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    case T_Q5_K: if constexpr (ALL) pair_acc<T_Q5_K>(p.W, p.rows, cols, p.rm, xq, xd, acc); break;
    }
    float va = warp_sum(acc[0][0]) + p.ba, vb = warp_sum(acc[1][0]) + p.bb;
    if (p.hn != nullptr) {
        head_norm_finish(p, n_kv, hd, va, vb, eps, count, theta_scale, neox, Q, K, kc);
        return;
    }
    if ((threadIdx.x & 31) != 0) return;
    if (p.kind < 2) {
        float x0 = va, x1 = vb;
        va = fmaf(x0, p.c, -(x1 * p.sn));
        vb = fmaf(x0, p.sn, x1 * p.c);
    }
    if (p.kind == 0) {
        Q[p.hh * hd + p.ia] = va;
        Q[p.hh * hd + p.ib] = vb;
    } else {
        u16* cache = (p.kind == 1 ? kc : vc) + p.crow * n_kv * hd + p.hh * hd;
        cache[p.ia] = f2h(va);
        cache[p.ib] = f2h(vb);
    }
}

#define ROPE_PAIR_ARGS                                                                           \
    const u8 *Wq, int tq, const u8 *Wk, int tk, const u8 *Wv, int tv, int n_heads, int n_kv,      \
        int hd, int cols, const float *bq, const float *bk, const float *bv, const float *qn,     \
        const float *kn, float eps, const int *pos, float theta_scale, int neox, float *Q, u16 *kc, \
        u16 *vc, float *K, int *count, const int *kv_row
#define ROPE_PAIR_SETUP()                                                                        \
    RopePair p = rope_pair_setup(Wq, tq, Wk, tk, Wv, tv, n_heads, n_kv, hd, bq, bk, bv, qn, kn,  \
                                 pos, theta_scale, neox, kv_row)

// mvx_1_rope, mvx_1_rope_all: the input's 8-bit copy (xq, xd) made by the norm before it;
// 4 warps a block, (n_heads + 2 n_kv) hd / 2 warps.
#define MVXROPE(ALL, SUF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 4) mvx_1_rope##SUF(                        \
        ROPE_PAIR_ARGS, const i8* xq, const float2* xd) {                                        \
        ROPE_PAIR_SETUP();                                                                       \
        GRID_DEP();                                                                              \
        rope_pair_finish<ALL>(p, n_kv, hd, cols, xq, xd, Q, kc, vc, eps, K, count, theta_scale,  \
                              neox);                                                             \
    }
MVXROPE(false, ) MVXROPE(true, _all)

// mvx_1_norm_rope, mvx_1_norm_rope_all: the RMSNorm before the products too. Every block
// normalizes the residual row x (weights nw) into its shared memory as rms_norm_q does (the
// same 256-thread sums, the same 32-value blocks: the same bytes), then its 8 warps take their
// pairs from there: the norm kernel and its link go as well, and the normalized f32 row is not
// written (nothing reads it after the products). Dynamic shared memory: cols + cols / 4 bytes.
#define MVXNORMROPE(ALL, SUF)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 2) mvx_1_norm_rope##SUF(                   \
        ROPE_PAIR_ARGS, const float* x, const float* nw) {                                       \
        extern __shared__ __align__(16) u8 sx[];                                                 \
        i8* sq = (i8*)sx;                                                                        \
        float2* sd = (float2*)(sx + cols);                                                       \
        ROPE_PAIR_SETUP();                                                                       \
        GRID_DEP();                                                                              \
        norm_q_block(x, nw, cols, eps, sq, sd);                                                  \
        __syncthreads();                                                                         \
        rope_pair_finish<ALL>(p, n_kv, hd, cols, sq, sd, Q, kc, vc, eps, K, count, theta_scale,  \
                              neox);                                                             \
    }
MVXNORMROPE(false, ) MVXNORMROPE(true, _all)
