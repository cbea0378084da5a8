// Quantized mat-mat for steps of more tokens than the mat-vecs take (batched decode of 9-64
// sequences): out[t][row] (+)= W[row] . x[t], on the int8 tensor cores.
//
// The weights' pieces (32 weights: value = a * q + b, a per 16 weights for Q6_K; q signed, Q6_K's
// as 4 (q - 32) with a / 4, see q6_word) go from device memory straight into mma.sync fragments, against the same int8
// activation blocks the mat-vecs read; each piece's int32 dot (Q6_K: each half's) is scaled
// into f32 accumulators by the piece's scales and the activation block's. A block is WK (4 or 8)
// warps over the same 16 rows: warp w takes units w, w + WK, ... of the rows (K split keeps
// every warp's loads in flight on long rows) against every token of the tile (8 NJ tokens); the
// block then sums the warps' partials. Grid: (rows / 16, T8 / (8 NJ)), rows rounded up; rows past
// the end re-read the last one, and they and tokens past T are never stored.
//
// The activations come in a layout of their own (quantize_q_t below), piece-major: int8
// [P][T8][32] and (d, d * sum) [P][T8], T8 the step's tokens rounded up to the tile width (zeros
// past T). A fragment's 8 tokens are then 256 contiguous bytes and their scales 64, where the
// token-major layout of the mat-vecs put each token on its own cache line (8 L1 wavefronts per
// load instead of 2).
//
// Fragments of mma.m16n8k32.s8 (gid = lane / 4, tid = lane % 4):
//   A: a0 = A[gid][4tid..], a1 = A[gid + 8][4tid..], a2 = A[gid][16 + 4tid..], a3 = A[gid + 8][16 + 4tid..]
//   B: b0 = B[4tid..][gid], b1 = B[16 + 4tid..][gid]
//   C: c0 = C[gid][2tid], c1 = C[gid][2tid + 1], c2 = C[gid + 8][2tid], c3 = C[gid + 8][2tid + 1]
// m16n8k16 takes (a0, a1) and b0 of the same layout. The sum over k does not care which k a
// word stands for as long as A and B agree: where one scale covers the piece, lane tid takes
// the piece's words 2tid and 2tid + 1 (one 8-byte load on each side), else words tid and
// tid + 4 (the halves stay apart).

// The int32 sums start from 1.5 * 2^23: their bits then read as that float plus the dot
// (|dot| < 2^22: at most 32 * 128 * 128; Q6_K's 4 (q - 32) are k16 sums of at most
// 16 * 128 * 128), so the conversion is one subtraction.
#define MMQ_BIAS 0x4B400000
#define MMQ_BIASF 12582912.f

__device__ __forceinline__ void mma_k32(float* c, int a0, int a1, int a2, int a3, int b0, int b1) {
    int r[4];
    mma_s8_k32(r, a0, a1, a2, a3, b0, b1, MMQ_BIAS);
    c[0] = __int_as_float(r[0]) - MMQ_BIASF;
    c[1] = __int_as_float(r[1]) - MMQ_BIASF;
    c[2] = __int_as_float(r[2]) - MMQ_BIASF;
    c[3] = __int_as_float(r[3]) - MMQ_BIASF;
}

__device__ __forceinline__ void mma_k16(float* c, int a0, int a1, int b0) {
    int r[4];
    mma_s8_k16(r, a0, a1, b0, MMQ_BIAS);
    c[0] = __int_as_float(r[0]) - MMQ_BIASF;
    c[1] = __int_as_float(r[1]) - MMQ_BIASF;
    c[2] = __int_as_float(r[2]) - MMQ_BIASF;
    c[3] = __int_as_float(r[3]) - MMQ_BIASF;
}

// x [T, n] into the mat-mat's activation layout (see the top): grid (T8, parts), 256 threads,
// each warp one 32-value piece of one token; tokens T..T8 get zeros.
extern "C" __global__ void __launch_bounds__(256) quantize_q_t(const float* x, i8* q, float2* qd, int n,
                                                                int T, int T8) { GRID_DEP();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.x;
    for (int base = (blockIdx.y * 8 + warp) * 32; base < n; base += gridDim.y * 256) {
        int P = base / 32;
        float v = t < T ? x[(u64)t * n + base + lane] : 0.f;
        quant32(v, q + ((u64)P * T8 + t) * 32, qd + (u64)P * T8 + t);
    }
}

// Whether a piece has one scale (its words pair up, see above) or two (Q6_K).
template <int TY> struct Halves { enum { V = TY == T_Q6_K }; };

// One lane's two words of a piece of one row (lo: the first of the pair / the first half's,
// hi: the other), the piece's scales and its index P among the row's 32-weight pieces.
struct PieceW {
    int lo, hi;
    float a0, a1, b;
    int P;
};

