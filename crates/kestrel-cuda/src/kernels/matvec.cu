// Quantized mat-vec (decode and batches of up to 8 tokens): out[t][row] = W[row] . x[t].
//
// The hot kernels of decode. One warp per weight row; each lane takes "units" of the row
// (32 or 64 weights), loads their blocks straight from device memory once and dots them with
// every token's activations (int8, one scale per 32, quantized by the norm/quantize kernels):
// NT tokens cost one pass over the weights. Device layout (weights.rs): Q4_K / Q5_K blocks as
// in GGUF (144 / 176 bytes, 16-byte aligned); Q6_K / Q8_0 / Q4_0 / Q5_0 with their f16 scale
// moved to a plane after all blocks, Q4_1 / Q5_1 their (scale, min) word, so every payload is
// 4- or 16-byte aligned.
//
// EPI: 0 store, 1 add into out (the residual), 2 silu(W.x) * (W2.x) (the MLP's gate and up).

// Payload bytes per block in plane A, and weights per block.
template <int TY> struct Blk;
template <> struct Blk<T_Q4_0> { enum { QK = 32, A = 16, UNIT = 32 }; };
template <> struct Blk<T_Q5_0> { enum { QK = 32, A = 20, UNIT = 32 }; };
template <> struct Blk<T_Q8_0> { enum { QK = 32, A = 32, UNIT = 32 }; };
template <> struct Blk<T_Q4_K> { enum { QK = 256, A = 144, UNIT = 64 }; };
template <> struct Blk<T_Q6_K> { enum { QK = 256, A = 208, UNIT = 64 }; };
template <> struct Blk<T_Q4_1> { enum { QK = 32, A = 16, UNIT = 32 }; };
template <> struct Blk<T_Q5_1> { enum { QK = 32, A = 20, UNIT = 32 }; };
template <> struct Blk<T_Q5_K> { enum { QK = 256, A = 176, UNIT = 64 }; };

// The 32-weight block types, and those of them with a min (a (scale, min) word in the plane).
template <int TY> struct Small { enum { V = TY == T_Q4_0 || TY == T_Q5_0 || TY == T_Q8_0 || TY == T_Q4_1 || TY == T_Q5_1 }; };
template <int TY> struct WithMin { enum { V = TY == T_Q4_1 || TY == T_Q5_1 }; };

