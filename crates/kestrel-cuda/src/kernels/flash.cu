// Prompt attention on the tensor cores (flash attention 2) over the paged f16 KV cache.
//
// A block of 4 warps takes FA_BQ = 64 consecutive queries of one sequence and one head (16
// rows per warp) and walks the sequence's K/V in tiles of BK positions through shared memory:
// S = Q K^T and O += P V by mma.m16n8k16 (f16 operands, f32 accumulators), the softmax online
// in registers (base 2, the scale folded into Q). Causal: the query at position p sees 0..=p,
// so a tile walks 0 ..= its last query's position and only the tiles that cross the diagonal
// are masked. The step's sequences come as (seq_t0, seq_len) with consecutive positions;
// block x finds its sequence and its tile by walking them (a step has few sequences).
// Grid: (tiles bound = T / 64 + n_seqs, n_heads); blocks past the last tile return.
//
// Fragments (gid = lane / 4, tid = lane % 4), m16n8k16 f16:
//   A (16x16, row): a0 = A[gid][2tid..], a1 = A[gid + 8][2tid..], a2 = A[gid][8 + 2tid..],
//                   a3 = A[gid + 8][8 + 2tid..] (two halves per register)
//   B (16x8, col):  b0 = B[2tid..][gid], b1 = B[8 + 2tid..][gid]
//   C (16x8):       c0, c1 = C[gid][2tid, 2tid + 1], c2, c3 = C[gid + 8][2tid, 2tid + 1]
// S's C fragments of two adjacent 8-key tiles are, as halves, P's A fragment for 16 keys.

#define FA_BQ 64

__device__ __forceinline__ u32 pack_f16(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

template <int HD, int BK>
__device__ __forceinline__ void flash_prefill(const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc,
                                              int block_size, const int* pos, const int* tbl_off, const int* tables,
                                              const u32* seq_t0, const u32* seq_len, int n_seqs, float scale,
                                              float* out) {
    constexpr int LD = HD + 8;  // smem row stride (halves): rows 16 bytes apart mod 128, no bank conflicts
    constexpr int NS = BK / 8;  // S tiles per warp row block
    constexpr int NO = HD / 8;  // O tiles
    __shared__ __align__(16) u16 Ks[BK * LD];
    __shared__ __align__(16) u16 Vs[BK * LD];

    // this block's sequence and tile
    int b = blockIdx.x, s = 0, t0 = 0, n = 0;
    for (; s < n_seqs; s++) {
        int len = (int)seq_len[s], tiles = (len + FA_BQ - 1) / FA_BQ;
        if (b < tiles) {
            t0 = (int)seq_t0[s] + b * FA_BQ;
            n = min(FA_BQ, len - b * FA_BQ);
            break;
        }
        b -= tiles;
    }
    if (s == n_seqs) return;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv), kv_dim = n_kv * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    const int* tbl = tables + tbl_off[t0];
    const int p_first = pos[t0], p_last = pos[t0 + n - 1];

    // this warp's rows: queries r0 = 16 warp + gid and r0 + 8 (clamped to the last query; such
    // rows compute a copy of it and are never stored)
    const int qa = min(16 * warp + gid, n - 1), qb = min(16 * warp + gid + 8, n - 1);
    const int pa = p_first + qa, pb = p_first + qb;
    const int warp_last = p_first + min(16 * warp + 15, n - 1);
    const float qs = scale * 1.44269504f;  // exp2 softmax
    u32 qf[HD / 16][4];
    {
        const float* q_a = Q + (u64)(t0 + qa) * n_heads * HD + h * HD;
        const float* q_b = Q + (u64)(t0 + qb) * n_heads * HD + h * HD;
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            int c = 16 * k + 2 * tid;
            qf[k][0] = pack_f16(q_a[c] * qs, q_a[c + 1] * qs);
            qf[k][1] = pack_f16(q_b[c] * qs, q_b[c + 1] * qs);
            qf[k][2] = pack_f16(q_a[c + 8] * qs, q_a[c + 9] * qs);
            qf[k][3] = pack_f16(q_b[c + 8] * qs, q_b[c + 9] * qs);
        }
    }
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;

    for (int k0 = 0; k0 <= p_last; k0 += BK) {
        // K and V rows k0 .. k0 + BK into shared memory, 16 bytes per thread per step; rows
        // past p_last are zeros (their block may not exist, and 0 * garbage could be NaN)
        __syncthreads();
        constexpr int CH = HD / 8;  // 16-byte chunks per row
        for (int i = threadIdx.x; i < BK * CH; i += 128) {
            int r = i / CH, c = (i % CH) * 8, p = k0 + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (p <= p_last) {
                u64 row = (u64)tbl[p / block_size] * block_size + p % block_size;
                kv = *(const uint4*)(kc + row * kv_dim + kvh * HD + c);
                vv = *(const uint4*)(vc + row * kv_dim + kvh * HD + c);
            }
            *(uint4*)(Ks + r * LD + c) = kv;
            *(uint4*)(Vs + r * LD + c) = vv;
        }
        __syncthreads();
        if (k0 > warp_last) continue;  // every key here is after this warp's queries

        // S = Q K^T (16 x BK for this warp)
        float sc[NS][4];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
            const u16* kr = Ks + (8 * j + gid) * LD + 2 * tid;
#pragma unroll
            for (int k = 0; k < HD / 16; k++) {
                u32 b0 = *(const u32*)(kr + 16 * k), b1 = *(const u32*)(kr + 16 * k + 8);
                mma_f16(sc[j], qf[k], b0, b1);
            }
        }
        // causal mask where this tile crosses the diagonal of the warp's rows
        if (k0 + BK - 1 > p_first + 16 * warp) {
#pragma unroll
            for (int j = 0; j < NS; j++) {
                int p = k0 + 8 * j + 2 * tid;
                if (p > pa) sc[j][0] = -INFINITY;
                if (p + 1 > pa) sc[j][1] = -INFINITY;
                if (p > pb) sc[j][2] = -INFINITY;
                if (p + 1 > pb) sc[j][3] = -INFINITY;
            }
        }
        // online softmax: the row maxima over the 4 lanes of a row
        float xa = ma, xb = mb;