// The raw words of unit u of one row that one lane needs (loaded a unit ahead of their use,
// so a warp's next weight loads are in flight while it multiplies the current ones).
template <int TY> struct Raw;
template <> struct Raw<T_Q4_0> { int v; u16 d; };
template <> struct Raw<T_Q5_0> { u32 qh, qs; u16 d; };
template <> struct Raw<T_Q8_0> { int2 v; u16 d; };
template <> struct Raw<T_Q4_1> { int v; u32 dm; };
template <> struct Raw<T_Q5_1> { u32 qh, qs; u32 dm; };
template <> struct Raw<T_Q4_K> { uint4 hd; int2 v; };
template <> struct Raw<T_Q5_K> { uint4 hd; int2 v, h; };
template <> struct Raw<T_Q6_K> { int l0, l1, h0, h1; uint2 sv; u16 d; };

template <int TY>
__device__ __forceinline__ Raw<TY> unit_load(const u8* __restrict__ W, u64 nblk, int row, int bpr, int u,
                                             int tid) {
    Raw<TY> r;
    if constexpr (Small<TY>::V) {
        u64 blk = (u64)row * bpr + u;
        const u8* a = W + blk * Blk<TY>::A;
        small_scale<TY>(r, W + nblk * Blk<TY>::A, blk);
        if constexpr (TY == T_Q8_0) r.v = ((const int2*)a)[tid];
        else if constexpr (TY == T_Q4_0 || TY == T_Q4_1) r.v = ((const int*)a)[tid];
        else {  // Q5_0 / Q5_1: qh (4 bytes) then qs (16 bytes)
            r.qh = ((const u32*)a)[0];
            r.qs = ((const u32*)a)[1 + tid];
        }
    } else if constexpr (TY == T_Q4_K) {
        // unit = 64 weights: sub-blocks 2c (low nibbles) and 2c + 1 (high) of chunk c; the
        // block's header (d, dmin, the 12 scale bytes) in one 16-byte load
        int b = u >> 2, c = u & 3;
        const u8* blk = W + ((u64)row * bpr + b) * 144;
        r.hd = *(const uint4*)blk;
        r.v = ((const int2*)(blk + 16 + 32 * c))[tid];
    } else if constexpr (TY == T_Q5_K) {
        // as Q4_K, and the qh bytes of this lane's 8 weights (16-47 of the 176-byte block)
        int b = u >> 2, c = u & 3;
        const u8* blk = W + ((u64)row * bpr + b) * 176;
        r.hd = *(const uint4*)blk;
        r.h = ((const int2*)(blk + 16))[tid];
        r.v = ((const int2*)(blk + 48 + 32 * c))[tid];
    } else {
        // Q6_K unit = pieces pp and pp + 2 of half n: they share the ql bytes (low / high nibbles)
        int b = u >> 2, n = (u >> 1) & 1, pp = u & 1;
        u64 bi = (u64)row * bpr + b;
        const u8* blk = W + bi * 208;
        r.d = ((const u16*)(W + nblk * 208))[bi];
        const int* ql = (const int*)(blk + 64 * n + 32 * pp);
        const int* qh = (const int*)(blk + 128 + 32 * n);
        r.l0 = ql[tid];
        r.l1 = ql[4 + tid];
        r.h0 = qh[tid];
        r.h1 = qh[4 + tid];
        r.sv = *(const uint2*)(blk + 192 + 8 * n);  // the half's 8 scales: sc(i) = scale 8n + i
    }
    return r;
}

// Four Q6_K weights, one a byte, as int8 4 (q - 32) for the tensor cores' signed operands: ql
// holds their low nibbles at bits 0-3 (h = 0) or 4-7 (h = 1), qh their two high bits at bits
// 2p, 2p + 1 (p: the piece within its half). Four times the weight (its scale takes the 1/4) so
// that no byte subtraction is needed: 4q lies in 0..252, and 4q - 128 is 4q with bit 7 flipped
// (sm_90 has no SIMD byte subtract; __vsubss4 costs ~8 instructions a word). The mat-vec keeps q
// and folds the 32 into its dot instead (x_piece), which costs fewer instructions there.
__device__ __forceinline__ int q6_word(u32 ql, u32 qh, int h, int p) {
    u32 lo = (h == 0 ? ql << 2 : ql >> 2) & 0x3C3C3C3Cu;  // low nibbles to bits 2-5
    u32 hi = (qh << (6 - 2 * p)) & 0xC0C0C0C0u;           // high bits to bits 6-7
    return (int)((lo | hi) ^ 0x80808080u);
}

