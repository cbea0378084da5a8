// The f16 mat-mat for batched decode over Q4_K and Q6_K matrices:
// out[t][row] (+)= W[row] . x[t] on the f16 tensor cores (mma m16n8k16, f32 sums). Picked
// where an H100's `gpu-check --perf` found it faster than the int8 kernels (mmq::f16_shape:
// Q6_K of 4,096+ rows, Q4_K's long or many rows; docs/cuda.md lab book, 2026-12-07).
//
// Where the int8 staged kernel (mmq.cu) has each warp copy its own units' activations and scale
// every 32-weight piece's int32 dot into its accumulators, here a block's warps are RG row
// groups (MR tiles of 16 rows each: a block of 16 RG MR rows) times KP parts of the columns.
// The block streams the matrix in stages of KP halves of K-quant blocks (128 columns each)
// through a ring of S stages of shared memory by cp.async: every row's record of each half and
// the tokens' f16 activations over its columns, copied once for all the block's rows; the
// warps of column part p take half p of every stage, and add their sums at the end. The
// launch's work is divided evenly among its blocks (stream-K, HStream): a block walks a run of
// (tile, stage) units, so it may end one tile, take whole ones and start another; where a tile's
// stages are shared, the last of its blocks adds their sums (mmh_partial_sum). mmq::F16Grid
// sets the number of blocks: whole tiles in k splits each (G = tiles x k: no run crosses a
// tile), or one wave of blocks where whole tiles would leave much of it idle. Each lane
// turns its rows' quants into f16 weights (1024 + q read as an f16 from the bytes (q, 0x64),
// less 1024 or 1056 exactly, times the scale plus the min) and the mma sums the products in
// f32 along the whole row: nothing is done after an mma.
//
// k slots: in the mma over k-chunk kk = 4 nib + w of a stage, lane tid's four slots (2tid,
// 2tid + 1, 8 + 2tid, 9 + 2tid) stand for the stage's columns 64 nib + 16 tid + 4 w + 0..3. A
// lane's rows then come from 16 bytes of their quants (Q6_K: ql bytes 16 tid .., both nibbles;
// Q4_K: qs bytes 32 nib + 16 (tid % 2) .., the nibble tid / 2), and a token's B words for two
// k-chunks are one 16-byte load of 8 consecutive activations.
//
// A stage: for each of its KP halves, planes of the block's R rows (Q4_K: qs R x 64, header
// R x 16; Q6_K: ql R x 64, qh R x 32, scales R x 8, the 4-byte word holding d R x 4), then the
// TW tokens' 128 KP f16 activations at a pitch of 256 KP + 16 bytes (a quarter-warp's 16-byte
// loads hit distinct banks). Rows past the end re-read the last one and tokens past T the last
// token; neither is stored. Halves past the row's end (KP not dividing them) are skipped.

template <int TY, int NJ, int RG, int MR, int KP>
struct HStage {
    enum {
        R = 16 * RG * MR,
        TW = 8 * NJ,
        WARPS = RG * KP,
        // plane offsets within a half's records
        QS = 0,                          // Q4_K qs / Q6_K ql: R x 64
        HD = 64 * R,                     // Q4_K header: R x 16 / Q6_K qh: R x 32
        SC = 96 * R,                     // Q6_K scales: R x 8
        DW = 104 * R,                    // Q6_K d's word: R x 4
        HALF = TY == T_Q4_K ? 80 * R : 108 * R,
        X = KP * HALF,                   // activations: TW x PITCH
        PITCH = 256 * KP + 16,
        BYTES = X + TW * PITCH,
    };
};

// A thread's share of every stage's copies, found once before the walk (loops over rows and
// tokens with their clamps and 64-bit products, run again every stage, cost more issue slots
// than the mma): the source offsets of its records at stage 0, in bytes from W (Q6_K's d words:
// from the d plane) or from x. Stage s adds s times the plane's stride: KP / 2 blocks of a
// row (KP is even: a stage's half p is half p % 2 of block s KP / 2 + p / 2), 128 KP columns
// of a token. Offsets are 32-bit (mmq.rs picks the kernel for matrices under 4 GiB).
template <int TY, int NJ, int RG, int MR, int KP>
struct HCopies {
    using G = HStage<TY, NJ, RG, MR, KP>;
    enum {
        NT = G::WARPS * 32,
        BB = TY == T_Q4_K ? 144 : 208,        // bytes of a block
        NQ = 4 * G::R,                         // a half's 16-byte quant copies (4 a row)
        NH = TY == T_Q4_K ? G::R : 2 * G::R,  // Q4_K: the header (one a row); Q6_K: qh (two)
        NS = TY == T_Q6_K ? 2 * G::R : 0,     // Q6_K: 8 scale bytes, then d's word, a row
        NX = G::TW * 16 * KP,                  // a stage's 16-byte activation copies
        KQ = (NQ + NT - 1) / NT,
        KH = (NH + NT - 1) / NT,
        KS = NS ? (NS + NT - 1) / NT : 1,
        KX = (NX + NT - 1) / NT,
    };
    static_assert(KP % 2 == 0 && NT % (16 * KP) == 0, "halves in pairs; a token's copies in one thread pattern");
    u32 q[KQ], h[KH], sc[KS], x[KX];
};