__device__ __forceinline__ int spread4(u32 b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

// Byte i (< 12) of the 12 scale bytes s0..s2 of a Q4_K block.
__device__ __forceinline__ int kbyte(u32 s0, u32 s1, u32 s2, int i) {
    u32 w = i < 4 ? s0 : (i < 8 ? s1 : s2);
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}

// Scale and min of sub-block j (< 8) of a Q4_K block from its scale bytes held in registers,
// for a j the whole warp shares (the mat-mat's units).
__device__ __forceinline__ void scale_min_k4(int j, u32 s0, u32 s1, u32 s2, int& d, int& m) {
    if (j < 4) {
        d = kbyte(s0, s1, s2, j) & 63;
        m = kbyte(s0, s1, s2, j + 4) & 63;
    } else {
        int a = kbyte(s0, s1, s2, j + 4);
        d = (a & 0xF) | ((kbyte(s0, s1, s2, j - 4) >> 6) << 4);
        m = (a >> 4) | ((kbyte(s0, s1, s2, j) >> 6) << 4);
    }
}

// Scales and mins of sub-blocks 2c and 2c + 1 of a Q4_K block (a mat-vec unit's two pieces)
// from its 12 scale bytes s0..s2, for a c that differs between a warp's lanes: no branch (one
// would run both sides a warp). GGUF packs sub-blocks 0-3 as the low 6 bits of bytes 0-3
// (scales) and 4-7 (mins), 4-7 as the nibbles of bytes 8-11 with their top 2 bits in the top
// bits of bytes 0-7: the four scales (mins) of c's half in one word, c's pair at bytes 2 (c & 1).
__device__ __forceinline__ void scale_min_k4_pair(int c, u32 s0, u32 s1, u32 s2, int* d, int* m) {
    bool first = c < 2;
    u32 sw = first ? s0 & 0x3F3F3F3Fu : (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    u32 mw = first ? s1 & 0x3F3F3F3Fu : ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    int sh = 16 * (c & 1);
    sw >>= sh;
    mw >>= sh;
    d[0] = (int)(sw & 0xFF);
    d[1] = (int)((sw >> 8) & 0xFF);
    m[0] = (int)(mw & 0xFF);
    m[1] = (int)((mw >> 8) & 0xFF);
}

// Q5_K's fifth bits of four weights (one a byte of qh) for sub-block j: bit j of each byte, moved
// to bit 4.
__device__ __forceinline__ u32 fifth4(u32 qh, int j) {
    return ((qh >> j) & 0x01010101u) << 4;
}

// Signed byte i (< 8) of v.
__device__ __forceinline__ float sbyte(uint2 v, int i) {
    return (float)(i8)(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xFF);
}

// One 32-weight piece in byte form: value_i = a(i) * q_i + b, a = a0 for i < 16, a1 after (q
// signed bytes; Q4_K's unsigned, see piece_dot; Q6_K's q is 0..63 for q - 32, the 32 taken off
// in the dot through XPiece's s0 / s1).
struct Piece {
    int q[8];
    float a0, a1, b;
};

// Pieces in a unit: two for the K-quants' 64 weights, one for the 32-weight blocks.
template <int TY> struct UnitPieces { enum { N = (TY == T_Q4_K || TY == T_Q5_K || TY == T_Q6_K) ? 2 : 1 }; };

// Index among the row's 32-weight pieces of piece h of unit u (the activations it meets).
template <int TY>
__device__ __forceinline__ int piece_index(int u, int h) {
    if (TY == T_Q4_K || TY == T_Q5_K) return 2 * u + h;  // block u / 4, sub-block 2 (u % 4) + h
    if (TY == T_Q6_K) return (u >> 2) * 8 + 4 * ((u >> 1) & 1) + (u & 1) + 2 * h;
    return u;
}

// The words of unit u of one row as loaded: a K-quant block's scales in one wide load (Q4_K:
// d, dmin and the 12 scale bytes are the block's first 16 bytes; Q6_K: the half's 8 scales),
// not a load a byte. Loading is apart from unpacking so a kernel puts a unit's words of all its
// rows in flight before it unpacks any. (The mat-mat's `unit_load` in mmq.cu loads one lane's
// share of a unit for the tensor cores' fragments.)
template <int TY> struct RawU;
template <> struct RawU<T_Q4_0> { int4 v; u16 d; };
template <> struct RawU<T_Q5_0> { u32 qh, qs[4]; u16 d; };
template <> struct RawU<T_Q8_0> { int4 v0, v1; u16 d; };
template <> struct RawU<T_Q4_1> { int4 v; u32 dm; };
template <> struct RawU<T_Q5_1> { u32 qh, qs[4]; u32 dm; };
template <> struct RawU<T_Q4_K> { uint4 hd, v0, v1; };
template <> struct RawU<T_Q5_K> { uint4 hd, h0, h1, v0, v1; };
template <> struct RawU<T_Q6_K> { int4 l0, l1, h0, h1; uint2 sv; u16 d; };

// A 32-weight block's scale (Q4_1 / Q5_1: scale and min) from the plane after the payloads.
template <int TY, typename R, typename I>
__device__ __forceinline__ void small_scale(R& r, const u8* __restrict__ S, I blk) {
    if constexpr (WithMin<TY>::V) r.dm = ((const u32*)S)[blk];
    else r.d = ((const u16*)S)[blk];
}

// The loaded scale as f32, and the min (0 for the types without one).
template <int TY, typename R>
__device__ __forceinline__ float small_d(const R& r, float& mn) {
    if constexpr (WithMin<TY>::V) {
        mn = h2f((u16)(r.dm >> 16));
        return h2f((u16)(r.dm & 0xFFFF));
    } else {
        mn = 0.f;
        return h2f(r.d);
    }
}

// Unit u's words of a row whose block b starts at Q + first + b * A and has its scale at index
// first + b of S (the plane after all payloads): first = row * bpr for a matrix's W and
// W + nblk * A (unit_raw), 0 for a row's own pointers (row_raw).
template <int TY, typename I>
__device__ __forceinline__ RawU<TY> unit_raw_from(const u8* __restrict__ Q, const u8* __restrict__ S, I first, int u) {
    RawU<TY> r;
    if constexpr (Small<TY>::V) {
        I blk = first + u;
        const u8* a = Q + blk * Blk<TY>::A;
        small_scale<TY>(r, S, blk);
        if constexpr (TY == T_Q8_0) {
            r.v0 = ldw16i(a);
            r.v1 = ldw16i(a + 16);
        } else if constexpr (TY == T_Q4_0 || TY == T_Q4_1) {
            r.v = ldw16i(a);
        } else {  // Q5_0 / Q5_1: qh (4 bytes) then qs (16 bytes), 4-byte aligned
            const u32* p = (const u32*)a;
            r.qh = p[0];
#pragma unroll
            for (int i = 0; i < 4; i++) r.qs[i] = p[1 + i];
        }
    } else if constexpr (TY == T_Q4_K) {
        // unit = 64 weights: sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) of chunk c
        int b = u >> 2, c = u & 3;
        const uint4* bp = (const uint4*)(Q + (first + b) * 144);
        r.hd = ldw16(bp);
        r.v0 = ldw16(bp + 1 + 2 * c);
        r.v1 = ldw16(bp + 2 + 2 * c);
    } else if constexpr (TY == T_Q5_K) {
        // as Q4_K, with the block's 32 qh bytes (16-47: bit j of byte l is weight l of
        // sub-block j) before its quants (48-175)
        int b = u >> 2, c = u & 3;
        const uint4* bp = (const uint4*)(Q + (first + b) * 176);
        r.hd = ldw16(bp);
        r.h0 = ldw16(bp + 1);
        r.h1 = ldw16(bp + 2);
        r.v0 = ldw16(bp + 3 + 2 * c);
        r.v1 = ldw16(bp + 4 + 2 * c);
    } else {
        // Q6_K unit = pieces pp and pp + 2 of half n: they share the ql bytes (low / high nibbles)
        int b = u >> 2, n = (u >> 1) & 1, pp = u & 1;
        I bi = first + b;
        const u8* blk = Q + bi * 208;
        r.d = ((const u16*)S)[bi];
        const int4* qlp = (const int4*)(blk + 64 * n + 32 * pp);
        const int4* qhp = (const int4*)(blk + 128 + 32 * n);
        r.l0 = ldw16i(qlp);
        r.l1 = ldw16i(qlp + 1);
        r.h0 = ldw16i(qhp);
        r.h1 = ldw16i(qhp + 1);
        r.sv = *(const uint2*)(blk + 192 + 8 * n);
    }
    return r;
}

template <int TY>
__device__ __forceinline__ RawU<TY> unit_raw(const u8* __restrict__ W, u64 nblk, int row, int bpr, int u) {
    return unit_raw_from<TY>(W, W + nblk * Blk<TY>::A, (u64)row * bpr, u);
}

// A row's payload and scale pointers made once in 64 bits; row_raw then adds 32-bit offsets
// for each unit. The row kernels (mv_*_r / _h: rows_acc's PRE) take it: Q6_K rows of 4096
// columns 11-17% faster on an H100 (thirty-second session); the fused q/k/v and warps-per-row
// kernels keep unit_raw.
struct RowPtr {
    const u8* q;
    const u8* s;
};
template <int TY>
__device__ __forceinline__ RowPtr row_ptr(const u8* W, u64 nblk, int row, int bpr) {
    constexpr int SB = WithMin<TY>::V ? 4 : 2;  // scale bytes a block
    u64 b0 = (u64)row * bpr;
    return {W + b0 * Blk<TY>::A, W + nblk * Blk<TY>::A + b0 * SB};
}
template <int TY>
__device__ __forceinline__ RawU<TY> row_raw(RowPtr p, int u) {
    return unit_raw_from<TY>(p.q, p.s, 0, u);
}

// Unit u's pieces from its loaded words.
template <int TY>
__device__ __forceinline__ void unit_unpack(const RawU<TY>& r, int u, Piece* w) {
    if constexpr (Small<TY>::V) {
        float mn, d = small_d<TY>(r, mn);
        w[0].a0 = w[0].a1 = d;
        if constexpr (TY == T_Q4_1) {
            int vs[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w[0].q[i] = vs[i] & 0x0F0F0F0F;
                w[0].q[4 + i] = (vs[i] >> 4) & 0x0F0F0F0F;
            }
            w[0].b = mn;
        } else if constexpr (TY == T_Q5_1) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w[0].q[i] = (int)(r.qs[i] & 0x0F0F0F0Fu) | spread4(r.qh >> (4 * i));
                w[0].q[4 + i] = (int)((r.qs[i] >> 4) & 0x0F0F0F0Fu) | spread4(r.qh >> (16 + 4 * i));
            }
            w[0].b = mn;
        } else if constexpr (TY == T_Q8_0) {
            w[0].q[0] = r.v0.x; w[0].q[1] = r.v0.y; w[0].q[2] = r.v0.z; w[0].q[3] = r.v0.w;
            w[0].q[4] = r.v1.x; w[0].q[5] = r.v1.y; w[0].q[6] = r.v1.z; w[0].q[7] = r.v1.w;
            w[0].b = 0.f;
        } else if constexpr (TY == T_Q4_0) {
            int vs[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w[0].q[i] = vs[i] & 0x0F0F0F0F;
                w[0].q[4 + i] = (vs[i] >> 4) & 0x0F0F0F0F;
            }
            w[0].b = -8.f * d;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w[0].q[i] = (int)(r.qs[i] & 0x0F0F0F0Fu) | spread4(r.qh >> (4 * i));
                w[0].q[4 + i] = (int)((r.qs[i] >> 4) & 0x0F0F0F0Fu) | spread4(r.qh >> (16 + 4 * i));
            }
            w[0].b = -16.f * d;
        }
    } else if constexpr (TY == T_Q4_K || TY == T_Q5_K) {
        int c = u & 3;
        float d = h2f((u16)(r.hd.x & 0xFFFF)), dmin = h2f((u16)(r.hd.x >> 16));
        u32 vs[8] = {r.v0.x, r.v0.y, r.v0.z, r.v0.w, r.v1.x, r.v1.y, r.v1.z, r.v1.w};
        int s[2], m[2];
        scale_min_k4_pair(c, r.hd.y, r.hd.z, r.hd.w, s, m);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (TY == T_Q4_K) {
                // the high nibbles stay in place, 16 times their value as unsigned bytes
                // (piece_dot takes Q4_K's bytes unsigned), and the scale takes the 1/16: no
                // shift a word
#pragma unroll
                for (int i = 0; i < 8; i++) w[h].q[i] = (int)(vs[i] & (h == 0 ? 0x0F0F0F0Fu : 0xF0F0F0F0u));
                w[h].a0 = w[h].a1 = (h == 0 ? d : d * 0.0625f) * (float)s[h];
            } else {
                // levels 0..31: the nibble and the fifth bit (bit 2c + h of each qh byte) at bit 4
                u32 hs[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
                    w[h].q[i] = (int)(((vs[i] >> (4 * h)) & 0x0F0F0F0Fu) | fifth4(hs[i], 2 * c + h));
                w[h].a0 = w[h].a1 = d * (float)s[h];
            }
            w[h].b = -dmin * (float)m[h];
        }
    } else {
        // q stays 0..63 (it stands for q - 32: x_piece folds the 32 into the dot's start).
        // The high bits of piece p are bits 2p, 2p + 1 of each qh byte, moved to bits 4, 5.
        int pp = u & 1;
        float d = h2f(r.d);
        u32 ls[8] = {(u32)r.l0.x, (u32)r.l0.y, (u32)r.l0.z, (u32)r.l0.w, (u32)r.l1.x, (u32)r.l1.y, (u32)r.l1.z, (u32)r.l1.w};
        u32 hs[8] = {(u32)r.h0.x, (u32)r.h0.y, (u32)r.h0.z, (u32)r.h0.w, (u32)r.h1.x, (u32)r.h1.y, (u32)r.h1.z, (u32)r.h1.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int p = pp + 2 * h;  // piece within the half
#pragma unroll
            for (int i = 0; i < 8; i++) {
                u32 lo = (ls[i] >> (4 * h)) & 0x0F0F0F0Fu;
                u32 hi = (h == 0 ? hs[i] << (4 - 2 * pp) : hs[i] >> (2 * pp)) & 0x30303030u;
                w[h].q[i] = (int)(lo | hi);
            }
            w[h].a0 = d * sbyte(r.sv, 2 * p);
            w[h].a1 = d * sbyte(r.sv, 2 * p + 1);
            w[h].b = 0.f;
        }
    }
}

