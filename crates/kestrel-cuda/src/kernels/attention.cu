// Decode attention over the paged f16 KV cache (flash-decoding, grouped): one block of 4 warps
// per (KV head, group of up to 4 of its query heads, token, context range) reads each K/V row
// once for the whole group (GQA: the query heads of a KV head share its rows), keeps an online
// softmax per head, and the block that finishes a (token, group) last merges the ranges,
// writes the output and quantizes it for the output projection: one kernel, no combine pass.
//
// A token's context 0..=pos is cut into ns = min(n_splits, ceil(len / 32)) equal ranges:
// long contexts spread over n_splits blocks per group, short ones take as many as they fill
// (one range writes its result directly). ns is computed on the device from the position, so
// one captured graph serves every step of a decode.
//
// A range is read in tiles of TP positions (8 KiB of K for heads of 128), double-buffered in
// shared memory by cp.async: the next tile's rows are in flight while the block works on this
// one (their block-table entries looked up a tile earlier still), and no register holds a
// load in flight (the grouped form that kept a lane group's
// accumulators for 4 heads in registers ran at 2 blocks an SM and read K/V at ~1 TB/s). Per
// tile: (1) a thread per (head, position) scores q . k from shared memory, (2) a warp per head
// folds the scores into its running max and sum, (3) a thread per (head, 4 dims) adds the
// weighted V rows to its accumulators.
//
// Cache layout: row = block_id * block_size + pos % block_size, each row [n_kv * hd] f16; a
// token's block table is tables[tbl_off[t] ..]. partial[((t * n_heads + h) * n_splits + s) *
// (hd + 4)] = {m, l, -, -, acc[hd]} (acc 16-byte aligned); count[t * gridDim.x + blockIdx.x]
// counts finished ranges (zero between launches: the merging block resets it).

#define ATT_THREADS 128
#define ATT_GQ 4       // query heads per block at most
#define ATT_MINLEN 32  // positions per context range at least
#define ATT_MAXSPLITS 128  // context ranges at most (the merge keeps their factors in shared memory)

__device__ __forceinline__ float lo_h(u32 w) { return h2f((u16)(w & 0xFFFF)); }
__device__ __forceinline__ float hi_h(u32 w) { return h2f((u16)(w >> 16)); }

template <int HD>
struct AttnTile {
    static constexpr int TP = HD <= 64 ? 64 : (HD <= 128 ? 32 : 16);  // positions a tile
    static constexpr int RS = HD + 8;  // halves a shared row: 16 bytes of padding keep the
                                       // rows of 8 lanes' 16-byte reads on distinct banks
    static constexpr int CPR = HD / 8;  // 16-byte pieces a row
    static constexpr int R = (ATT_GQ * HD / 4 + ATT_THREADS - 1) / ATT_THREADS;  // (head, 4 dims) items a thread
    static constexpr int LPT = (TP * CPR + ATT_THREADS - 1) / ATT_THREADS;  // 16-byte pieces a thread loads a tile
};