#pragma unroll
        for (int j = 0; j < NS; j++) {
            xa = fmaxf(xa, fmaxf(sc[j][0], sc[j][1]));
            xb = fmaxf(xb, fmaxf(sc[j][2], sc[j][3]));
        }
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
        // every row sees key 0 in its first tile, so the maxima are finite from there on
        float ca = exp2f(ma - xa), cb = exp2f(mb - xb);
        ma = xa;
        mb = xb;
        float sa = 0.f, sb = 0.f;
        u32 pf[NS / 2][4];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            float e0 = exp2f(sc[j][0] - xa), e1 = exp2f(sc[j][1] - xa);
            float e2 = exp2f(sc[j][2] - xb), e3 = exp2f(sc[j][3] - xb);
            sa += e0 + e1;
            sb += e2 + e3;
            pf[j / 2][(j & 1) * 2] = pack_f16(e0, e1);
            pf[j / 2][(j & 1) * 2 + 1] = pack_f16(e2, e3);
        }
        la = la * ca + sa;
        lb = lb * cb + sb;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            o[j][0] *= ca;
            o[j][1] *= ca;
            o[j][2] *= cb;
            o[j][3] *= cb;
        }
        // O += P V: V [BK keys][HD] row-major is B = V (k = key, n = dim); ldmatrix.trans of
        // the 8x8 pieces (keys 16 k + 0..7 | 8..15) x (dims 16 d + 0..7 | 8..15)
#pragma unroll
        for (int k = 0; k < NS / 2; k++) {
#pragma unroll
            for (int d = 0; d < NO / 2; d++) {
                int mi = lane >> 3, r = lane & 7;  // matrix mi: keys +8 (mi & 1), dims +8 (mi >> 1)
                u32 v[4];
                ldsm_x4_t(v, Vs + (16 * k + 8 * (mi & 1) + r) * LD + 16 * d + 8 * (mi >> 1));
                mma_f16(o[2 * d], pf[k], v[0], v[1]);
                mma_f16(o[2 * d + 1], pf[k], v[2], v[3]);
            }
        }
    }
    // the row sums over the 4 lanes of a row, then O / l
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    const int ra = 16 * warp + gid, rb = ra + 8;
    float ia = 1.f / la, ib = 1.f / lb;
#pragma unroll
    for (int j = 0; j < NO; j++) {
        int c = 8 * j + 2 * tid;
        if (ra < n) *(float2*)(out + (u64)(t0 + ra) * n_heads * HD + h * HD + c) = make_float2(o[j][0] * ia, o[j][1] * ia);
        if (rb < n) *(float2*)(out + (u64)(t0 + rb) * n_heads * HD + h * HD + c) = make_float2(o[j][2] * ib, o[j][3] * ib);
    }
}