template <int TY, int NJ, int RG, int MR, int KP>
__device__ __forceinline__ HCopies<TY, NJ, RG, MR, KP> mmh_copies(int r0, int rows, int bpr, int t0, int T, int cols) {
    using C = HCopies<TY, NJ, RG, MR, KP>;
    C c;
    const int tid = threadIdx.x;
    auto row_off = [&](int rec) { return (u32)min(r0 + rec, rows - 1) * (u32)bpr * (u32)C::BB; };
#pragma unroll
    for (int k = 0; k < C::KQ; k++) {
        int i = tid + k * C::NT;
        c.q[k] = row_off(i >> 2) + (TY == T_Q4_K ? 16 : 0) + 16 * (i & 3);
    }
#pragma unroll
    for (int k = 0; k < C::KH; k++) {
        int i = tid + k * C::NT;
        c.h[k] = TY == T_Q4_K ? row_off(i) : row_off(i >> 1) + 128 + 16 * (i & 1);
    }
    if constexpr (TY == T_Q6_K) {
#pragma unroll
        for (int k = 0; k < C::KS; k++) {
            int i = tid + k * C::NT;
            // scales: the block's 16 at byte 192; d: two bytes a block after every block
            c.sc[k] = i & 1 ? 2 * (u32)min(r0 + (i >> 1), rows - 1) * (u32)bpr : row_off(i >> 1) + 192;
        }
    }
#pragma unroll
    for (int k = 0; k < C::KX; k++) {
        int i = tid + k * C::NT, t = i / (16 * KP), part = i % (16 * KP);
        c.x[k] = ((u32)min(t0 + t, T - 1) * (u32)cols + 8 * part) * 2;
    }
    return c;
}

// The block's copies of the weights of stage s (halves KP s ..) into `st` (Wd: Q6_K's d
// plane); the weights and the activations apart (the weights need not wait for the kernel
// before). Halves past the row's end (KP not dividing them) are skipped.
template <int TY, int NJ, int RG, int MR, int KP>
__device__ __forceinline__ void mmh_stage_weights(u8* st, const u8* __restrict__ W, const u8* __restrict__ Wd,
                                                  const HCopies<TY, NJ, RG, MR, KP>& c, int halves, int s) {
    using G = HStage<TY, NJ, RG, MR, KP>;
    using C = HCopies<TY, NJ, RG, MR, KP>;
    const int tid = threadIdx.x;
    const u32 so = (u32)s * (KP / 2) * C::BB;  // the stage's first block in each row
#pragma unroll
    for (int p = 0; p < KP; p++) {
        if (s * KP + p >= halves) break;
        u8* hs = st + p * G::HALF;
        const u32 po = so + (p / 2) * C::BB;  // the half's block
#pragma unroll
        for (int k = 0; k < C::KQ; k++) {
            int i = tid + k * C::NT;
            if (C::NQ % C::NT == 0 || i < C::NQ)
                cp_async16(hs + G::QS + 16 * i, W + c.q[k] + po + 64 * (p & 1));
        }
#pragma unroll
        for (int k = 0; k < C::KH; k++) {
            int i = tid + k * C::NT;
            if (C::NH % C::NT == 0 || i < C::NH)
                cp_async16(hs + G::HD + 16 * i, W + c.h[k] + po + (TY == T_Q4_K ? 0 : 32 * (p & 1)));
        }
        if constexpr (TY == T_Q6_K) {
#pragma unroll
            for (int k = 0; k < C::KS; k++) {
                int i = tid + k * C::NT;
                if (C::NS % C::NT == 0 || i < C::NS) {
                    if (i & 1) cp_async4(hs + G::DW + 4 * (i >> 1), Wd + ((c.sc[k] + s * KP + (p & ~1)) & ~3u));
                    else cp_async8(hs + G::SC + 8 * (i >> 1), W + c.sc[k] + po + 8 * (p & 1));
                }
            }
        }
    }
}