// The end of a decode attention block of 128 threads over nq query heads h0 .. h0 + nq - 1 of
// token t and context range s of ns: its unnormalized outputs so[j * HD + d], running maxima
// sm[j] (natural-log units of the scaled scores) and sums sl[j] in shared memory (visible to
// every thread). One range: the output is so / sl. Several: the block stores its range's
// result in partial, and the last block of the (token, group) to finish merges every range's
// (count[t * gridDim.x + blockIdx.x] counts them and is reset by it), in `merge` (2 * nq *
// ATT_MAXSPLITS floats of shared memory). The output row is written, and quantized for the
// output projection (32-value blocks) when xq is given.
template <int HD>
__device__ __forceinline__ void attn_decode_finish(float* so, float* sm, float* sl, float* merge, int nq, int h0,
                                                   int t, int s, int ns, int n_splits, int n_heads, float* partial,
                                                   int* count, float* out, i8* xq, float2* xd) {
    constexpr int PS = HD + 4;  // floats of a range's result in partial
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int qdim = n_heads * HD, n = nq * HD;
    __shared__ int last;
    if (ns == 1) {
        for (int i = tid; i < n; i += ATT_THREADS) so[i] /= sl[i / HD];
    } else {
        const u64 hs = (u64)n_splits * PS;  // a head's stride in partial
        float* pb = partial + ((u64)t * n_heads + h0) * hs + (u64)s * PS;
        for (int k = tid; k < n / 4; k += ATT_THREADS) {
            const int j = k / (HD / 4), c = k % (HD / 4);
            *(float4*)(pb + j * hs + 4 + 4 * c) = *(const float4*)(so + j * HD + 4 * c);
        }
        if (tid < nq) {
            pb[tid * hs] = sm[tid];
            pb[tid * hs + 1] = sl[tid];
        }
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int* cnt = count + (u64)t * gridDim.x + blockIdx.x;
            last = atomicAdd(cnt, 1) == ns - 1;
            if (last) *cnt = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        // every range's max and sum at once, a warp per head's factors, then a thread per
        // (head, 4 dims) sums the ranges' accumulators (independent 16-byte loads)
        const float* ph = partial + ((u64)t * n_heads + h0) * hs;
        float* sf = merge;                       // [nq][ATT_MAXSPLITS] maxima, then factors
        float* sfl = merge + nq * ATT_MAXSPLITS;  // sums
        for (int k = tid; k < nq * ns; k += ATT_THREADS) {
            const int j = k / ns, q = k % ns;
            sf[j * ATT_MAXSPLITS + q] = __ldcg(ph + j * hs + q * PS);
            sfl[j * ATT_MAXSPLITS + q] = __ldcg(ph + j * hs + q * PS + 1);
        }
        __syncthreads();
        for (int j = warp; j < nq; j += ATT_THREADS / 32) {
            float* f = sf + j * ATT_MAXSPLITS;
            float M = -INFINITY, L = 0.f;
            for (int q = lane; q < ns; q += 32) M = fmaxf(M, f[q]);
            M = warp_max(M);
            for (int q = lane; q < ns; q += 32) {
                const float mr = f[q], e = mr == -INFINITY ? 0.f : __expf(mr - M);
                f[q] = e;
                L += sfl[j * ATT_MAXSPLITS + q] * e;
            }
            L = warp_sum(L);
            if (lane == 0) sl[j] = L;
        }
        __syncthreads();
        for (int k = tid; k < n / 4; k += ATT_THREADS) {
            const int j = k / (HD / 4), c = k % (HD / 4);
            const float* pa = ph + j * hs + 4 + 4 * c;
            const float* f = sf + j * ATT_MAXSPLITS;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
            for (int q = 0; q < ns; q++) {
                const float e = f[q];
                const float4 v = __ldcg((const float4*)(pa + q * PS));
                a.x += e * v.x; a.y += e * v.y; a.z += e * v.z; a.w += e * v.w;
            }
            const float il = 1.f / sl[j];
            *(float4*)(so + j * HD + 4 * c) = make_float4(a.x * il, a.y * il, a.z * il, a.w * il);
        }
    }
    __syncthreads();
    float* orow = out + (u64)t * qdim + (u64)h0 * HD;
    for (int b0 = 0; b0 < n; b0 += ATT_THREADS) {
        const int i = b0 + tid;
        const float v = i < n ? so[i] : 0.f;
        if (i < n) orow[i] = v;
        if (xq != nullptr && b0 + 32 * warp < n) {
            u64 c = ((u64)t * qdim + (u64)h0 * HD + b0 + 32 * warp) / 32;
            quant32(v, xq + 32 * c, xd + c);
        }
    }
}

