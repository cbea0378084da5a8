// The routed FFN of mixture-of-experts models (Qwen3-MoE): a router's top-k per token, each
// route's SwiGLU expert, and the routes' outputs summed with their weights into the residual.
//
// An expert stack is one matrix of (n_exp * rows, cols) in the device layout of weights.rs:
// expert e's row r is row e * rows + r, so every mat-vec helper of matvec.cu reads it as it
// reads a plain matrix. Routes are data (ids and weights in device memory), so a decode step
// with experts is still one CUDA graph. A route p = t * k + j is token t's j-th choice.

// Router logits -> routes, one warp a token (lane l holds experts l, l + 32, ...): the softmax
// over all experts, the k most probable (ties to the lower index), their probabilities
// renormalized to sum to 1 when norm (the sum kept away from 0 as llama.cpp does). margin[t]:
// the smallest log-probability gap between a token's k-th and (k+1)-th expert over the step's
// layers so far (`first`: this layer starts it), what a check needs to tell a routing near-tie
// (two experts a rounding apart) from a wrong route.
#define MOE_MAX_EXPERTS 512
extern "C" __global__ void __launch_bounds__(32) moe_route(const float* logits, int n_exp, int k, int norm,
                                                           int* ids, float* wts, float* margin, int first) {
    constexpr int PER = MOE_MAX_EXPERTS / 32;
    GRID_DEP();
    int t = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (u64)t * n_exp;
    float p[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int e = lane + 32 * i;
        p[i] = e < n_exp ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        p[i] = lane + 32 * i < n_exp ? __expf(p[i] - mx) : 0.f;
        s += p[i];
    }
    s = warp_sum(s);
#pragma unroll
    for (int i = 0; i < PER; i++) p[i] = lane + 32 * i < n_exp ? p[i] / s : -1.f;
    // k rounds of a warp argmax (a (k+1)-th for the margin); lane j keeps choice j
    float mine = 0.f, total = 0.f, kth = 0.f, next = 0.f;
    int mine_e = 0;
    for (int j = 0; j <= k && j < n_exp; j++) {
        float bv = -1.f;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = lane + 32 * i;
            if (p[i] > bv || (p[i] == bv && e < be)) { bv = p[i]; be = e; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (ov > bv || (ov == bv && oe < be)) { bv = ov; be = oe; }
        }
        if (j == k) { next = bv; break; }
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (lane + 32 * i == be) p[i] = -1.f;
        // NaN scores compare false everywhere: be stays out of range; the kernels that read the
        // ids must never see one (a read past the stack would end the context)
        if (lane == j) { mine = bv; mine_e = min(be, n_exp - 1); }
        total += bv;
        kth = bv;
    }
    if (lane == 0) {
        float gap = k < n_exp ? logf(kth) - logf(next) : INFINITY;
        margin[t] = first ? gap : fminf(margin[t], gap);
    }
    float scale = norm ? 1.f / fmaxf(total, 6.103515625e-5f) : 1.f;
    if (lane < k) {
        ids[(u64)t * k + lane] = mine_e;
        wts[(u64)t * k + lane] = mine * scale;
    }
}

// Unit u of row `row` of a stack of `rows` rows (and with TWO, of the same row of a second
// stack) dotted with one token's activations, added to acc[0][0] (acc[1][0]): units and
// activations as the mat-vecs take them (matvec.cu: int8 xq / xd for the quantized types, 64 or
// 32 weights a unit; f32 xf for F32 / F16, 8 a unit), `cols` wide.
template <int TY> struct StackUnit { enum { COLS = Blk<TY>::UNIT }; };
template <> struct StackUnit<T_F32> { enum { COLS = 8 }; };
template <> struct StackUnit<T_F16> { enum { COLS = 8 }; };
template <int TY, bool TWO>
__device__ __forceinline__ void stack_unit(const u8* A, const u8* B, int row, int rows, int cols, int u,
                                           const i8* xq, const float2* xd, const float* xf,
                                           float (*acc)[1]) {
    if constexpr (TY == T_F32 || TY == T_F16) {
        unit_acc_f<TY, 1>(A, row, cols, u, xf, cols, acc[0]);
        if (TWO) unit_acc_f<TY, 1>(B, row, cols, u, xf, cols, acc[1]);
    } else {
        int bpr = cols / Blk<TY>::QK, rm[1] = {row};
        units_acc<TY, 1, 1, TWO>(A, B, rm, (u64)rows * bpr, bpr, u, xq, xd, cols, acc);
    }
}