// The block's copies of the tokens' activations of stage s: 16 bytes a copy, none past the
// row's end.
template <int TY, int NJ, int RG, int MR, int KP>
__device__ __forceinline__ void mmh_stage_acts(u8* st, const u16* __restrict__ x, const HCopies<TY, NJ, RG, MR, KP>& c,
                                               int cols, int s) {
    using G = HStage<TY, NJ, RG, MR, KP>;
    using C = HCopies<TY, NJ, RG, MR, KP>;
    const int part = threadIdx.x % (16 * KP);  // the same in each of the thread's copies
    if (8 * part >= cols - 128 * KP * s) return;
#pragma unroll
    for (int k = 0; k < C::KX; k++) {
        int i = threadIdx.x + k * C::NT;
        if (C::NX % C::NT == 0 || i < C::NX)
            cp_async16(st + G::X + (i / (16 * KP)) * G::PITCH + 16 * part,
                       (const u8*)x + c.x[k] + (u32)s * 256 * KP);
    }
}

__device__ __forceinline__ u32 half2_of(float v) {
    u32 h = f2h(v);
    return h | (h << 16);
}

// One row's share of a stage for this lane (`st`: the half's planes, HStage G): its 16 quant
// bytes for k-chunks 4 nib .. 4 nib + 3 and the scale (Q6_K) or scale and min (Q4_K) of those
// columns, each as two equal halves.
struct HRow {
    uint4 q, qh;
    u32 s, m;
};

template <int TY, class G>
__device__ __forceinline__ HRow mmh_row(const u8* st, int rec, int nib, int h, int lane, int dhi) {
    const int tid = lane & 3;
    HRow r;
    if constexpr (TY == T_Q4_K) {
        r.q = *(const uint4*)(st + G::QS + 64 * rec + 32 * nib + 16 * (tid & 1));
        uint4 hd = *(const uint4*)(st + G::HD + 16 * rec);
        int sc, mn;
        scale_min_k4_word(2 * h + nib, tid >> 1, hd.y, hd.z, hd.w, sc, mn);
        r.s = half2_of(h2f((u16)(hd.x & 0xFFFF)) * (float)sc);
        r.m = half2_of(-h2f((u16)(hd.x >> 16)) * (float)mn);
    } else {
        r.q = *(const uint4*)(st + G::QS + 64 * rec + 16 * tid);
        r.qh = *(const uint4*)(st + G::HD + 32 * rec + 16 * (tid & 1));
        int sc = (int)(i8)st[G::SC + 8 * rec + 4 * nib + tid];
        u32 dw = *(const u32*)(st + G::DW + 4 * rec);
        r.s = half2_of(h2f((u16)(dhi ? dw >> 16 : dw & 0xFFFF)) * (float)sc);
    }
    return r;
}

// The A words (a[0]: columns 4w, 4w + 1 of the lane's run; a[1]: 4w + 2, 4w + 3) of one row:
// the quants' bytes next to 0x64 make 1024 + q as f16, and the exact difference to q (Q6_K: q -
// 32) times the scale (plus the min) is the weight with one rounding.
template <int TY>
__device__ __forceinline__ void mmh_weights(const HRow& r, int w, int nib, int tid, u32& lo, u32& hi) {
    u32 word = w == 0 ? r.q.x : w == 1 ? r.q.y : w == 2 ? r.q.z : r.q.w;
    u32 q;
    if constexpr (TY == T_Q4_K) {
        q = (word >> (4 * (tid >> 1))) & 0x0F0F0F0Fu;
    } else {
        u32 hw = w == 0 ? r.qh.x : w == 1 ? r.qh.y : w == 2 ? r.qh.z : r.qh.w;
        // weight c of the half (c = 64 nib + 16 tid + ..) has its high bits at 2 (c / 32)
        int sh = 2 * (2 * nib + (tid >> 1));
        q = ((word >> (4 * nib)) & 0x0F0F0F0Fu) | (((hw >> sh) & 0x03030303u) << 4);
    }
    u32 h0 = __byte_perm(q, 0x64646464u, 0x5140), h1 = __byte_perm(q, 0x64646464u, 0x5342);
    if constexpr (TY == T_Q4_K) {
        lo = hfma2(hsub2(h0, 0x64006400u), r.s, r.m);
        hi = hfma2(hsub2(h1, 0x64006400u), r.s, r.m);
    } else {
        lo = hmul2(hsub2(h0, 0x64206420u), r.s);
        hi = hmul2(hsub2(h1, 0x64206420u), r.s);
    }
}