// Scale and min of sub-block 2c + h of a Q4_K block, picked from whole words as
// scale_min_k4_pair does (no byte-by-byte selects).
__device__ __forceinline__ void scale_min_k4_word(int c, int h, u32 s0, u32 s1, u32 s2, int& d, int& m) {
    bool first = c < 2;
    u32 sw = first ? s0 & 0x3F3F3F3Fu : (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    u32 mw = first ? s1 & 0x3F3F3F3Fu : ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    int sh = 16 * (c & 1) + 8 * h;
    d = (int)((sw >> sh) & 0xFF);
    m = (int)((mw >> sh) & 0xFF);
}

// The pieces of unit u (one for the 32-weight blocks, two for the K-quants) from its raw words.
// STAGED: a Q4_K unit's scales and mins from whole words (scale_min_k4_word), fewer
// instructions than byte by byte (scale_min_k4); the staged kernels take it. The register
// kernels keep the bytes: with the words (and piece_mma's staged epilogue) their 8-token tiles
// spilled 16 bytes, and 8 sequences' aggregate decode was 13% slower on the 8B (2026-12-05).
template <int TY, bool STAGED = false>
__device__ __forceinline__ void unit_words(const Raw<TY>& r, int u, int tid, PieceW* p) {
    if constexpr (Small<TY>::V) {
        float mn, d = small_d<TY>(r, mn);
        p[0].a0 = p[0].a1 = d;
        p[0].P = u;
        if constexpr (TY == T_Q4_1) {
            p[0].lo = r.v & 0x0F0F0F0F;
            p[0].hi = (r.v >> 4) & 0x0F0F0F0F;
            p[0].b = mn;
        } else if constexpr (TY == T_Q5_1) {
            p[0].lo = (int)(r.qs & 0x0F0F0F0Fu) | spread4(r.qh >> (4 * tid));
            p[0].hi = (int)((r.qs >> 4) & 0x0F0F0F0Fu) | spread4(r.qh >> (16 + 4 * tid));
            p[0].b = mn;
        } else if constexpr (TY == T_Q8_0) {
            p[0].lo = r.v.x;
            p[0].hi = r.v.y;
            p[0].b = 0.f;
        } else if constexpr (TY == T_Q4_0) {
            // byte i holds weights i (low nibble) and 16 + i (high): word tid gives both halves
            p[0].lo = r.v & 0x0F0F0F0F;
            p[0].hi = (r.v >> 4) & 0x0F0F0F0F;
            p[0].b = -8.f * d;
        } else {
            p[0].lo = (int)(r.qs & 0x0F0F0F0Fu) | spread4(r.qh >> (4 * tid));
            p[0].hi = (int)((r.qs >> 4) & 0x0F0F0F0Fu) | spread4(r.qh >> (16 + 4 * tid));
            p[0].b = -16.f * d;
        }
    } else if constexpr (TY == T_Q4_K || TY == T_Q5_K) {
        int b = u >> 2, c = u & 3;
        float d = h2f((u16)(r.hd.x & 0xFFFF)), dmin = h2f((u16)(r.hd.x >> 16));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int s, m;
            if (STAGED) scale_min_k4_word(c, h, r.hd.y, r.hd.z, r.hd.w, s, m);
            else scale_min_k4(2 * c + h, r.hd.y, r.hd.z, r.hd.w, s, m);
            p[h].lo = (r.v.x >> (4 * h)) & 0x0F0F0F0F;
            p[h].hi = (r.v.y >> (4 * h)) & 0x0F0F0F0F;
            if constexpr (TY == T_Q5_K) {  // levels 0..31: the fifth bit at bit 4
                p[h].lo |= (int)fifth4((u32)r.h.x, 2 * c + h);
                p[h].hi |= (int)fifth4((u32)r.h.y, 2 * c + h);
            }
            p[h].a0 = p[h].a1 = d * (float)s;
            p[h].b = -dmin * (float)m;
            p[h].P = b * 8 + 2 * c + h;
        }
    } else {
        int b = u >> 2, n = (u >> 1) & 1, pp = u & 1;
        float d = 0.25f * h2f(r.d);  // the words are 4 (q - 32): see q6_word
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int q = pp + 2 * h;  // piece within the half
            p[h].lo = q6_word((u32)r.l0, (u32)r.h0, h, q);
            p[h].hi = q6_word((u32)r.l1, (u32)r.h1, h, q);
            p[h].a0 = d * sbyte(r.sv, 2 * q);
            p[h].a1 = d * sbyte(r.sv, 2 * q + 1);
            p[h].b = 0.f;
            p[h].P = b * 8 + 4 * n + q;
        }
    }
}

