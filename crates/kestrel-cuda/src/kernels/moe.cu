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