// Stream-K: the launch's units are (tile, stage) pairs, tile = token tile x row blocks + row
// block (the row blocks of every matrix of the launch, in order), a tile's stages in order; block
// b of G takes units [b U / G, (b + 1) U / G). A tile whose stages more than one block walk is
// summed by the last of them to finish (mmh_partial_sum).
struct HStream {
    u32 units, blocks, stages;
    __device__ __forceinline__ u32 start(u32 b) const { return (u32)((u64)b * units / blocks); }
    // the block whose run holds unit u
    __device__ __forceinline__ u32 block_of(u32 u) const { return (u32)(((u64)(u + 1) * blocks - 1) / units); }
    // where block b leaves its sums of `tile`: a run has at most two shared tiles, its first
    // (slot 2 b) and its last (2 b + 1)
    __device__ __forceinline__ u32 slot(u32 b, u32 tile) const { return 2 * b + (start(b) / stages != tile); }
};

// A tile shared by blocks: each stores its R x TW sums in its slot of `part` (lane-major, as
// the column parts add theirs), then counts itself in the tile's entry of `cnt`; the last of
// them adds every sharer's slot in block order (the same sums whichever block comes last) and
// zeroes the entry for the next launch. Returns whether this block is that last one, the one to
// apply the epilogue.
template <int E, int RG>
__device__ __forceinline__ bool mmh_partial_sum(float* acc, bool holder, int rg, int lane, float* __restrict__ part,
                                                int* __restrict__ cnt, const HStream& g, u32 tile) {
    __shared__ int last;
    const u64 slot = RG * E * 32;
    const int at = rg * E * 32 + lane;
    float* mine = part + g.slot(blockIdx.x, tile) * slot + at;
    if (holder)
#pragma unroll
        for (int e = 0; e < E; e++) mine[e * 32] = acc[e];
    __threadfence();
    __syncthreads();
    const u32 first = g.block_of(tile * g.stages), final = g.block_of((tile + 1) * g.stages - 1);
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt + tile, 1) == (int)(final - first);
        if (last) cnt[tile] = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (holder) {
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] = 0.f;
        for (u32 b = first; b <= final; b++) {
            const float* p = part + g.slot(b, tile) * slot + at;
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] += __ldcg(p + e * 32);
        }
    }
    return true;
}

// The weights of the first S - 1 stages of a run (stages s0 .. s0 + n, the thread's copies
// `cp`) into the ring: no kernel writes them, so a block's first run issues them before its
// wait on the kernel before.
template <int TY, int NJ, int RG, int MR, int KP, int S>
__device__ __forceinline__ void mmh_weights_ahead(const u8* __restrict__ W, int rows, int cols,
                                                  const HCopies<TY, NJ, RG, MR, KP>& cp, int s0, int n) {
    using G = HStage<TY, NJ, RG, MR, KP>;
    extern __shared__ __align__(16) u8 smem[];
    const int bpr = cols / 256;
    const u8* Wd = W + (u64)rows * bpr * 208;  // Q6_K's d plane
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < n) mmh_stage_weights<TY, NJ, RG, MR, KP>(smem + s * G::BYTES, W, Wd, cp, 2 * bpr, s0 + s);
}