// One piece (k) of a unit against one 8-token activation fragment: the B words at xp (this
// lane's token), the scales dd = (d, d * sum) of this lane's two C tokens; acc[m] the MR row
// tiles' accumulators of this fragment. STAGED: the staged kernels' epilogue (fewer
// instructions; in the register kernels it cost registers, and spills at 16 tokens).
template <int TY, int MR, int PIECES, bool STAGED = false>
__device__ __forceinline__ void piece_mma(float (*acc)[4], const PieceW (*pa)[PIECES], const PieceW (*pb)[PIECES],
                                          int k, const i8* xp, float4 dd, int tid) {
    float2 d0 = make_float2(dd.x, dd.y), d1 = make_float2(dd.z, dd.w);
    int b0, b1;
    if (Halves<TY>::V || TY == T_Q4_0 || TY == T_Q5_0 || TY == T_Q4_1 || TY == T_Q5_1) {
        b0 = ((const int*)xp)[tid];
        b1 = ((const int*)xp)[4 + tid];
    } else {
        int2 v = ((const int2*)xp)[tid];
        b0 = v.x;
        b1 = v.y;
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        const PieceW &A = pa[m][k], &B = pb[m][k];
        float* a = acc[m];
        float c[4];
        if (Halves<TY>::V) {
            float ch[4];
            mma_k16(c, A.lo, B.lo, b0);
            mma_k16(ch, A.hi, B.hi, b1);
            a[0] += d0.x * (A.a0 * c[0] + A.a1 * ch[0]) + A.b * d0.y;
            a[1] += d1.x * (A.a0 * c[1] + A.a1 * ch[1]) + A.b * d1.y;
            a[2] += d0.x * (B.a0 * c[2] + B.a1 * ch[2]) + B.b * d0.y;
            a[3] += d1.x * (B.a0 * c[3] + B.a1 * ch[3]) + B.b * d1.y;
        } else {
            mma_k32(c, A.lo, B.lo, A.hi, B.hi, b0, b1);
            if (STAGED) {
                // the min term into the accumulator first, then the scaled dot: two fused
                // multiply-adds an output where the form below compiles to a multiply, a
                // multiply-add and an add
                a[0] = fmaf(d0.x * A.a0, c[0], fmaf(A.b, d0.y, a[0]));
                a[1] = fmaf(d1.x * A.a0, c[1], fmaf(A.b, d1.y, a[1]));
                a[2] = fmaf(d0.x * B.a0, c[2], fmaf(B.b, d0.y, a[2]));
                a[3] = fmaf(d1.x * B.a0, c[3], fmaf(B.b, d1.y, a[3]));
            } else {
                a[0] += d0.x * A.a0 * c[0] + A.b * d0.y;
                a[1] += d1.x * A.a0 * c[1] + A.b * d1.y;
                a[2] += d0.x * B.a0 * c[2] + B.b * d0.y;
                a[3] += d1.x * B.a0 * c[3] + B.b * d1.y;
            }
        }
    }
}

// The block's WK warps' partial sums (acc, each warp over its share of the units) added in
// shared memory `red` (WK * NJ * MR * 128 floats); store(row, t, v) for each of the block's 16 MR
// rows from r0 and 8 NJ tokens from t0.
template <int NJ, int WK, int MR, class Store>
__device__ __forceinline__ void mmq_sum(float (*acc)[MR][4], float* red, int r0, int t0, Store store) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // entry e = ((j * MR + m) * 4 + i) * 32 + lane of each warp's slice
    constexpr int SLICE = NJ * MR * 128;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp * SLICE + ((j * MR + m) * 4 + i) * 32 + lane] = acc[j][m][i];
    __syncthreads();
    for (int e = threadIdx.x; e < SLICE; e += WK * 32) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < WK; w++) v += red[w * SLICE + e];
        int l = e & 31, i = (e >> 5) & 3, jm = e >> 7, j = jm / MR, m = jm % MR;
        store(r0 + 16 * m + (l >> 2) + (i >= 2 ? 8 : 0), t0 + 8 * j + 2 * (l & 3) + (i & 1), v);
    }
}

// mmq_sum's reduction stored (EPI 0) or added (1) to out[t][row] (rows a token), rows below
// `rows` and tokens below T. Written out rather than as an mmq_sum store: through the lambda
// NVRTC scheduled the staged kernels differently (sass.py --rev), and the dense kernels' code
// is kept as it was timed.
template <int NJ, int WK, int MR, int EPI>
__device__ __forceinline__ void mmq_reduce(float (*acc)[MR][4], float* red, int r0, int t0, int rows, int T,
                                           float* __restrict__ out) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // entry e = ((j * MR + m) * 4 + i) * 32 + lane of each warp's slice
    constexpr int SLICE = NJ * MR * 128;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp * SLICE + ((j * MR + m) * 4 + i) * 32 + lane] = acc[j][m][i];
    __syncthreads();
    for (int e = threadIdx.x; e < SLICE; e += WK * 32) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < WK; w++) v += red[w * SLICE + e];
        int l = e & 31, i = (e >> 5) & 3, jm = e >> 7, j = jm / MR, m = jm % MR;
        int row = r0 + 16 * m + (l >> 2) + (i >= 2 ? 8 : 0);
        int t = t0 + 8 * j + 2 * (l & 3) + (i & 1);
        if (row < rows && t < T) {
            float* o = out + (u64)t * rows + row;
            if (EPI == 0) *o = v;
            else *o += v;
        }
    }
}