template <int HD>
__device__ __forceinline__ void attn_decode_g(const float* __restrict__ Q, int n_heads, int n_kv,
                                              const u16* __restrict__ kc, const u16* __restrict__ vc,
                                              int block_size, const int* pos, const int* tbl_off,
                                              const int* tables, int n_splits, float scale, float* partial,
                                              int* count, float* out, i8* xq, float2* xd) {
    using A = AttnTile<HD>;
    constexpr int TP = A::TP, RS = A::RS, CPR = A::CPR, R = A::R, LPT = A::LPT;
    const int G = n_heads / n_kv, subs = (G + ATT_GQ - 1) / ATT_GQ, per = (G + subs - 1) / subs;
    const int kvh = blockIdx.x / subs, sub = blockIdx.x % subs;
    const int h0 = kvh * G + sub * per, nq = min(per, G - sub * per);
    const int t = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    // positions and block tables come from the host (uploaded before the step): read before
    // the wait on the previous kernel, as are the cache rows it did not write (below)
    const int len = pos[t] + 1;
    const int ns = min(n_splits, (len + ATT_MINLEN - 1) / ATT_MINLEN);
    if (s >= ns) {
        GRID_DEP();
        return;
    }
    const int chunk = (len + ns - 1) / ns;
    const int p0 = s * chunk, p1 = min(len, p0 + chunk);
    const int ntiles = (p1 - p0 + TP - 1) / TP;
    const int kv_dim = n_kv * HD;
    // rows at positions from `fresh` on may be this step's own (a step of T tokens writes
    // positions len - T .. len - 1 of a sequence at most, in the kernel before this one)
    const int fresh = len - (int)gridDim.y;

    __shared__ __align__(16) u16 sk[2][TP * RS], sv[2][TP * RS];
    __shared__ __align__(16) float sq[ATT_GQ * HD];  // the group's queries, scaled
    __shared__ float sw[ATT_GQ][TP];                 // scores, then weights
    __shared__ float scorr[ATT_GQ], sm[ATT_GQ], sl[ATT_GQ];

    const int* tbl = tables + tbl_off[t];
    const u64 col = (u64)kvh * HD;
    // a tile's rows in two steps, a tile apart: this thread's pieces' cache rows from the block
    // table (-1: past the range), then their copies into a buffer
    auto lookup = [&](int it, int* rows) {
        const int tp0 = p0 + it * TP;
#pragma unroll
        for (int k = 0; k < LPT; k++) {
            const int i = tid + ATT_THREADS * k, p = tp0 + i / CPR;
            rows[k] = i < TP * CPR && p < p1 ? tbl[p / block_size] * block_size + p % block_size : -1;
        }
    };
    // the pieces of tile `it` at positions in [from, to), and with `zeros` those past the
    // range (zero-filled)
    auto issue_part = [&](const int* rows, int it, int buf, int from, int to, bool zeros) {
        const int tp0 = p0 + it * TP;
#pragma unroll
        for (int k = 0; k < LPT; k++) {
            const int i = tid + ATT_THREADS * k, p = tp0 + i / CPR;
            if (i < TP * CPR && (rows[k] < 0 ? zeros : p >= from && p < to)) {
                const u64 g = (u64)max(rows[k], 0) * kv_dim + col + 8 * (i % CPR);
                const int d = (i / CPR) * RS + 8 * (i % CPR);
                cp_async16(&sk[buf][d], kc + g, rows[k] >= 0);
                cp_async16(&sv[buf][d], vc + g, rows[k] >= 0);
            }
        }
        cp_async_commit();
    };
    auto issue = [&](const int* rows, int it, int buf) { issue_part(rows, it, buf, 0, len, true); };

    float acc[R][4], m_run = -INFINITY, l_run = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
    int rows[LPT];
    lookup(0, rows);
    issue_part(rows, 0, 0, 0, fresh, true);  // the rows of earlier steps: before the wait
    GRID_DEP();
    // this step's rows (written by the kernel before), and the queries
    issue_part(rows, 0, 0, fresh, len, false);
    for (int i = tid; i < ATT_GQ * HD; i += ATT_THREADS) {
        int j = i / HD;
        sq[i] = j < nq ? Q[((u64)t * n_heads + h0 + j) * HD + i % HD] * scale : 0.f;
    }
    lookup(1, rows);
    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, tp0 = p0 + it * TP;
        cp_async_wait_all();
        __syncthreads();  // this tile landed for every thread; the last tile's readers are done
        if (it + 1 < ntiles) {
            issue(rows, it + 1, buf ^ 1);
            lookup(it + 2, rows);
        }
        const u16* K = sk[buf];
        const u16* V = sv[buf];
        // (1) scores: a thread per (head, position)
        for (int i = tid; i < ATT_GQ * TP; i += ATT_THREADS) {
            int j = i / TP, p = i % TP;
            float sc = -INFINITY;
            if (j < nq && tp0 + p < p1) {
                const u16* kr = K + p * RS;
                const float* qj = sq + j * HD;
                float d0 = 0.f, d1 = 0.f;
#pragma unroll
                for (int c = 0; c < CPR; c++) {
                    uint4 w = *(const uint4*)(kr + 8 * c);
                    float4 qa = *(const float4*)(qj + 8 * c), qb = *(const float4*)(qj + 8 * c + 4);
                    d0 += qa.x * lo_h(w.x) + qa.y * hi_h(w.x) + qa.z * lo_h(w.y) + qa.w * hi_h(w.y);
                    d1 += qb.x * lo_h(w.z) + qb.y * hi_h(w.z) + qb.z * lo_h(w.w) + qb.w * hi_h(w.w);
                }
                sc = d0 + d1;
            }
            sw[j][p] = sc;
        }
        __syncthreads();
        // (2) a warp per head: running max and sum, the tile's weights and the rescale
        if (warp < nq) {
            float mx = -INFINITY;
            for (int p = lane; p < TP; p += 32) mx = fmaxf(mx, sw[warp][p]);
            mx = warp_max(mx);
            const float mn = fmaxf(m_run, mx), corr = __expf(m_run - mn);
            float sum = 0.f;
            for (int p = lane; p < TP; p += 32) {
                float w = __expf(sw[warp][p] - mn);
                sw[warp][p] = w;
                sum += w;
            }
            l_run = l_run * corr + warp_sum(sum);
            m_run = mn;
            if (lane == 0) scorr[warp] = corr;
        }
        __syncthreads();
        // (3) a thread per (head, 4 dims): acc = acc * corr + sum_p w_p v_p
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int k = tid + ATT_THREADS * r, j = k / (HD / 4), c = k % (HD / 4);
            if (j < nq) {
                const float cr = scorr[j];
                float a0 = acc[r][0] * cr, a1 = acc[r][1] * cr, a2 = acc[r][2] * cr, a3 = acc[r][3] * cr;
#pragma unroll 8
                for (int p = 0; p < TP; p++) {
                    const float w = sw[j][p];
                    const uint2 v = *(const uint2*)(V + p * RS + 4 * c);
                    a0 += w * lo_h(v.x); a1 += w * hi_h(v.x); a2 += w * lo_h(v.y); a3 += w * hi_h(v.y);
                }
                acc[r][0] = a0; acc[r][1] = a1; acc[r][2] = a2; acc[r][3] = a3;
            }
        }
    }
    cp_async_wait_all();  // (an empty range's zero fills)
    __syncthreads();
    // the block's result into shared memory: the queries are spent (so), the K tiles too (the
    // merge's factors)
    float* so = sq;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int k = tid + ATT_THREADS * r, j = k / (HD / 4), c = k % (HD / 4);
        if (j < nq) *(float4*)(so + j * HD + 4 * c) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    }
    if (warp < nq && lane == 0) { sm[warp] = m_run; sl[warp] = l_run; }
    static_assert(sizeof(sk) >= 2 * ATT_GQ * ATT_MAXSPLITS * sizeof(float), "merge space");
    __syncthreads();
    attn_decode_finish<HD>(so, sm, sl, (float*)&sk[0][0], nq, h0, t, s, ns, n_splits, n_heads, partial, count,
                           out, xq, xd);
}

// attn_decode_h<HD>: heads of HD dims. Grid (n_kv * ceil(G / ceil(G / 4)), t, n_splits) as
// ops.rs computes it (`attn_groups`), 128 threads.
#define ATTD(HD)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_decode_h##HD(                    \
        const float* Q, int n_heads, int n_kv, const u16* kc, const u16* vc, int block_size,         \
        const int* pos, const int* tbl_off, const int* tables, int n_splits, float scale,            \
        float* partial, int* count, float* out, i8* xq, float2* xd) {                              \
        attn_decode_g<HD>(Q, n_heads, n_kv, kc, vc, block_size, pos, tbl_off, tables, n_splits,     \
                          scale, partial, count, out, xq, xd);                                       \
    }
ATTD(16) ATTD(32) ATTD(48) ATTD(64) ATTD(80) ATTD(96) ATTD(112) ATTD(128) ATTD(192) ATTD(256)
