// One token's q, k and v products with the attention epilogue in the same kernel (after
// matvec.cu, whose unit dots they share): bias, RoPE and the f16 cache write for families without
// per-head norms, and the RMSNorm before the products too (mvx_1_norm_rope).

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

// The fused q/k/v mat-vec of one token with the attention epilogue done in place (families
// without per-head norms: llama, qwen2), where qkv_epilogue would be the next kernel. Warp g
// takes the two rows of a head that RoPE turns together (NeoX: i and i + hd/2; the normal
// layout: 2i and 2i + 1), pair g of the heads q, then k, then v (v's pairs not turned), so
// bias, rotation and the cache write need no other warp: one kernel and its link fewer a layer.
// The rows' dots are rows_acc's (the same sums in the same order), the epilogue's arithmetic
// qkv_epilogue's. Q goes to Q (f32), K and V to the cache (f16) at row kv_row[0].
struct RopePair {
    const u8* W;
    int ty, rows, kind, hh, ia, ib, rm[2];
    float ba, bb, c, sn;
    u64 crow;
    bool active;
};

// A warp's pair, and what it needs that no earlier kernel writes (bias, rotation, cache row):
// before the wait.
__device__ __forceinline__ RopePair rope_pair_setup(const u8* Wq, int tq, const u8* Wk, int tk, const u8* Wv,
                                                    int tv, int n_heads, int n_kv, int hd, const float* bq,
                                                    const float* bk, const float* bv, const int* pos,
                                                    float theta_scale, int neox, const int* kv_row) {
    RopePair p;
    int half = hd / 2;
    int g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int head = g / half, j = g % half;
    p.kind = head < n_heads ? 0 : (head < n_heads + n_kv ? 1 : 2);
    p.hh = p.kind == 0 ? head : (p.kind == 1 ? head - n_heads : head - n_heads - n_kv);
    p.active = head < n_heads + 2 * n_kv;
    p.W = p.kind == 0 ? Wq : (p.kind == 1 ? Wk : Wv);
    p.ty = p.kind == 0 ? tq : (p.kind == 1 ? tk : tv);
    p.rows = (p.kind == 0 ? n_heads : n_kv) * hd;
    p.ia = neox ? j : 2 * j;
    p.ib = neox ? j + half : 2 * j + 1;
    p.rm[0] = p.hh * hd + p.ia;
    p.rm[1] = p.hh * hd + p.ib;
    const float* bias = p.kind == 0 ? bq : (p.kind == 1 ? bk : bv);
    p.ba = p.bb = 0.f;
    p.c = 1.f;
    p.sn = 0.f;
    p.crow = 0;
    if (p.active) {
        if (bias != nullptr) { p.ba = bias[p.rm[0]]; p.bb = bias[p.rm[1]]; }
        if (p.kind < 2) {
            // theta = pos * theta_scale^j, by repeated f32 products as qkv_epilogue does
            float theta = (float)pos[0];
            for (int k = 0; k < j; k++) theta *= theta_scale;
            p.c = cosf(theta);
            p.sn = sinf(theta);
        }
        if (p.kind > 0) p.crow = (u64)kv_row[0];
    }
    return p;
}

// The pair's dots with the 8-bit activations (xq, xd: global or shared memory), then bias,
// rotation and the stores. ALL as in mvx.
template <bool ALL>
__device__ __forceinline__ void rope_pair_finish(const RopePair& p, int n_kv, int hd, int cols, const i8* xq,
                                                 const float2* xd, float* Q, u16* kc, u16* vc) {
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
        int hd, int cols, const float *bq, const float *bk, const float *bv, const int *pos,      \
        float theta_scale, int neox, float *Q, u16 *kc, u16 *vc, const int *kv_row
#define ROPE_PAIR_SETUP()                                                                        \
    RopePair p = rope_pair_setup(Wq, tq, Wk, tk, Wv, tv, n_heads, n_kv, hd, bq, bk, bv, pos,     \
                                 theta_scale, neox, kv_row)

// mvx_1_rope, mvx_1_rope_all: the input's 8-bit copy (xq, xd) made by the norm before it;
// 4 warps a block, (n_heads + 2 n_kv) hd / 2 warps.
#define MVXROPE(ALL, SUF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 4) mvx_1_rope##SUF(                        \
        ROPE_PAIR_ARGS, const i8* xq, const float2* xd) {                                        \
        ROPE_PAIR_SETUP();                                                                       \
        GRID_DEP();                                                                              \
        rope_pair_finish<ALL>(p, n_kv, hd, cols, xq, xd, Q, kc, vc);                             \
    }
MVXROPE(false, ) MVXROPE(true, _all)

// mvx_1_norm_rope, mvx_1_norm_rope_all: the RMSNorm before the products too. Every block
// normalizes the residual row x (weights nw) into its shared memory as rms_norm_q does (the
// same 256-thread sums, the same 32-value blocks: the same bytes), then its 8 warps take their
// pairs from there: the norm kernel and its link go as well, and the normalized f32 row is not
// written (nothing reads it after the products). Dynamic shared memory: cols + cols / 4 bytes.
#define MVXNORMROPE(ALL, SUF)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 2) mvx_1_norm_rope##SUF(                   \
        ROPE_PAIR_ARGS, const float* x, const float* nw, float eps) {                            \
        extern __shared__ __align__(16) u8 sx[];                                                 \
        i8* sq = (i8*)sx;                                                                        \
        float2* sd = (float2*)(sx + cols);                                                       \
        ROPE_PAIR_SETUP();                                                                       \
        GRID_DEP();                                                                              \
        norm_q_block(x, nw, cols, eps, sq, sd);                                                  \
        __syncthreads();                                                                         \
        rope_pair_finish<ALL>(p, n_kv, hd, cols, sq, sd, Q, kc, vc);                             \
    }
MVXNORMROPE(false, ) MVXNORMROPE(true, _all)