// Piece P of token t's activations: 32 int8, (d, d * their sum), and where each 16-weight
// half's integer dot starts (0, or for Q6_K -32 times the half's sum).
struct XPiece {
    int4 x0, x1;
    float2 ds;
    int s0, s1;
};

__device__ __forceinline__ int dot4(int4 a, int4 b, int c) {
    return __dp4a(a.x, b.x, __dp4a(a.y, b.y, __dp4a(a.z, b.z, __dp4a(a.w, b.w, c))));
}

template <int TY>
__device__ __forceinline__ XPiece x_piece(const i8* __restrict__ xq, const float2* __restrict__ xd, int xld,
                                          int t, int P) {
    const int4* xp = (const int4*)(xq + (u64)t * xld + 32 * P);
    XPiece x{xp[0], xp[1], xd[t * (xld / 32) + P], 0, 0};
    if constexpr (TY == T_Q6_K) {
        // Q6_K weights arrive as q in 0..63 for q - 32: sum (q - 32) x = sum q x - 32 sum x, the
        // second term one dp4a a word (bytes of -32), once a token for all of a lane's rows
        // (units_dot), where subtracting 32 from every weight byte costs ~8 instructions a word
        // (no SIMD byte subtract on sm_90).
        const int4 m32 = make_int4(0xE0E0E0E0, 0xE0E0E0E0, 0xE0E0E0E0, 0xE0E0E0E0);
        x.s0 = dot4(m32, x.x0, 0);
        x.s1 = dot4(m32, x.x1, 0);
    }
    return x;
}