// A block is WK warps over the same 16 MR rows (MR tiles of 16), warp w taking units w, w + WK,
// ... With PF the next unit's words are loaded before the current one is multiplied. With MR = 2
// each activation fragment (and its scales) feeds two mma, one per tile: half the activation
// loads per weight.
// acc: this warp's partial sums of rows r0.. (of the `rows` of W) and tokens t0.. (of the
// activations' T8).
template <int TY, int NJ, int WK, int PF, int MR>
__device__ __forceinline__ void mmq_acc(const u8* __restrict__ W, int rows, int cols, const i8* __restrict__ xq,
                                        const float2* __restrict__ xd, int T8, int r0, int t0,
                                        float (&acc)[NJ][MR][4]) {
    constexpr int PIECES = Blk<TY>::UNIT / 32;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    int ra[MR], rb[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        ra[m] = min(r0 + 16 * m + gid, rows - 1);
        rb[m] = min(r0 + 16 * m + gid + 8, rows - 1);
    }
    int bpr = cols / Blk<TY>::QK;
    u64 nblk = (u64)rows * bpr;
    int units = cols / Blk<TY>::UNIT;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[j][m][0] = acc[j][m][1] = acc[j][m][2] = acc[j][m][3] = 0.f;
    Raw<TY> na[MR], nb[MR];
    if (PF && warp < units) {
#pragma unroll
        for (int m = 0; m < MR; m++) {
            na[m] = unit_load<TY>(W, nblk, ra[m], bpr, warp, tid);
            nb[m] = unit_load<TY>(W, nblk, rb[m], bpr, warp, tid);
        }
    }
    // unpipelined: two units unrolled (their loads hoisted together); pipelined: one at a time
#pragma unroll (2 - PF)
    for (int u = warp; u < units; u += WK) {
        Raw<TY> ca[MR], cb[MR];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            if (PF) {
                ca[m] = na[m];
                cb[m] = nb[m];
                if (u + WK < units) {
                    na[m] = unit_load<TY>(W, nblk, ra[m], bpr, u + WK, tid);
                    nb[m] = unit_load<TY>(W, nblk, rb[m], bpr, u + WK, tid);
                }
            } else {
                ca[m] = unit_load<TY>(W, nblk, ra[m], bpr, u, tid);
                cb[m] = unit_load<TY>(W, nblk, rb[m], bpr, u, tid);
            }
        }
        PieceW pa[MR][PIECES], pb[MR][PIECES];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            unit_words<TY>(ca[m], u, tid, pa[m]);
            unit_words<TY>(cb[m], u, tid, pb[m]);
        }
#pragma unroll
        for (int k = 0; k < PIECES; k++) {
            int P = pa[0][k].P;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                // this lane's B token t0 + 8j + gid; its C tokens t0 + 8j + 2tid and the next
                const i8* xp = xq + ((u64)P * T8 + t0 + 8 * j + gid) * 32;
                float4 dd = *(const float4*)(xd + (u64)P * T8 + t0 + 8 * j + 2 * tid);
                piece_mma<TY, MR, PIECES>(acc[j], pa, pb, k, xp, dd, tid);
            }
        }
    }
}

template <int TY, int NJ, int WK, int PF, int MR, int EPI>
__device__ __forceinline__ void mmq(const u8* __restrict__ W, int rows, int cols, const i8* __restrict__ xq,
                                    const float2* __restrict__ xd, int T8, int T,
                                    float* __restrict__ out, int rblk) {
    __shared__ float red[WK * NJ * MR * 4 * 32];
    int r0 = rblk * 16 * MR, t0 = blockIdx.y * 8 * NJ;
    float acc[NJ][MR][4];
    mmq_acc<TY, NJ, WK, PF, MR>(W, rows, cols, xq, xd, T8, r0, t0, acc);
    mmq_reduce<NJ, WK, MR, EPI>(acc, red, r0, t0, rows, T, out);
}