// One run of a block over stages s0 .. s0 + n of tile `tile` (row block rblk of its matrix,
// token tile ty); `ahead`: its first stages' weights are in flight already (mmh_weights_ahead,
// the block's first run); `part`: null where the run is the whole tile.
template <int TY, int NJ, int RG, int MR, int KP, int S, int EPI>
__device__ __forceinline__ void mmh(const u8* __restrict__ W, int rows, int cols, const u16* __restrict__ x, int T,
                                    float* __restrict__ out, int rblk, int ty, int s0, int n, bool ahead,
                                    float* __restrict__ part, int* __restrict__ cnt, const HStream& g, u32 tile) {
    using G = HStage<TY, NJ, RG, MR, KP>;
    extern __shared__ __align__(16) u8 smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    int rg = warp % RG, kp = warp / RG;  // this warp's row group and column part
    int r0 = rblk * G::R, t0 = ty * G::TW;
    int bpr = cols / 256, halves = 2 * bpr;
    u64 nblk = (u64)rows * bpr;
    const u8* Wd = W + nblk * 208;  // Q6_K's d plane
    const auto cp = mmh_copies<TY, NJ, RG, MR, KP>(r0, rows, bpr, t0, T, cols);
    if (!ahead) mmh_weights_ahead<TY, NJ, RG, MR, KP, S>(W, rows, cols, cp, s0, n);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n) mmh_stage_acts<TY, NJ, RG, MR, KP>(smem + s * G::BYTES, x, cp, cols, s0 + s);
        cp_async_commit();
    }
    // this lane's row records (rows gid and gid + 8 of each tile) and, for Q6_K, the parity of
    // their first block (two d to a word)
    int rec[MR][2], par[MR][2];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            rec[m][e] = 16 * (rg * MR + m) + gid + 8 * e;
            par[m][e] = (int)(((u64)min(r0 + rec[m][e], rows - 1) * bpr) & 1);
        }
    float acc[NJ][MR][4];
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[j][m][0] = acc[j][m][1] = acc[j][m][2] = acc[j][m][3] = 0.f;
    for (int i = 0; i < n; i++) {
        cp_async_wait<S - 2>();
        __syncthreads();  // stage i has landed for every thread, and stage i - 1 is done with
        int nx = i + S - 1;
        if (nx < n) {
            u8* d = smem + (nx % S) * G::BYTES;
            mmh_stage_weights<TY, NJ, RG, MR, KP>(d, W, Wd, cp, halves, s0 + nx);
            mmh_stage_acts<TY, NJ, RG, MR, KP>(d, x, cp, cols, s0 + nx);
        }
        cp_async_commit();
        int hx = (s0 + i) * KP + kp;  // this warp's half of the stage
        if (hx >= halves) continue;
        const u8* st = smem + (i % S) * G::BYTES;
        const u8* hs = st + kp * G::HALF;
        const u8* xs = st + G::X + 256 * kp;
        int h = hx & 1, bodd = (hx >> 1) & 1;
#pragma unroll
        for (int nib = 0; nib < 2; nib++) {
            HRow rw[MR][2];
#pragma unroll
            for (int m = 0; m < MR; m++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    rw[m][e] = mmh_row<TY, G>(hs, rec[m][e], nib, h, lane, par[m][e] ^ bodd);
#pragma unroll
            for (int q2 = 0; q2 < 2; q2++) {
                // the B words of k-chunks 4 nib + 2 q2 (x, y) and the next (z, w) for every token tile
                uint4 bv[NJ];
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    bv[j] = *(const uint4*)(xs + (8 * j + gid) * G::PITCH + 128 * nib + 32 * tid + 16 * q2);
#pragma unroll
                for (int m = 0; m < MR; m++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        u32 a[4];
                        mmh_weights<TY>(rw[m][0], 2 * q2 + e, nib, tid, a[0], a[2]);
                        mmh_weights<TY>(rw[m][1], 2 * q2 + e, nib, tid, a[1], a[3]);
#pragma unroll
                        for (int j = 0; j < NJ; j++)
                            mma_f16(acc[j][m], a, e ? bv[j].z : bv[j].x, e ? bv[j].w : bv[j].y);
                    }
            }
        }
    }
    cp_async_wait_all();
    constexpr int E = NJ * MR * 4;
    if constexpr (KP > 1) {
        // the column parts' sums into part 0's warps through shared memory (the ring is free
        // once every warp is past its last stage): entry ((kp - 1) RG + rg) E + e, lane-major
        float* red = (float*)smem;
        __syncthreads();
        if (kp > 0)
#pragma unroll
            for (int e = 0; e < E; e++) red[(((kp - 1) * RG + rg) * E + e) * 32 + lane] = (&acc[0][0][0])[e];
        __syncthreads();
        if (kp == 0)
#pragma unroll
            for (int p = 1; p < KP; p++)
#pragma unroll
                for (int e = 0; e < E; e++) (&acc[0][0][0])[e] += red[(((p - 1) * RG + rg) * E + e) * 32 + lane];
    }
    if (part && !mmh_partial_sum<E, RG>(&acc[0][0][0], kp == 0, rg, lane, part, cnt, g, tile)) return;
    if (kp > 0) return;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int row = r0 + rec[m][c >> 1], t = t0 + 8 * j + 2 * tid + (c & 1);
                if (row < rows && t < T) {
                    float* o = out + (u64)t * rows + row;
                    if (EPI == 0) *o = acc[j][m][c];
                    else *o += acc[j][m][c];
                }
            }
}