#define FLASH(HD, BK)                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_prefill_h##HD(                                     \
        const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc, int block_size, const int* pos, \
        const int* tbl_off, const int* tables, const u32* seq_t0, const u32* seq_len, int n_seqs, float scale, \
        float* out) { GRID_DEP();                                                                             \
        flash_prefill<HD, BK>(Q, n_heads, n_kv, kc, vc, block_size, pos, tbl_off, tables, seq_t0, seq_len,  \
                              n_seqs, scale, out);                                                            \
    }
FLASH(64, 64) FLASH(128, 64) FLASH(256, 32)

// Decode attention on the tensor cores (`attn_decode_mma_h<HD>_s<S>`), in the form of
// `attn_decode_h<HD>` (kernels/attention.cu: a block per token, context range and KV head (there:
// and group of up to 4 of its query heads), the ranges merged by the last block) with every
// query head of a KV head in one block (up to 8):
// the CUDA-core kernel spends ~750 instructions a thread per 32 positions on its dot products
// from shared memory, which at long contexts costs more than reading the cache. Here the group
// is the 8-wide N of the mma and the positions its M: S^T = K Q^T (K's 16 x 16 pieces by
// ldmatrix, Q^T's fragments in registers for the whole range), then O^T += V^T P^T (V's pieces
// by ldmatrix.trans; P^T from S^T's accumulators by movmatrix, which transposes an 8 x 8 tile
// across the warp). Each of the 4 warps walks its own tiles of 16 positions (tiles w, w + 4,
// ...) through a ring of S stages of shared memory filled by cp.async, with no block barrier;
// the warps' softmax states are merged at the end and the block ends as attn_decode_h does.
//
// Per lane (gid = lane / 4, tid = lane % 4): S^T's c0..c3 are positions gid / gid + 8 of heads
// 2tid / 2tid + 1, so a lane's softmax state is two heads', shared with the lanes of its tid
// (maxima reduced over gid by xor 4, 8, 16); O^T's c0, c2 (dims gid, gid + 8 of each 16) are
// head 2tid's, c1, c3 head 2tid + 1's.
#define ATT_MMA_TP 16  // positions a warp's tile
#define ATT_MMA_HEADS 8

// Shared memory the kernel takes (the host sizes its launch with the same formula in ops.rs):
// the warps' rings of S stages, reused after the walk for their results and the merge.
template <int HD, int S>
struct AttnMma {
    static constexpr int LD = HD + 8;                 // halves a shared row (16 bytes of padding)
    static constexpr int STAGE = 2 * ATT_MMA_TP * LD;  // halves: a tile's K rows, then its V rows
    static constexpr int RING = 4 * S * STAGE * 2;     // bytes: 4 warps x S stages
    static constexpr int MERGE = (4 * ATT_MMA_HEADS * HD + ATT_MMA_HEADS * HD + 2 * 4 * ATT_MMA_HEADS +
                                  2 * ATT_MMA_HEADS + 2 * ATT_MMA_HEADS * ATT_MAXSPLITS) * 4;
    static constexpr int SMEM = RING > MERGE ? RING : MERGE;
};