// The staged mat-mat (K-quants): the same block and fragments as mmq, but each warp streams
// its units through a ring of S stages in shared memory by cp.async (S - 1 units in flight
// while it multiplies one), the weights' bytes of its 16 MR rows and the unit's two pieces of
// activations for the block's 8 NJ tokens together. mmq keeps one unit in flight in registers
// and loads the activations when it multiplies: a warp then waits a memory round trip a unit.
// A stage: the rows' records (Q4_K: the 16-byte header and the unit's 32 quant bytes; Q5_K:
// the header, the block's 32 qh bytes and the unit's 32 quant bytes; Q6_K: 32 ql, 32 qh, 8
// scale and the 4-byte word holding d), then per piece its tokens' 32 int8 (TW x 32) and after
// both pieces their (d, d * sum).
template <int TY, int NJ, int MR>
struct Stage {
    enum {
        RB = TY == T_Q4_K ? 48 : 80,  // Q5_K and Q6_K: 80
        TW = 8 * NJ,
        WB = MR * 16 * RB,
        XQ = 2 * TW * 32,
        BYTES = WB + XQ + 2 * TW * 8,
    };
};

// Piece k (0, 1) of unit u of a K-quant row, as unit_words numbers it.
template <int TY>
__device__ __forceinline__ int unit_piece(int u, int k) {
    if (TY == T_Q4_K || TY == T_Q5_K) return (u >> 2) * 8 + 2 * (u & 3) + k;
    return (u >> 2) * 8 + 4 * ((u >> 1) & 1) + (u & 1) + 2 * k;
}

// The warp's copies of unit u's weight bytes for rows r0.. (clamped to the last row) into `st`.
template <int TY, int MR>
__device__ __forceinline__ void stage_weights(u8* st, const u8* __restrict__ W, u64 nblk, int r0, int rows,
                                              int bpr, int u, int lane) {
    int b = u >> 2;
    if constexpr (TY == T_Q4_K) {
        int c = u & 3;
#pragma unroll
        for (int i = lane; i < MR * 48; i += 32) {  // 16 MR rows x 3 pieces of 16 bytes
            int rec = i / 3, part = i - 3 * rec;
            const u8* blk = W + ((u64)min(r0 + rec, rows - 1) * bpr + b) * 144;
            cp_async16(st + rec * 48 + 16 * part, part == 0 ? blk : blk + 16 * part + 32 * c);
        }
    } else if constexpr (TY == T_Q5_K) {
        int c = u & 3;
#pragma unroll
        for (int i = lane; i < MR * 80; i += 32) {  // 16 MR rows x 5 pieces of 16 bytes
            int rec = i / 5, part = i - 5 * rec;
            const u8* blk = W + ((u64)min(r0 + rec, rows - 1) * bpr + b) * 176;
            cp_async16(st + rec * 80 + 16 * part, part < 3 ? blk + 16 * part : blk + 16 * part + 32 * c);
        }
    } else {
        int n = (u >> 1) & 1, pp = u & 1;
#pragma unroll
        for (int i = lane; i < MR * 64; i += 32) {  // 16 MR rows x (2 of ql, 2 of qh)
            int rec = i >> 2, part = i & 3;
            const u8* blk = W + ((u64)min(r0 + rec, rows - 1) * bpr + b) * 208;
            cp_async16(st + rec * 80 + 16 * part,
                       part < 2 ? blk + 64 * n + 32 * pp + 16 * part : blk + 128 + 32 * n + 16 * (part - 2));
        }
#pragma unroll
        for (int i = lane; i < MR * 32; i += 32) {  // 16 MR rows x (scales, d)
            int rec = i >> 1;
            u64 bi = (u64)min(r0 + rec, rows - 1) * bpr + b;
            if (i & 1) cp_async4(st + rec * 80 + 72, W + nblk * 208 + ((2 * bi) & ~(u64)3));
            else cp_async8(st + rec * 80 + 64, W + bi * 208 + 192 + 8 * n);
        }
    }
}

// The warp's copies of unit u's two pieces of activations for tokens t0.. into `st`.
template <int TY, int NJ, int MR>
__device__ __forceinline__ void stage_acts(u8* st, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                           int T8, int t0, int u, int lane) {
    using G = Stage<TY, NJ, MR>;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        u64 P = unit_piece<TY>(u, k);
        const u8* q = (const u8*)(xq + (P * T8 + t0) * 32);
        const u8* d = (const u8*)(xd + P * T8 + t0);
#pragma unroll
        for (int i = lane; i < G::TW * 2; i += 32) cp_async16(st + G::WB + k * G::TW * 32 + 16 * i, q + 16 * i);
        if (lane < G::TW / 2) cp_async16(st + G::WB + G::XQ + k * G::TW * 8 + 16 * lane, d + 16 * lane);
    }
}