template <int TY>
__device__ __forceinline__ float piece_dot(const Piece& w, const XPiece& x) {
    int4 q0 = make_int4(w.q[0], w.q[1], w.q[2], w.q[3]), q1 = make_int4(w.q[4], w.q[5], w.q[6], w.q[7]);
    if constexpr (TY == T_Q6_K) {  // a scale a 16 weights
        int lo = dot4(q0, x.x0, x.s0), hi = dot4(q1, x.x1, x.s1);
        return x.ds.x * (w.a0 * (float)lo + w.a1 * (float)hi) + w.b * x.ds.y;
    } else if constexpr (TY == T_Q4_K) {  // unsigned bytes (a high nibble is 16 x its value)
        int s = dp4a_us(q0.x, x.x0.x, dp4a_us(q0.y, x.x0.y, dp4a_us(q0.z, x.x0.z, dp4a_us(q0.w, x.x0.w, 0))));
        s = dp4a_us(q1.x, x.x1.x, dp4a_us(q1.y, x.x1.y, dp4a_us(q1.z, x.x1.z, dp4a_us(q1.w, x.x1.w, s))));
        return x.ds.x * w.a0 * (float)s + w.b * x.ds.y;
    } else {  // one scale a piece: one integer sum
        return x.ds.x * w.a0 * (float)dot4(q1, x.x1, dot4(q0, x.x0, 0)) + w.b * x.ds.y;
    }
}