// out[p][r] = silu(G_e[r] . x[t]) * (U_e[r] . x[t]) for route p (blockIdx.y) of token t = p / k
// to expert e = ids[p]: a warp a row r of the expert's `eff` rows, grid (eff / 4, routes).
template <int TY>
__device__ __forceinline__ void moe_gate_up(const u8* G, const u8* U, int eff, int cols, int n_exp,
                                            const int* ids, int k, const i8* xq, const float2* xd,
                                            const float* xf, float* out) {
    GRID_DEP();
    int p = blockIdx.y, row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int t = p / k, wr = ids[p] * eff + min(row, eff - 1);
    float acc[2][1] = {{0.f}, {0.f}};
    for (int u = lane; u < cols / StackUnit<TY>::COLS; u += 32)
        stack_unit<TY, true>(G, U, wr, n_exp * eff, cols, u, xq + (u64)t * cols, xd + (u64)t * (cols / 32),
                             xf + (u64)t * cols, acc);
    float g = warp_sum(acc[0][0]), u = warp_sum(acc[1][0]);
    if (lane == 0 && row < eff) out[(u64)p * eff + row] = silu(g) * u;
}

// x[t][r] += sum over j < k of wts[p] * (D_e[r] . ffn[p]), p = t * k + j, e = ids[p]: a warp a
// row r of the `dim` output rows, grid (dim / 4, tokens). The warp's lanes take the units of
// all k routes together (an expert's row of 768 columns is 12 K-quant units: one route a
// round would leave 20 of 32 lanes idle), each unit's dot weighted by its route's weight.
template <int TY>
__device__ __forceinline__ void moe_down(const u8* D, int dim, int eff, int n_exp, const int* ids,
                                         const float* wts, int k, const i8* fq, const float2* fd,
                                         const float* ff, float* x) {
    GRID_DEP();
    int t = blockIdx.y, row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int r = min(row, dim - 1), units = eff / StackUnit<TY>::COLS;
    float sum = 0.f;
    for (int i = lane; i < k * units; i += 32) {
        int j = i / units, u = i - j * units;
        u64 p = (u64)t * k + j;
        float acc[1][1] = {{0.f}};
        stack_unit<TY, false>(D, D, ids[p] * dim + r, n_exp * dim, eff, u, fq + p * eff, fd + p * (eff / 32),
                              ff + p * eff, acc);
        sum += wts[p] * acc[0][0];
    }
    sum = warp_sum(sum);
    if (lane == 0 && row < dim) x[(u64)t * dim + row] += sum;
}

// Grouped experts (steps of many tokens): the routes sorted by expert into slots, each expert's
// routes in tiles of TW slots (its last tile padded), and each tile a mat-mat on the int8 tensor
// cores (mmq.cu's mmq_acc) over its expert's rows: an expert is read once a tile, where the
// mat-vecs above read it once a route. Slots and tiles are sized for the worst case, so the
// launches have fixed grids (a decode step stays one graph); unused tiles are marked e = -1.

// ids[routes] -> slot_route[s] (the route in slot s, -1 for padding; max_slots entries) and
// tiles[w] = (e, first slot, end slot, 0) for w < max_tiles (e = -1 past the last). One block of
// 1,024 threads: counts by shared atomics, the padded offsets and tiles by one thread (at most
// MOE_MAX_EXPERTS experts), the slots by atomic cursors (their order within an expert changes
// no result: each slot's sums are its own).
extern "C" __global__ void __launch_bounds__(1024) moe_sort(const int* ids, int routes, int n_exp, int tw,
                                                            int max_slots, int max_tiles, int* slot_route,
                                                            int4* tiles) {
    __shared__ int cnt[MOE_MAX_EXPERTS], base[MOE_MAX_EXPERTS];
    GRID_DEP();
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) cnt[e] = 0;
    for (int s = threadIdx.x; s < max_slots; s += blockDim.x) slot_route[s] = -1;
    __syncthreads();
    for (int p = threadIdx.x; p < routes; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, w = 0;
        for (int e = 0; e < n_exp; e++) {
            int c = cnt[e];
            base[e] = off;
            for (int s0 = off; s0 < off + c && w < max_tiles; s0 += tw) tiles[w++] = make_int4(e, s0, min(s0 + tw, off + c), 0);
            off += (c + tw - 1) / tw * tw;
            cnt[e] = 0;
        }
        for (; w < max_tiles; w++) tiles[w] = make_int4(-1, 0, 0, 0);
    }
    __syncthreads();
    for (int p = threadIdx.x; p < routes; p += blockDim.x) {
        int e = ids[p];
        slot_route[base[e] + atomicAdd(&cnt[e], 1)] = p;
    }
}

// Row p / div of x [*, n] for each slot's route p into the mat-mat's activation layout (mmq.cu's
// quantize_q_t: int8 [P][S8][32], (d, d * sum) [P][S8]); padding slots get zeros. div = k: the
// routes' tokens (gate / up); 1: the routes' own rows (down). Grid (S8, parts), 256 threads.
extern "C" __global__ void __launch_bounds__(256) moe_gather_q(const float* x, const int* slot_route, int div,
                                                                i8* q, float2* qd, int n, int S8) {
    GRID_DEP();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, s = blockIdx.x, p = slot_route[s];
    for (int base = (blockIdx.y * 8 + warp) * 32; base < n; base += gridDim.y * 256) {
        int P = base / 32;
        float v = p >= 0 ? x[(u64)(p / div) * n + base + lane] : 0.f;
        quant32(v, q + ((u64)P * S8 + s) * 32, qd + (u64)P * S8 + s);
    }
}