// One lane's words of a staged row record (dhi: d is the word's high half).
template <int TY>
__device__ __forceinline__ Raw<TY> unit_record(const u8* rec, int tid, int dhi) {
    Raw<TY> r;
    if constexpr (TY == T_Q4_K) {
        r.hd = *(const uint4*)rec;
        r.v = ((const int2*)(rec + 16))[tid];
    } else if constexpr (TY == T_Q5_K) {
        r.hd = *(const uint4*)rec;
        r.h = ((const int2*)(rec + 16))[tid];
        r.v = ((const int2*)(rec + 48))[tid];
    } else {
        const int* w = (const int*)rec;
        r.l0 = w[tid];
        r.l1 = w[4 + tid];
        r.h0 = w[8 + tid];
        r.h1 = w[12 + tid];
        r.sv = *(const uint2*)(rec + 64);
        u32 dw = *(const u32*)(rec + 72);
        r.d = (u16)(dhi ? dw >> 16 : dw & 0xFFFF);
    }
    return r;
}

template <int TY, int NJ, int WK, int MR, int S, int EPI>
__device__ __forceinline__ void mmq_staged(const u8* __restrict__ W, int rows, int cols, const i8* __restrict__ xq,
                                           const float2* __restrict__ xd, int T8, int T, float* __restrict__ out,
                                           int rblk) {
    using G = Stage<TY, NJ, MR>;
    extern __shared__ __align__(16) u8 smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    int r0 = rblk * 16 * MR, t0 = blockIdx.y * 8 * NJ;
    int bpr = cols / 256, units = cols / 64;
    u64 nblk = (u64)rows * bpr;
    u8* ring = smem + warp * S * G::BYTES;
    int n = units > warp ? (units - warp + WK - 1) / WK : 0;  // this warp's units: warp + i WK
    // the weights first: no kernel writes them, so they need not wait for the one before
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < n) stage_weights<TY, MR>(ring + s * G::BYTES, W, nblk, r0, rows, bpr, warp + s * WK, lane);
    GRID_DEP();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n) stage_acts<TY, NJ, MR>(ring + s * G::BYTES, xq, xd, T8, t0, warp + s * WK, lane);
        cp_async_commit();
    }
    // this lane's records and the parity of its rows' first block (Q6_K's d: two to a word)
    int ra[MR], rb[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        ra[m] = (u64)min(r0 + 16 * m + gid, rows - 1) * bpr & 1;
        rb[m] = (u64)min(r0 + 16 * m + gid + 8, rows - 1) * bpr & 1;
    }
    float acc[NJ][MR][4];
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[j][m][0] = acc[j][m][1] = acc[j][m][2] = acc[j][m][3] = 0.f;
    for (int i = 0; i < n; i++) {
        // unit i + S - 1 into the slot unit i - 1 left (S - 1 units in flight while i multiplies)
        int nx = i + S - 1;
        if (nx < n) {
            u8* d = ring + (nx % S) * G::BYTES;
            stage_weights<TY, MR>(d, W, nblk, r0, rows, bpr, warp + nx * WK, lane);
            stage_acts<TY, NJ, MR>(d, xq, xd, T8, t0, warp + nx * WK, lane);
        }
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncwarp();
        const u8* st = ring + (i % S) * G::BYTES;
        int u = warp + i * WK, bodd = (u >> 2) & 1;
        PieceW pa[MR][2], pb[MR][2];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            unit_words<TY, true>(unit_record<TY>(st + (16 * m + gid) * G::RB, tid, ra[m] ^ bodd), u, tid, pa[m]);
            unit_words<TY, true>(unit_record<TY>(st + (16 * m + gid + 8) * G::RB, tid, rb[m] ^ bodd), u, tid, pb[m]);
        }
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const i8* xp = (const i8*)(st + G::WB + (k * G::TW + 8 * j + gid) * 32);
                float4 dd = *(const float4*)(st + G::WB + G::XQ + (k * G::TW + 8 * j + 2 * tid) * 8);
                piece_mma<TY, MR, 2, true>(acc[j], pa, pb, k, xp, dd, tid);
            }
        __syncwarp();
    }
    cp_async_wait_all();
    __syncthreads();  // every warp is done with its ring: the reduction reuses the memory
    mmq_reduce<NJ, WK, MR, EPI>(acc, (float*)smem, r0, t0, rows, T, out);
}

// The matrices of one launch (mmq::MMQ_GROUP, the projections sharing an input): block x of
// the grid takes row block x of the first, then the second's, ...; unused entries have 0 rows.
#define MMQ_MATS_ARGS const u8 *W0, int r0, float *o0, const u8 *W1, int r1, float *o1, const u8 *W2, int r2, \
    float *o2, const u8 *W3, int r3, float *o3
struct MmqPick {
    const u8* W;
    int rows;
    float* out;
    int rblk;
};
// Row block b of the launch's matrices (blocks of `per` rows, the matrices' in order).
__device__ __forceinline__ MmqPick mmq_pick_at(MMQ_MATS_ARGS, int per, int b) {
    int n;
    if (b < (n = (r0 + per - 1) / per)) return {W0, r0, o0, b};
    b -= n;
    if (b < (n = (r1 + per - 1) / per)) return {W1, r1, o1, b};
    b -= n;
    if (b < (n = (r2 + per - 1) / per)) return {W2, r2, o2, b};
    return {W3, r3, o3, b - n};
}