// Unit u of M rows from their loaded words, dotted with NT tokens into acc[m][t]: each token's
// activations are loaded once for all M rows (not once a row and matrix).
template <int TY, int NT, int M>
__device__ __forceinline__ void units_dot(const RawU<TY>* raw, int u, const i8* __restrict__ xq,
                                          const float2* __restrict__ xd, int xld, float (*acc)[NT]) {
    constexpr int N = UnitPieces<TY>::N;
    Piece w[M][N];
#pragma unroll
    for (int m = 0; m < M; m++) unit_unpack<TY>(raw[m], u, w[m]);
#pragma unroll
    for (int h = 0; h < N; h++) {
        int P = piece_index<TY>(u, h);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            XPiece x = x_piece<TY>(xq, xd, xld, t, P);
#pragma unroll
            for (int m = 0; m < M; m++) acc[m][t] += piece_dot<TY>(w[m][h], x);
        }
    }
}

// Unit u of rows rm[0..R) of W, and with TWO (the SwiGLU's up) of W2 too (same shape), into
// acc[m][t] (m < R: W's rows, then W2's): every row's words are loaded before any is unpacked.
template <int TY, int NT, int R, bool TWO>
__device__ __forceinline__ void units_acc(const u8* __restrict__ W, const u8* __restrict__ W2, const int* rm,
                                          u64 nblk, int bpr, int u, const i8* __restrict__ xq,
                                          const float2* __restrict__ xd, int xld, float (*acc)[NT]) {
    constexpr int M = TWO ? 2 * R : R;
    RawU<TY> raw[M];
#pragma unroll
    for (int m = 0; m < M; m++) raw[m] = unit_raw<TY>(m < R ? W : W2, nblk, rm[m % R], bpr, u);
    units_dot<TY, NT, M>(raw, u, xq, xd, xld, acc);
}

// units_acc over M rows found by their RowPtr (the SwiGLU's: W's rows, then W2's).
template <int TY, int NT, int M>
__device__ __forceinline__ void units_acc_p(const RowPtr* rp, int u, const i8* __restrict__ xq,
                                            const float2* __restrict__ xd, int xld, float (*acc)[NT]) {
    RawU<TY> raw[M];
#pragma unroll
    for (int m = 0; m < M; m++) raw[m] = row_raw<TY>(rp[m], u);
    units_dot<TY, NT, M>(raw, u, xq, xd, xld, acc);
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
    int rm[1] = {row};
    float acc[2][NT];  // W's row, W2's (SwiGLU)
#pragma unroll
    for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = 0.f;
#pragma unroll 2
    for (int u = lr; u < units; u += 32 * WPR)
        units_acc<TY, NT, 1, EPI == 2>(W, W2, rm, nblk, bpr, u, xq, xd, xld, acc);
    mv_finish<NT, EPI, WPR>(acc[0], acc[1], active, row, out, old);
}