// The kernel waits on the previous one (GRID_DEP) itself: positions and block tables come
// from the host, so its first tiles' table entries are looked up before the wait; the K/V
// rows (the step's own rows are written by the kernel before) and the queries after it.
template <int HD, int S>
__device__ __forceinline__ void attn_decode_mma(const float* __restrict__ Q, int n_heads, int n_kv,
                                                const u16* __restrict__ kc, const u16* __restrict__ vc,
                                                int block_size, const int* pos, const int* tbl_off,
                                                const int* tables, int n_splits, float scale, float* partial,
                                                int* count, float* out, i8* xq, float2* xd) {
    using A = AttnMma<HD, S>;
    constexpr int LD = A::LD, STAGE = A::STAGE, TP = ATT_MMA_TP, KT = HD / 16, CPR = HD / 8;
    extern __shared__ __align__(16) u8 att_smem[];
    const int G = n_heads / n_kv;  // <= ATT_MMA_HEADS (the host picks this kernel only then)
    const int kvh = blockIdx.x, h0 = kvh * G, t = blockIdx.y, s = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    const int len = pos[t] + 1;
    const int ns = min(n_splits, (len + ATT_MINLEN - 1) / ATT_MINLEN);
    if (s >= ns) {
        GRID_DEP();
        return;
    }
    const int chunk = (len + ns - 1) / ns;
    const int p0 = s * chunk, p1 = min(len, p0 + chunk);
    const int ntiles = (p1 - p0 + TP - 1) / TP;
    const u64 kv_dim = (u64)n_kv * HD, col = (u64)kvh * HD;
    const int* tbl = tables + tbl_off[t];
    u16* ring = (u16*)att_smem + warp * S * STAGE;

    // a tile's cache blocks: the entries of its first position's block and the next one (a
    // 16-position tile spans at most two blocks of 16+ rows; smaller blocks look up the rest)
    auto entries = [&](int it, int2& e) {
        const int b = (p0 + it * TP) / block_size;
        e.x = it < ntiles ? tbl[b] : 0;
        e.y = it < ntiles && (b + 1) * block_size < p1 ? tbl[b + 1] : 0;
    };
    // tile `it` (positions p0 + 16 it ..) into stage `st` of this warp's ring; always one
    // commit group, empty past the last tile, so the waits below count tiles. A position's
    // row comes from its offset into the tile's first block, with no division a piece (the
    // copies' issue is most of a warp's instructions a tile): blocks of 16+ rows hold a tile
    // in its two; smaller ones look the others up.
    auto issue = [&](int it, int st, int2 e) {
        if (it < ntiles) {
            u16* K = ring + st * STAGE;
            const int tp0 = p0 + it * TP, b0 = tp0 / block_size, off0 = tp0 - b0 * block_size;
#pragma unroll
            for (int i = lane; i < TP * CPR; i += 32) {
                const int r = i / CPR, c = 8 * (i % CPR), p = tp0 + r, off = off0 + r;
                const bool ok = p < p1;
                u64 row;
                if (block_size >= TP)
                    row = off < block_size ? (u64)e.x * block_size + off : (u64)e.y * block_size + off - block_size;
                else
                    row = (u64)(ok ? tbl[p / block_size] : 0) * block_size + p % block_size;
                row = ok ? row : 0;
                cp_async16(K + r * LD + c, kc + row * kv_dim + col + c, ok);
                cp_async16(K + TP * LD + r * LD + c, vc + row * kv_dim + col + c, ok);
            }
        }
        cp_async_commit();
    };
    int2 first[S];
#pragma unroll
    for (int k = 0; k < S; k++) entries(warp + 4 * k, first[k]);
    GRID_DEP();
#pragma unroll
    for (int k = 0; k < S; k++) issue(warp + 4 * k, k, first[k]);

    // Q^T as B fragments (k = dims, n = heads): heads past the group are zeros
    const float qs = scale * 1.44269504f;  // exp2 softmax
    u32 qf[KT][2];
    {
        const float* qr = Q + ((u64)t * n_heads + h0 + min(gid, G - 1)) * HD;
#pragma unroll
        for (int k = 0; k < KT; k++) {
            const int c = 16 * k + 2 * tid;
            qf[k][0] = gid < G ? pack_f16(qr[c] * qs, qr[c + 1] * qs) : 0u;
            qf[k][1] = gid < G ? pack_f16(qr[c + 8] * qs, qr[c + 9] * qs) : 0u;
        }
    }
    float o[KT][4];
#pragma unroll
    for (int k = 0; k < KT; k++) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2tid, 2tid + 1

    for (int j = 0, it = warp; it < ntiles; j++, it += 4) {
        int2 e;
        entries(it + 4 * S, e);  // the tile this stage takes next, looked up a step ahead
        cp_async_wait<S - 1>();
        __syncwarp();
        const u16* K = ring + (j % S) * STAGE;
        const u16* V = K + TP * LD;
        // S^T = K Q^T: 16 positions x 8 heads
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < KT; k++) {
            u32 a[4];
            ldsm_x4(a, K + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * k + 8 * (lane >> 4));
            mma_f16(sc, a, qf[k][0], qf[k][1]);
        }
        const int pa = p0 + it * TP + gid;
        if (pa >= p1) sc[0] = sc[1] = -INFINITY;
        if (pa + 8 >= p1) sc[2] = sc[3] = -INFINITY;
        // online softmax per head (a column): maxima over the 16 positions (gid, gid + 8)
        float x0 = fmaxf(sc[0], sc[2]), x1 = fmaxf(sc[1], sc[3]);
#pragma unroll
        for (int o2 = 4; o2 < 32; o2 <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o2));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o2));
        }
        // a tile holds at least one position of the range: the maxima are finite
        x0 = fmaxf(m0, x0);
        x1 = fmaxf(m1, x1);
        const float c0 = exp2f(m0 - x0), c1 = exp2f(m1 - x1);
        m0 = x0;
        m1 = x1;
        const float e0 = exp2f(sc[0] - x0), e1 = exp2f(sc[1] - x1);
        const float e2 = exp2f(sc[2] - x0), e3 = exp2f(sc[3] - x1);
        l0 = l0 * c0 + e0 + e2;
        l1 = l1 * c1 + e1 + e3;
        // P^T as B fragments (k = positions, n = heads): the two 8 x 8 halves transposed
        const u32 b0 = movmatrix_t(pack_f16(e0, e1)), b1 = movmatrix_t(pack_f16(e2, e3));
        // O^T += V^T P^T: dims 16k .. 16k + 15
