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

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_f16(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

// Four 8x8 f16 matrices, transposed: lanes 8i .. 8i + 7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4_t(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

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