__device__ __forceinline__ float half_warp_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One token (decode), R rows per warp: rows row0 .. row0 + R - 1 of W (and, for the SwiGLU,
// of W2), out gets the epilogue as in mv_finish. Each lane keeps every row's loads of a unit in
// flight before it waits, and loads the unit's activations once for all of them. HALF (short
// rows: a K-quant row of 1024 columns is 16 units, so a warp per row would leave half its
// lanes idle): each half-warp takes rows instead, lane l of half h units l, l + 16, ... of
// rows row0 + 2r + h (r < R), summed over its half (xor shuffles below 16 stay in it). Rows
// past the end re-read the last row (no branch between the loads); only the stores are guarded.
// PRE: each row's RowPtr made once (the mv_*_r / _h kernels); else unit_raw (mvx_rows).
template <int TY, int EPI, int R, bool HALF, bool PRE = false>
__device__ __forceinline__ void rows_acc(const u8* __restrict__ W, const u8* __restrict__ W2, int rows,
                                         int cols, int row0, const i8* __restrict__ xq,
                                         const float2* __restrict__ xd, float* __restrict__ out) {
    constexpr int S = HALF ? 16 : 32;  // lanes a row
    int lane = threadIdx.x & 31, l = HALF ? lane & 15 : lane, half = HALF ? lane >> 4 : 0;
    int bpr = cols / Blk<TY>::QK;
    u64 nblk = (u64)rows * bpr;
    int units = cols / Blk<TY>::UNIT;
    int rm[R];
    float acc[2 * R][1];  // rows 0..R-1 of W, then (SwiGLU) the same rows of W2
#pragma unroll
    for (int r = 0; r < R; r++) {
        rm[r] = min(row0 + (HALF ? 2 * r + half : r), rows - 1);
        acc[r][0] = acc[R + r][0] = 0.f;
    }
    if constexpr (PRE) {
        constexpr int M = EPI == 2 ? 2 * R : R;
        RowPtr rp[M];
#pragma unroll
        for (int m = 0; m < M; m++) rp[m] = row_ptr<TY>(m < R ? W : W2, nblk, rm[m % R], bpr);
#pragma unroll 2
        for (int u = l; u < units; u += S) units_acc_p<TY, 1, M>(rp, u, xq, xd, cols, acc);
    } else {
#pragma unroll 2
        for (int u = l; u < units; u += S)
            units_acc<TY, 1, R, EPI == 2>(W, W2, rm, nblk, bpr, u, xq, xd, cols, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = HALF ? half_warp_sum(acc[r][0]) : warp_sum(acc[r][0]);
        float v2 = EPI != 2 ? 0.f : HALF ? half_warp_sum(acc[R + r][0]) : warp_sum(acc[R + r][0]);
        int row = row0 + (HALF ? 2 * r + half : r);
        if (l == 0 && row < rows) {
            float* o = out + row;
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
        prefetch_l2(W + r * rb + (u64)(i % lines) * 128);
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
        rows_acc<TY, EPI, R, true, true>(W, W2, rows, cols, row0, xq, xd, out);                  \
    }
#define MVH(NAME, TY) MVH1(NAME, TY, 0, 1) MVH1(NAME, TY, 1, 1) MVH1(NAME, TY, 2, 1) \
    MVH1(NAME, TY, 0, 2) MVH1(NAME, TY, 1, 2) MVH1(NAME, TY, 2, 2)
MVH(q4_0, T_Q4_0)
MVH(q5_0, T_Q5_0)
MVH(q8_0, T_Q8_0)
MVH(q4_k, T_Q4_K)
MVH(q6_k, T_Q6_K)
MVH(q4_1, T_Q4_1)
MVH(q5_1, T_Q5_1)
MVH(q5_k, T_Q5_K)

// The one-token kernels' register caps (__launch_bounds__'s blocks an SM): 4 (128 registers)
// for the row kernels of one or two rows a warp, 8 (64) for the warps-per-row ones; without
// them ldw16's loads took the Q6_K row kernels to 134 registers, 3 blocks an SM (the 8B's
// down projection in two waves; 8B tg128 389 against 400 with the caps, H100).
#define MVR1(NAME, TY, EPI, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(128, R < 4 ? 4 : 1) mv_##NAME##_1_##EPI##_r##R( \
        const u8* W, const u8* W2, int rows, int cols, const i8* xq, const float2* xd, int xld,  \
        const float* xf, float* out, int old) {                                                  \
        int row0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * R;                                   \
        prefetch_rows<TY>(W, rows, cols, row0, R);                                               \
        if (EPI == 2) prefetch_rows<TY>(W2, rows, cols, row0, R);                                \
        GRID_DEP();                                                                              \
        rows_acc<TY, EPI, R, false, true>(W, W2, rows, cols, row0, xq, xd, out);                 \
    }
#define MVR(NAME, TY) MVR1(NAME, TY, 0, 1) MVR1(NAME, TY, 1, 1) MVR1(NAME, TY, 2, 1) \
    MVR1(NAME, TY, 0, 2) MVR1(NAME, TY, 1, 2) MVR1(NAME, TY, 2, 2)                   \
    MVR1(NAME, TY, 0, 4) MVR1(NAME, TY, 1, 4) MVR1(NAME, TY, 2, 4)
MVR(q4_0, T_Q4_0)
MVR(q5_0, T_Q5_0)
MVR(q8_0, T_Q8_0)
MVR(q4_k, T_Q4_K)
MVR(q6_k, T_Q6_K)
MVR(q4_1, T_Q4_1)
MVR(q5_1, T_Q5_1)
MVR(q5_k, T_Q5_K)

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

// The row kernels' grid and rows to a warp without their arithmetic (gpu-check --perf's
// second floor): warp w reads rows R w .. R w + R - 1 (row16 16-byte words each) one after the
// other, lane-strided (512 contiguous bytes a load, where a Q4_K unit load spans 1,152), four
// loads in flight.
template <int R>
__device__ __forceinline__ void read_rows(const int4* __restrict__ p, int rows, int row16, int* sink) {
    GRID_DEP();
    int w = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int4 a = make_int4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int4* rp = p + (u64)min(R * w + r, rows - 1) * row16;
#pragma unroll 4
        for (int i = lane; i < row16; i += 32) {
            int4 v = rp[i];
            a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
        }
    }
    if ((a.x & a.y & a.z & a.w) == 0x7fffffff) *sink = a.x;
}
extern "C" __global__ void __launch_bounds__(128) read_rows_r1(const int4* p, int rows, int row16, int* sink) { read_rows<1>(p, rows, row16, sink); }
extern "C" __global__ void __launch_bounds__(128) read_rows_r2(const int4* p, int rows, int row16, int* sink) { read_rows<2>(p, rows, row16, sink); }

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
    extern "C" __global__ void __launch_bounds__(128, NT == 1 ? 8 : 1) mv_##NAME##_##NT##_##EPI##_##WPR( \
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
MV_ALL(MVQ, q4_1, T_Q4_1)
MV_ALL(MVQ, q5_1, T_Q5_1)
MV_ALL(MVQ, q5_k, T_Q5_K)
MV_ALL(MVF, f32, T_F32)
MV_ALL(MVF, f16, T_F16)

// Up to four matrices over the same activations in one launch (q, k and v of attention; qkv, z,
// alpha and beta of a DeltaNet layer):
// warp g of the grid takes row g of the concatenated rows, whatever each matrix's type.
template <int TY, int NT>
__device__ __forceinline__ void mvx_row(const u8* W, int rows, int cols, int row, const i8* xq,
                                        const float2* xd, const float* xf, float* out) {
    int lane = threadIdx.x & 31;
    float acc[1][NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[0][t] = acc2[t] = 0.f;
    if constexpr (TY == T_F32 || TY == T_F16) {
        for (int u = lane; u < cols / 8; u += 32) unit_acc_f<TY, NT>(W, row, cols, u, xf, cols, acc[0]);
    } else {
        int bpr = cols / Blk<TY>::QK;
        u64 nblk = (u64)rows * bpr;
        int rm[1] = {row};
#pragma unroll 2
        for (int u = lane; u < cols / Blk<TY>::UNIT; u += 32)
            units_acc<TY, NT, 1, false>(W, W, rm, nblk, bpr, u, xq, xd, cols, acc);
    }
    mv_finish<NT, 0, 1>(acc[0], acc2, true, row, out, rows);
}

// ALL: every weight type; else those of Q4_K_M / Q8_0 / Q4_0 files (Q4_K, Q6_K, Q8_0, Q5_0,
// Q4_0, F32, F16). The kernels' registers are the most any type's branch takes: Q5_K's larger
// units took the row-group kernels from 128 to 138 (sm_90), so files without Q4_1 / Q5_1 / Q5_K
// keep kernels without their branches (`_all` is the host's pick where a matrix has one).
template <int NT, bool ALL>
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
    case T_Q4_1: if constexpr (ALL) mvx_row<T_Q4_1, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q5_1: if constexpr (ALL) mvx_row<T_Q5_1, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    case T_Q5_K: if constexpr (ALL) mvx_row<T_Q5_K, NT>(W, rows, cols, row, xq, xd, xf, out); break;
    }
}

// One token, R rows per warp: warp g takes rows g*R .. g*R + R - 1 of the concatenation, which
// lie in one matrix when every matrix's row count is a multiple of R (the host checks); HALF
// (short rows): half-warp rows, warp g rows 2gR .. 2gR + 2R - 1, inside one matrix when every
// row count is a multiple of 2R. ALL as in mvx.
template <int R, bool ALL, bool HALF>
__device__ __forceinline__ void mvx_rows(const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1,
                                         float* o1, const u8* W2, int r2, int t2, float* o2, const u8* W3,
                                         int r3, int t3, float* o3, int cols, const i8* xq, const float2* xd,
                                         const float* xf) {
    int g = (blockIdx.x * 4 + (threadIdx.x >> 5)) * (HALF ? 2 : 1) * R;
    const u8* W;
    int rows, ty, row;
    float* out;
    if (g < r0) { W = W0; rows = r0; ty = t0; row = g; out = o0; }
    else if (g < r0 + r1) { W = W1; rows = r1; ty = t1; row = g - r0; out = o1; }
    else if (g < r0 + r1 + r2) { W = W2; rows = r2; ty = t2; row = g - r0 - r1; out = o2; }
    else if (g < r0 + r1 + r2 + r3) { W = W3; rows = r3; ty = t3; row = g - r0 - r1 - r2; out = o3; }
    else return;
    switch (ty) {
    case T_Q4_0: rows_acc<T_Q4_0, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q5_0: rows_acc<T_Q5_0, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q8_0: rows_acc<T_Q8_0, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q4_K: rows_acc<T_Q4_K, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q6_K: rows_acc<T_Q6_K, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q4_1: if constexpr (ALL) rows_acc<T_Q4_1, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q5_1: if constexpr (ALL) rows_acc<T_Q5_1, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    case T_Q5_K: if constexpr (ALL) rows_acc<T_Q5_K, 0, R, HALF>(W, W, rows, cols, row, xq, xd, out); break;
    default:  // f32 / f16: the host takes R = 1 and whole warps for those
        if constexpr (!HALF)
            for (int r = 0; r < R && row + r < rows; r++) {
                if (ty == T_F32) mvx_row<T_F32, 1>(W, rows, cols, row + r, xq, xd, xf, out);
                else mvx_row<T_F16, 1>(W, rows, cols, row + r, xq, xd, xf, out);
            }
    }
}
// mvx_1_h<R>, mvx_1_r<R>, mvx_<NT>: the kernels without the Q4_1 / Q5_1 / Q5_K branches; each
// with `_all` after its name: every type (see mvx).
#define MVXH(R, ALL, SUF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) mvx_1_h##R##SUF(                           \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx_rows<R, ALL, true>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd, xf); \
    }
MVXH(1, false, ) MVXH(2, false, ) MVXH(1, true, _all) MVXH(2, true, _all)

#define MVXR(R, ALL, SUF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, R < 4 ? 4 : 1) mvx_1_r##R##SUF(            \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx_rows<R, ALL, false>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd, xf); \
    }
MVXR(2, false, ) MVXR(4, false, ) MVXR(2, true, _all) MVXR(4, true, _all)

#define MVX(NT, ALL, SUF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) mvx_##NT##SUF(                             \
        const u8* W0, int r0, int t0, float* o0, const u8* W1, int r1, int t1, float* o1,        \
        const u8* W2, int r2, int t2, float* o2, const u8* W3, int r3, int t3, float* o3,        \
        int cols, const i8* xq, const float2* xd, const float* xf) { GRID_DEP();                             \
        mvx<NT, ALL>(W0, r0, t0, o0, W1, r1, t1, o1, W2, r2, t2, o2, W3, r3, t3, o3, cols, xq, xd, xf); \
    }
MVX(1, false, ) MVX(2, false, ) MVX(4, false, ) MVX(8, false, )
MVX(1, true, _all) MVX(2, true, _all) MVX(4, true, _all) MVX(8, true, _all)