// Block blockIdx.x's run of units (HStream over gridDim.x blocks), tile by tile.
template <int TY, int NJ, int RG, int MR, int KP, int S, int EPI>
__device__ __forceinline__ void mmh_stream(MMQ_MATS_ARGS, int cols, const u16* __restrict__ x, int T,
                                           float* __restrict__ part, int* __restrict__ cnt) {
    using G = HStage<TY, NJ, RG, MR, KP>;
    const u32 rblocks = (r0 + G::R - 1) / G::R + (r1 + G::R - 1) / G::R + (r2 + G::R - 1) / G::R +
                        (r3 + G::R - 1) / G::R;
    const u32 stages = (cols / 128 + KP - 1) / KP, tiles = rblocks * ((T + G::TW - 1) / G::TW);
    const HStream g{tiles * stages, gridDim.x, stages};
    const u32 begin = g.start(blockIdx.x), end = g.start(blockIdx.x + 1);
    if (begin < end) {
        const u32 tile = begin / stages, s = begin % stages;
        MmqPick p = mmq_pick_at(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, G::R, tile % rblocks);
        const auto cp = mmh_copies<TY, NJ, RG, MR, KP>(p.rblk * G::R, p.rows, cols / 256, (tile / rblocks) * G::TW,
                                                       T, cols);
        mmh_weights_ahead<TY, NJ, RG, MR, KP, S>(p.W, p.rows, cols, cp, s, min(stages - s, end - begin));
    }
    GRID_DEP();  // in the kernel's scope: the timeline's stamps live until the block returns
    for (u32 u = begin; u < end;) {
        const u32 tile = u / stages, s = u % stages, n = min(stages - s, end - u);
        if (u != begin) __syncthreads();  // the last run's ring and sums are read
        MmqPick p = mmq_pick_at(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, G::R, tile % rblocks);
        mmh<TY, NJ, RG, MR, KP, S, EPI>(p.W, p.rows, cols, x, T, p.out, p.rblk, tile / rblocks, s, n, u == begin,
                                         n == stages ? nullptr : part, cnt, g, tile);
        u += n;
    }
}

// mmh_<type>_<NJ>_<epi>_w<RG>_r<MR>_k<KP>_s<S>: tiles of 8 NJ tokens, epi 0 store / 1 add,
// blocks of 16 RG MR rows and RG KP warps, S stages (dynamic shared memory: the larger of S
// HStage::BYTES and the column parts' sums, as mmq::mmq_launch sizes it).
#define MMH1(NAME, TY, NJ, EPI, RG, MR, KP, S)                                                           \
    extern "C" __global__ void __launch_bounds__(RG * KP * 32)                                          \
        mmh_##NAME##_##NJ##_##EPI##_w##RG##_r##MR##_k##KP##_s##S(MMQ_MATS_ARGS, int cols, const u16* x, int T, \
                                                                 float* part, int* cnt) {                   \
        mmh_stream<TY, NJ, RG, MR, KP, S, EPI>(W0, r0, o0, W1, r1, o1, W2, r2, o2, W3, r3, o3, cols, x, T, part, cnt); \
    }
#define MMH(NAME, TY, NJ, RG, MR, KP, S) MMH1(NAME, TY, NJ, 0, RG, MR, KP, S) MMH1(NAME, TY, NJ, 1, RG, MR, KP, S)
// the shapes mmq::f16_block_shapes lists, at 8, 16, 32 and 64 tokens: blocks of 128 rows (4
// row groups of two tiles over halves of the columns) and 64 (2 of two over quarters); at 8-32
// tokens the 128-row block with a ring of 4 stages too (150-174 KB of shared memory at 16-32)
#define MMH_NJ(NAME, TY, NJ) MMH(NAME, TY, NJ, 4, 2, 2, 3) MMH(NAME, TY, NJ, 2, 2, 4, 2)
#define MMH_ALL(NAME, TY) MMH_NJ(NAME, TY, 1) MMH_NJ(NAME, TY, 2) MMH_NJ(NAME, TY, 4) MMH_NJ(NAME, TY, 8) \
    MMH(NAME, TY, 1, 4, 2, 2, 4) MMH(NAME, TY, 2, 4, 2, 2, 4) MMH(NAME, TY, 4, 4, 2, 2, 4)
MMH_ALL(q4_k, T_Q4_K)
MMH_ALL(q6_k, T_Q6_K)