#pragma unroll
        for (int k = 0; k < KT; k++) {
            o[k][0] *= c0;
            o[k][1] *= c1;
            o[k][2] *= c0;
            o[k][3] *= c1;
            u32 a[4];
            ldsm_x4_t(a, V + ((lane & 7) + 8 * (lane >> 4)) * LD + 16 * k + 8 * ((lane >> 3) & 1));
            mma_f16(o[k], a, b0, b1);
        }
        __syncwarp();  // every lane has read this stage before it is refilled
        issue(it + 4 * S, j % S, e);
    }
    cp_async_wait_all();
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    __syncthreads();  // every warp is done with its ring: the space is the merge's now
    float* wo = (float*)att_smem;                  // [4 warps][8 heads][HD]
    float* so = wo + 4 * ATT_MMA_HEADS * HD;       // [8][HD]
    float* wm = so + ATT_MMA_HEADS * HD;           // [4][8]
    float* wl = wm + 4 * ATT_MMA_HEADS;            // [4][8]
    float* sm = wl + 4 * ATT_MMA_HEADS;            // [8]
    float* sl = sm + ATT_MMA_HEADS;                // [8]
    float* merge = sl + ATT_MMA_HEADS;             // [2][8][ATT_MAXSPLITS]
    {
        float* w = wo + warp * ATT_MMA_HEADS * HD;
#pragma unroll
        for (int k = 0; k < KT; k++) {
            const int d = 16 * k + gid;
            w[(2 * tid) * HD + d] = o[k][0];
            w[(2 * tid + 1) * HD + d] = o[k][1];
            w[(2 * tid) * HD + d + 8] = o[k][2];
            w[(2 * tid + 1) * HD + d + 8] = o[k][3];
        }
        if (gid == 0) {
            wm[warp * ATT_MMA_HEADS + 2 * tid] = m0;
            wm[warp * ATT_MMA_HEADS + 2 * tid + 1] = m1;
            wl[warp * ATT_MMA_HEADS + 2 * tid] = l0;
            wl[warp * ATT_MMA_HEADS + 2 * tid + 1] = l1;
        }
    }
    __syncthreads();
    // the warps' states merged per head: maxima in natural-log units for attn_decode_finish
    for (int i = threadIdx.x; i < G * HD; i += ATT_THREADS) {
        const int h = i / HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++) M = fmaxf(M, wm[w * ATT_MMA_HEADS + h]);
        float acc = 0.f, L = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float mw = wm[w * ATT_MMA_HEADS + h], f = mw == -INFINITY ? 0.f : exp2f(mw - M);
            acc += f * wo[(w * ATT_MMA_HEADS + h) * HD + i % HD];
            L += f * wl[w * ATT_MMA_HEADS + h];
        }
        so[i] = acc;
        if (i % HD == 0) {
            sm[h] = M * 0.69314718f;
            sl[h] = L;
        }
    }
    __syncthreads();
    attn_decode_finish<HD>(so, sm, sl, merge, G, h0, t, s, ns, n_splits, n_heads, partial, count, out, xq, xd);
}

// attn_decode_mma_h<HD>_s<S>: grid (n_kv, t, n_splits), 128 threads, AttnMma<HD, S>::SMEM
// bytes of dynamic shared memory.
#define ATTM(HD, S)                                                                                 \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_decode_mma_h##HD##_s##S(         \
        const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc, int block_size,         \
        const int* pos, const int* tbl_off, const int* tables, int n_splits, float scale,            \
        float* partial, int* count, float* out, i8* xq, float2* xd) {                               \
        attn_decode_mma<HD, S>(Q, n_heads, n_kv, kc, vc, block_size, pos, tbl_off, tables, n_splits, \
                               scale, partial, count, out, xq, xd);                                  \
    }
// Rings of 2 tiles: 3 were no faster anywhere (`gpu-check --perf`, 8B heads at 16384: 28.9 us
// against 28.6, at 4096 13.3 against 12.8; 8B tg128 at depth 16384 305 against 311 tok/s).
ATTM(64, 2) ATTM(128, 2) ATTM(256, 2)