__device__ __forceinline__ MmqPick mmq_pick(MMQ_MATS_ARGS, int per) {
    return mmq_pick_at(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, per, blockIdx.x);
}

// mmq_<type>_<NJ>_<epi>_w<WK>: tiles of 8 NJ tokens (T8 a multiple of it); epi 0 store, 1 add
// (the residual); WK warps a block split the row, one 16-row tile (the staged kernels below take
// two where that pays). Pipelined (one unit at a time, the next one's words in flight) where
// that measured faster (docs/cuda.md: 8-16 tokens, and 8 warps); with 4 warps and 32-64 tokens
// two units unrolled, whose activation loads then overlap.
#define MMQ1(NAME, TY, NJ, EPI, WK)                                                              \
    extern "C" __global__ void __launch_bounds__(WK * 32) mmq_##NAME##_##NJ##_##EPI##_w##WK(     \
        MMQ_MATS_ARGS, int cols, const i8* xq, const float2* xd, int T8, int T) { GRID_DEP();     \
        MmqPick p = mmq_pick(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, 16);                \
        mmq<TY, NJ, WK, (WK >= 8 || NJ <= 2), 1, EPI>(p.W, p.rows, cols, xq, xd, T8, T, p.out, p.rblk); \
    }
#define MMQ_NJ(NAME, TY, NJ, WK) MMQ1(NAME, TY, NJ, 0, WK) MMQ1(NAME, TY, NJ, 1, WK)
#define MMQ(NAME, TY) MMQ_NJ(NAME, TY, 1, 8) MMQ_NJ(NAME, TY, 2, 4) MMQ_NJ(NAME, TY, 2, 8) \
    MMQ_NJ(NAME, TY, 4, 4) MMQ_NJ(NAME, TY, 4, 8) MMQ_NJ(NAME, TY, 8, 4)
MMQ(q4_0, T_Q4_0)
MMQ(q5_0, T_Q5_0)
MMQ(q8_0, T_Q8_0)
MMQ(q4_k, T_Q4_K)
MMQ(q6_k, T_Q6_K)
MMQ(q4_1, T_Q4_1)
MMQ(q5_1, T_Q5_1)
MMQ(q5_k, T_Q5_K)
// 16 warps at 8 tokens: twice the warps on a matrix of few rows (4,096 rows are 256 blocks)
MMQ_NJ(q4_k, T_Q4_K, 1, 16)
MMQ_NJ(q6_k, T_Q6_K, 1, 16)
MMQ_NJ(q5_k, T_Q5_K, 1, 16)

// mmqs_<type>_<NJ>_<epi>_w<WK>_r<MR>_s<S>: the staged mat-mat (dynamic shared memory:
// max(WK S Stage::BYTES, the reduction's WK NJ MR 512 bytes), as mmq::mmq_launch sizes it).
#define MMQS1(NAME, TY, NJ, EPI, WK, MR, S)                                                           \
    extern "C" __global__ void __launch_bounds__(WK * 32) mmqs_##NAME##_##NJ##_##EPI##_w##WK##_r##MR##_s##S( \
        MMQ_MATS_ARGS, int cols, const i8* xq, const float2* xd, int T8, int T) {                   \
        MmqPick p = mmq_pick(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, 16 * MR);              \
        mmq_staged<TY, NJ, WK, MR, S, EPI>(p.W, p.rows, cols, xq, xd, T8, T, p.out, p.rblk);        \
    }
#define MMQS(NAME, TY, NJ, WK, MR, S) MMQS1(NAME, TY, NJ, 0, WK, MR, S) MMQS1(NAME, TY, NJ, 1, WK, MR, S)
// the shapes mmq::mmq_block_shapes lists: 16 warps of 2 stages (8-64 tokens), 8 warps of 3
// (32), 4 warps of 4 (32) and of 3 (64)
#define MMQS_ALL(NAME, TY) MMQS(NAME, TY, 1, 16, 2, 2) MMQS(NAME, TY, 2, 16, 2, 2) MMQS(NAME, TY, 4, 16, 2, 2) \
    MMQS(NAME, TY, 4, 8, 2, 3) MMQS(NAME, TY, 4, 4, 2, 4) MMQS(NAME, TY, 8, 16, 1, 2) MMQS(NAME, TY, 8, 4, 2, 3)
MMQS_ALL(q4_k, T_Q4_K)
MMQS_ALL(q6_k, T_Q6_K)
MMQS_ALL(q5_k, T_Q5_K)