// out[p][r] = W_e[r] . act[s] for each slot s of tile blockIdx.y (expert e, route p =
// slot_route[s]) and row r of the block's 16 (blockIdx.x) of the expert's `rows`: WK warps of
// mmq_acc over 8 NJ slots (the tile width). rows must be a multiple of 16 (the tile's rows stay
// in its expert).
template <int TY, int NJ, int WK>
__device__ __forceinline__ void moe_mmq(const u8* W, int rows, int n_exp, int cols, const i8* xq,
                                        const float2* xd, int S8, const int4* tiles, const int* slot_route,
                                        float* out) {
    __shared__ float red[WK * NJ * 4 * 32];
    GRID_DEP();
    int4 tl = tiles[blockIdx.y];
    if (tl.x < 0) return;
    int r0 = blockIdx.x * 16;
    float acc[NJ][1][4];
    mmq_acc<TY, NJ, WK, (WK >= 8 || NJ <= 2), 1>(W, n_exp * rows, cols, xq, xd, S8, tl.x * rows + r0, tl.y, acc);
    mmq_sum<NJ, WK, 1>(acc, red, r0, tl.y, [&](int row, int s, float v) {
        if (s < tl.z) out[(u64)slot_route[s] * rows + row] = v;
    });
}

// x[t][r] += sum over j < k of wts[p] * y[p][r], p = t * k + j: the routes' down rows weighted
// into the residual, in route order. Grid (dim / 256, tokens).
extern "C" __global__ void __launch_bounds__(256) moe_combine(const float* y, const float* wts, int k, int dim,
                                                              float* x) {
    GRID_DEP();
    int t = blockIdx.y, r = blockIdx.x * 256 + threadIdx.x;
    if (r >= dim) return;
    float sum = 0.f;
    for (int j = 0; j < k; j++) {
        u64 p = (u64)t * k + j;
        sum += wts[p] * y[p * dim + r];
    }
    x[(u64)t * dim + r] += sum;
}

// moe_mmq_<type>_<NJ>: tiles of 8 NJ slots (1, 2 or 4), as moe.rs's expert_tile picks.
#define MOE_MMQ1(NAME, TY, NJ, WK)                                                                  \
    extern "C" __global__ void __launch_bounds__(WK * 32) moe_mmq_##NAME##_##NJ(                    \
        const u8* W, int rows, int n_exp, int cols, const i8* xq, const float2* xd, int S8,          \
        const int4* tiles, const int* slot_route, float* out) {                                     \
        moe_mmq<TY, NJ, WK>(W, rows, n_exp, cols, xq, xd, S8, tiles, slot_route, out);             \
    }
#define MOE_MMQ(NAME, TY) MOE_MMQ1(NAME, TY, 1, 8) MOE_MMQ1(NAME, TY, 2, 4) MOE_MMQ1(NAME, TY, 4, 4)

#define MOE(NAME, TY)                                                                           \
    extern "C" __global__ void __launch_bounds__(128) moe_gate_up_##NAME(                       \
        const u8* G, const u8* U, int eff, int cols, int n_exp, const int* ids, int k,          \
        const i8* xq, const float2* xd, const float* xf, float* out) {                          \
        moe_gate_up<TY>(G, U, eff, cols, n_exp, ids, k, xq, xd, xf, out);                       \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) moe_down_##NAME(                          \
        const u8* D, int dim, int eff, int n_exp, const int* ids, const float* wts, int k,      \
        const i8* fq, const float2* fd, const float* ff, float* x) {                            \
        moe_down<TY>(D, dim, eff, n_exp, ids, wts, k, fq, fd, ff, x);                           \
    }
MOE(f32, T_F32)
MOE(f16, T_F16)
MOE(q4_0, T_Q4_0)
MOE(q5_0, T_Q5_0)
MOE(q8_0, T_Q8_0)
MOE(q4_k, T_Q4_K)
MOE(q6_k, T_Q6_K)
MOE(q4_1, T_Q4_1)
MOE(q5_1, T_Q5_1)
MOE(q5_k, T_Q5_K)
MOE_MMQ(q4_0, T_Q4_0)
MOE_MMQ(q5_0, T_Q5_0)
MOE_MMQ(q8_0, T_Q8_0)
MOE_MMQ(q4_k, T_Q4_K)
MOE_MMQ(q6_k, T_Q6_K)
MOE_MMQ(q4_1, T_Q4_1)
MOE_MMQ(q5_1, T_Q5_1)
MOE_MMQ(q5_k, T_Q5_K)
