// Qwen3.5's hybrid layers: the gated attention's sigmoid gate, and the gated-DeltaNet
// layer's convolution, delta rule and gated norm (deltanet/ in kestrel-models has the math).
//
// The recurrent state lives in slots (one per running sequence or snapshot), each `slot_floats`
// floats: for every DeltaNet layer in order, the convolution window [K-1, channels] (oldest
// first) and then the state matrices [n_v_heads, d_k, d_v] — the CPU's StatePool layout.
// A step's sequences come as three int arrays: first token row, token count, slot.

// x *= sigmoid(g), elementwise; with q, also the int8 blocks of x (quantize_q's layout) for
// the output projection's mat-vec: total a multiple of 32, so a warp is one whole block.
extern "C" __global__ void mul_sigmoid(float* x, const float* g, u64 total, i8* q, float2* qd) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (q) {
        if ((i & ~(u64)31) >= total) return;  // whole warps
        float v = x[i] * (1.f / (1.f + __expf(-g[i])));
        x[i] = v;
        quant32(v, q + (i & ~(u64)31), qd + i / 32);
    } else if (i < total) {
        x[i] *= 1.f / (1.f + __expf(-g[i]));
    }
}

#define CONV_MAXK 8

// out[t, c] = silu(sum_j taps[j, c] * x[t - (K-1) + j, c]) over each sequence's tokens, inputs
// before the step from the window of its slot, which then slides to the last K-1 inputs.
// grid (n_seqs, ceil(ch / 256)), 256 threads: one channel per thread, tokens in order.
extern "C" __global__ void conv_silu_seq(const float* x, float* out, const float* taps, int ch, int K,
                                         float* states, u64 slot_floats, u64 layer_off,
                                         const int* seq_t0, const int* seq_len, const int* seq_slot) {
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    int t0 = seq_t0[s], n = seq_len[s];
    float* win = states + (u64)seq_slot[s] * slot_floats + layer_off;
    float h[CONV_MAXK - 1], w[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++) h[j] = j < K - 1 ? win[(u64)j * ch + c] : 0.f;
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) w[j] = j < K ? taps[(u64)j * ch + c] : 0.f;
    // the window, the taps and the step's sequence arrays (uploaded before the step) never
    // come from the previous kernel: only x waits for it
    GRID_DEP();
    for (int i = 0; i < n; i++) {
        float xi = x[(u64)(t0 + i) * ch + c];
        // the CPU's order: oldest input first, the new one last
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j < K - 1) acc += w[j] * h[j];
#pragma unroll
        for (int j = 0; j < CONV_MAXK; j++)
            if (j == K - 1) acc += w[j] * xi;
        out[(u64)(t0 + i) * ch + c] = silu(acc);
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 2; j++)
            if (j < K - 2) h[j] = h[j + 1];
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j == K - 2) h[j] = xi;
    }
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++)
        if (j < K - 1) win[(u64)j * ch + c] = h[j];
}

// Prompt steps: conv_silu_seq's outputs with one thread per (channel, run of CONV_RUN tokens)
// of a sequence instead of one per channel walking every token; the inputs before a run come
// from the step or, before the step's first token, from the slot's window, which conv_window
// (launched after) then slides. Same sums in the same order. grid (n_seqs, ceil(ch / 256),
// ceil(T / CONV_RUN)), 256 threads; runs past a sequence's tokens return.
#define CONV_RUN 16
extern "C" __global__ void __launch_bounds__(256) conv_silu_par(const float* x, float* out, const float* taps, int ch,
                                                                 int K, const float* states, u64 slot_floats,
                                                                 u64 layer_off, const int* seq_t0, const int* seq_len,
                                                                 const int* seq_slot) { GRID_DEP();
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x, i0 = blockIdx.z * CONV_RUN;
    int t0 = seq_t0[s], n = seq_len[s];
    if (c >= ch || i0 >= n) return;
    const float* win = states + (u64)seq_slot[s] * slot_floats + layer_off;
    float h[CONV_MAXK - 1], w[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++) {
        int p = i0 - (K - 1) + j;  // relative to the step's first token; the window holds -(K-1) .. -1
        h[j] = j >= K - 1 ? 0.f : (p >= 0 ? x[(u64)(t0 + p) * ch + c] : win[(u64)(K - 1 + p) * ch + c]);
    }
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) w[j] = j < K ? taps[(u64)j * ch + c] : 0.f;
    int i1 = min(n, i0 + CONV_RUN);
    for (int i = i0; i < i1; i++) {
        float xi = x[(u64)(t0 + i) * ch + c];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j < K - 1) acc += w[j] * h[j];
#pragma unroll
        for (int j = 0; j < CONV_MAXK; j++)
            if (j == K - 1) acc += w[j] * xi;
        out[(u64)(t0 + i) * ch + c] = silu(acc);
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 2; j++)
            if (j < K - 2) h[j] = h[j + 1];
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j == K - 2) h[j] = xi;
    }
}

// The window after conv_silu_par's step: the last K-1 inputs of each sequence (older ones from
// the old window when the step brought fewer). grid (n_seqs, ceil(ch / 256)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) conv_window(const float* x, int ch, int K, float* states,
                                                               u64 slot_floats, u64 layer_off, const int* seq_t0,
                                                               const int* seq_len, const int* seq_slot) { GRID_DEP();
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    int t0 = seq_t0[s], n = seq_len[s];
    float* win = states + (u64)seq_slot[s] * slot_floats + layer_off;
    float h[CONV_MAXK - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++) {
        int p = n - (K - 1) + j;
        h[j] = j >= K - 1 ? 0.f : (p >= 0 ? x[(u64)(t0 + p) * ch + c] : win[(u64)(K - 1 + p) * ch + c]);
    }
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++)
        if (j < K - 1) win[(u64)j * ch + c] = h[j];
}

// Tokens whose q and k one chunk of the rule kernel stages in shared memory.
#define RULE_CHUNK 16
// Value columns per block of the rule kernel: a head's state is split over dv / RULE_COLS
// blocks of RULE_THREADS threads, four threads a column (each a quarter of its d_k rows), so
// a decode step keeps n_seqs * nv * dv / 8 warps busy (0.8B: 256, 9B: 512 at one sequence).
#define RULE_COLS 32
#define RULE_THREADS (4 * RULE_COLS)

// Token row `at` of value head vh: its log-decay A softplus(alpha + dt_bias) and its update
// gate sigmoid(beta).
__device__ __forceinline__ float log_decay(const float* alpha, const float* dt_bias, const float* A, u64 at, int vh) {
    float a = alpha[at] + dt_bias[vh];
    float sp = a > 20.f ? a : log1pf(expf(a));
    return A[vh] * sp;
}
__device__ __forceinline__ float update_gate(const float* beta, u64 at) { return 1.f / (1.f + expf(-beta[at])); }

// One token of the rule on lane group c's column of a head's state, each lane a quarter of its
// rows (col: rows r, r+4, .. of the lane; ki / qi: k and q from the lane's first row on, stride
// 4): col = a col + k d with d = b (v - a colᵀk); returns colᵀq, on all four lanes.
template <int RPL>
__device__ __forceinline__ float rule_token(float* col, const float* ki, const float* qi, float a, float b,
                                            float v) {
    float p0 = 0.f, p1 = 0.f;
#pragma unroll
    for (int e = 0; e < RPL; e += 2) {
        p0 += col[e] * ki[4 * e];
        if (e + 1 < RPL) p1 += col[e + 1] * ki[4 * e + 4];
    }
    float p = p0 + p1;
    p += __shfl_xor_sync(0xffffffffu, p, 1);
    p += __shfl_xor_sync(0xffffffffu, p, 2);
    const float d = b * (v - a * p);
    float o0 = 0.f, o1 = 0.f;
#pragma unroll
    for (int e = 0; e < RPL; e++) {
        col[e] = col[e] * a + ki[4 * e] * d;
        if (e & 1) o1 += col[e] * qi[4 * e];
        else o0 += col[e] * qi[4 * e];
    }
    float o = o0 + o1;
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    return o;
}

// The gated delta rule, tokens in order: S = a S + k (beta (v - a Sᵀk))ᵀ, o = Sᵀq per value
// head, from the raw convolution output and gate inputs (prepared here, per chunk: q and k
// L2-normalized, q also scaled by 1/sqrt(dk); beta = sigmoid(beta); the decay
// a = exp(A softplus(alpha + dt_bias))). grid (n_seqs, nv, ceil(dv / RULE_COLS)),
// RULE_THREADS threads: lane group c (lanes 4c..4c+3 of a warp) owns one column of the head's
// state [DK, dv], lane 4c+r keeps its rows r, r+4, r+8, .. in registers (interleaved, so the
// four lanes' reads of q and k from shared memory fall on distinct banks); a token's Sᵀk and
// Sᵀq are four partial sums folded by two shuffles. (One warp per 32 columns walking all DK
// rows, the earlier form, left 64 warps on 132 SMs at the 0.8B's one sequence, each with a
// 128-long dependent chain per sum.)
template <int DK>
__device__ __forceinline__ void delta_rule(const float* conv, int ch, int key_dim, const float* alpha,
                                           const float* beta, const float* A, const float* dt_bias,
                                           int nv, int nk, int dv, int tiled, float* out, float* states,
                                           u64 slot_floats, u64 layer_off, const int* seq_t0,
                                           const int* seq_len, const int* seq_slot) {
    constexpr int PER = (DK + 31) / 32;  // q / k elements per lane when a warp normalizes
    constexpr int RPL = DK / 4;          // state rows per lane
    static_assert(DK % 4 == 0, "rows split over four lanes");
    __shared__ float qs[RULE_CHUNK][DK], ks[RULE_CHUNK][DK], vs[RULE_CHUNK][RULE_COLS], decay[RULE_CHUNK],
        gate[RULE_CHUNK];
    const int s = blockIdx.x, vh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int c = warp * 8 + (lane >> 2), quarter = lane & 3, j = blockIdx.z * RULE_COLS + c;
    const int t0 = seq_t0[s], n = seq_len[s];
    const int kh = tiled ? vh % nk : vh / (nv / nk);
    const int value_dim = nv * dv;
    float* S = states + (u64)seq_slot[s] * slot_floats + layer_off + (u64)vh * DK * dv;
    const bool act = j < dv;
    const float qscale = rsqrtf((float)DK);
    float col[RPL];
#pragma unroll
    for (int e = 0; e < RPL; e++) col[e] = act ? S[(u64)(4 * e + quarter) * dv + j] : 0.f;
    // the state (only this layer's rule kernel writes it, a step earlier) and the step's
    // sequence arrays are in flight before the wait; the convolution output comes after it
    GRID_DEP();
    for (int c0 = 0; c0 < n; c0 += RULE_CHUNK) {
        const int m = min(RULE_CHUNK, n - c0);
        __syncthreads();  // the last chunk's readers are done
        // the chunk's q and k, L2-normalized: warp w takes tokens 4w..4w+3 (of 16), their
        // loads in flight together
        for (int i0 = 4 * warp; i0 < m; i0 += 4 * (RULE_THREADS / 32)) {
            float qv[4][PER], kv[4][PER];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float* row = conv + (u64)(t0 + c0 + min(i0 + u, m - 1)) * ch;
#pragma unroll
                for (int e = 0; e < PER; e++) {
                    int r = lane + 32 * e;
                    qv[u][e] = r < DK ? row[kh * DK + r] : 0.f;
                    kv[u][e] = r < DK ? row[key_dim + kh * DK + r] : 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float sq = 0.f, sk = 0.f;
#pragma unroll
                for (int e = 0; e < PER; e++) {
                    sq += qv[u][e] * qv[u][e];
                    sk += kv[u][e] * kv[u][e];
                }
                float iq = qscale / sqrtf(warp_sum(sq) + 1e-6f), ik = 1.f / sqrtf(warp_sum(sk) + 1e-6f);
                if (i0 + u < m) {
#pragma unroll
                    for (int e = 0; e < PER; e++) {
                        int r = lane + 32 * e;
                        if (r < DK) {
                            qs[i0 + u][r] = qv[u][e] * iq;
                            ks[i0 + u][r] = kv[u][e] * ik;
                        }
                    }
                }
            }
        }
        // the block's columns of v for every token of the chunk
        for (int k = tid; k < m * RULE_COLS; k += RULE_THREADS) {
            const int i = k / RULE_COLS, jj = blockIdx.z * RULE_COLS + k % RULE_COLS;
            vs[i][k % RULE_COLS] = jj < dv ? conv[(u64)(t0 + c0 + i) * ch + 2 * key_dim + vh * dv + jj] : 0.f;
        }
        if (tid < m) {
            u64 at = (u64)(t0 + c0 + tid) * nv + vh;
            decay[tid] = expf(log_decay(alpha, dt_bias, A, at, vh));
            gate[tid] = update_gate(beta, at);
        }
        __syncthreads();
        // every lane runs the loop (its shuffles need all 32); columns past dv write nothing
        for (int i = 0; i < m; i++) {
            const float o = rule_token<RPL>(col, ks[i] + quarter, qs[i] + quarter, decay[i], gate[i], vs[i][c]);
            if (act && quarter == 0) out[(u64)(t0 + c0 + i) * value_dim + vh * dv + j] = o;
        }
    }
    if (act) {
#pragma unroll
        for (int e = 0; e < RPL; e++) S[(u64)(4 * e + quarter) * dv + j] = col[e];
    }
}

#define RULE_KERNEL(DK)                                                                                   \
    extern "C" __global__ void __launch_bounds__(RULE_THREADS) delta_rule_##DK(                              \
        const float* conv, int ch, int key_dim, const float* alpha, const float* beta, const float* A,    \
        const float* dt_bias, int nv, int nk, int dv, int tiled, float* out, float* states,               \
        u64 slot_floats, u64 layer_off, const int* seq_t0, const int* seq_len, const int* seq_slot) {              \
        delta_rule<DK>(conv, ch, key_dim, alpha, beta, A, dt_bias, nv, nk, dv, tiled, out, states,        \
                       slot_floats, layer_off, seq_t0, seq_len, seq_slot);                                \
    }
RULE_KERNEL(16)
RULE_KERNEL(32)
RULE_KERNEL(64)
RULE_KERNEL(128)

// Prompt steps: the same rule over chunks of DC tokens in the chunked (WY) form, as matrix work
// instead of a token-by-token walk. With g_t the chunk's cumulative log-decays, D[t][s] =
// e^(g_t - g_s) (s <= t), the state S [DK, dv] before the chunk and its normalized q, k rows:
//   u = (I + L)^-1 diag(beta) (v - e^g K S),  L[t][s] = beta_t D[t][s] k_t.k_s (s < t)
//   o_t = e^(g_t) q_t S + sum_{s <= t} D[t][s] (q_t.k_s) u_s
//   S' = e^(g_last) S + sum_s D[last][s] k_s u_s^T
// (unrolling the recurrence S_t = a_t S_{t-1} + k_t (beta_t (v_t - a_t S_{t-1}^T k_t))^T of
// delta_rule over the chunk). A state column evolves on its own, so a block of 256 threads
// takes one 32-column slice of one head, kept in shared memory across the sequence's chunks.
// grid (n_seqs, nv, ceil(dv / 32)).
#define DC 16
template <int DK>
__device__ __forceinline__ void delta_chunked(const float* conv, int ch, int key_dim, const float* alpha,
                                              const float* beta, const float* A, const float* dt_bias, int nv,
                                              int nk, int dv, int tiled, float* out, float* states,
                                              u64 slot_floats, u64 layer_off, const int* seq_t0,
                                              const int* seq_len, const int* seq_slot) {
    constexpr int KP = DK + 1;  // padded: threads reading k rows t = 0..15 at one r hit 16 banks
    constexpr int PER = (DK + 31) / 32;
    __shared__ float Qs[DC][KP], Ks[DC][KP], Ss[DK][32], Vs[DC][32], KS[DC][32], QS[DC][32], U[DC][32];
    __shared__ float KK[DC][DC + 1], QK[DC][DC + 1], Dm[DC][DC + 1], gs[DC], bs[DC];
    int s = blockIdx.x, vh = blockIdx.y, j0 = blockIdx.z * 32, tid = threadIdx.x;
    int warp = tid >> 5, lane = tid & 31;
    int t0 = seq_t0[s], n = seq_len[s];
    int kh = tiled ? vh % nk : vh / (nv / nk);
    int value_dim = nv * dv;
    bool col_ok = j0 + lane < dv;
    float* S = states + (u64)seq_slot[s] * slot_floats + layer_off + (u64)vh * DK * dv;
    float qscale = rsqrtf((float)DK);
    for (int r = warp; r < DK; r += 8) Ss[r][lane] = col_ok ? S[(u64)r * dv + j0 + lane] : 0.f;
    for (int c0 = 0; c0 < n; c0 += DC) {
        int m = min(DC, n - c0);
        // the chunk's q and k rows, L2-normalized (zeros past m), and this slice of v
        for (int t = warp; t < DC; t += 8) {
            bool live = t < m;
            const float* row = conv + (u64)(t0 + c0 + min(t, m - 1)) * ch;
            float qv[PER], kv[PER], sq = 0.f, sk = 0.f;
#pragma unroll
            for (int e = 0; e < PER; e++) {
                int r = lane + 32 * e;
                qv[e] = r < DK ? row[kh * DK + r] : 0.f;
                kv[e] = r < DK ? row[key_dim + kh * DK + r] : 0.f;
                sq += qv[e] * qv[e];
                sk += kv[e] * kv[e];
            }
            float iq = live ? qscale / sqrtf(warp_sum(sq) + 1e-6f) : 0.f;
            float ik = live ? 1.f / sqrtf(warp_sum(sk) + 1e-6f) : 0.f;
#pragma unroll
            for (int e = 0; e < PER; e++) {
                int r = lane + 32 * e;
                if (r < DK) {
                    Qs[t][r] = qv[e] * iq;
                    Ks[t][r] = kv[e] * ik;
                }
            }
            Vs[t][lane] = live && col_ok ? row[2 * key_dim + vh * dv + j0 + lane] : 0.f;
        }
        // log-decays (cumulative) and gates; past m no decay and beta = 0, so u = 0 there
        if (tid < DC) {
            float la = 0.f, b = 0.f;
            if (tid < m) {
                u64 at = (u64)(t0 + c0 + tid) * nv + vh;
                la = log_decay(alpha, dt_bias, A, at, vh);
                b = update_gate(beta, at);
            }
#pragma unroll
            for (int o = 1; o < DC; o <<= 1) {
                float x = __shfl_up_sync(0xffffu, la, o);
                if (tid >= o) la += x;
            }
            gs[tid] = la;
            bs[tid] = b;
        }
        __syncthreads();
        // KS = K S, QS = Q S (DC x 32), KK = K K^T, QK = Q K^T, D (DC x DC): thread (t, c)
        {
            int t = tid >> 4, c = tid & 15;
            float ks0 = 0.f, ks1 = 0.f, qs0 = 0.f, qs1 = 0.f, kk = 0.f, qk = 0.f;
#pragma unroll 8
            for (int r = 0; r < DK; r++) {
                float kt = Ks[t][r], qt = Qs[t][r], sa = Ss[r][c], sb = Ss[r][c + 16], kc = Ks[c][r];
                ks0 += kt * sa;
                ks1 += kt * sb;
                qs0 += qt * sa;
                qs1 += qt * sb;
                kk += kt * kc;
                qk += qt * kc;
            }
            KS[t][c] = ks0;
            KS[t][c + 16] = ks1;
            QS[t][c] = qs0;
            QS[t][c + 16] = qs1;
            KK[t][c] = kk;
            QK[t][c] = qk;
            Dm[t][c] = c <= t ? expf(gs[t] - gs[c]) : 0.f;
        }
        __syncthreads();
        // u by forward substitution, one column per lane of warp 0
        if (tid < 32) {
            float u[DC];
#pragma unroll
            for (int t = 0; t < DC; t++) {
                float x = Vs[t][tid] - expf(gs[t]) * KS[t][tid];
#pragma unroll
                for (int q = 0; q < t; q++) x -= Dm[t][q] * KK[t][q] * u[q];
                u[t] = bs[t] * x;
                U[t][tid] = u[t];
            }
        }
        __syncthreads();
        // outputs of the chunk's tokens (thread (t, c): columns c and c + 16)
        {
            int t = tid >> 4, c = tid & 15;
            float eg = expf(gs[t]);
            float o0 = eg * QS[t][c], o1 = eg * QS[t][c + 16];
            for (int q = 0; q <= t; q++) {
                float w = Dm[t][q] * QK[t][q];
                o0 += w * U[q][c];
                o1 += w * U[q][c + 16];
            }
            if (t < m) {
                float* o = out + (u64)(t0 + c0 + t) * value_dim + vh * dv + j0;
                if (j0 + c < dv) o[c] = o0;
                if (j0 + c + 16 < dv) o[c + 16] = o1;
            }
        }
        // the state after the chunk
        {
            float ul[DC], wl[DC];
#pragma unroll
            for (int q = 0; q < DC; q++) {
                ul[q] = U[q][lane];
                wl[q] = Dm[DC - 1][q];
            }
            float el = expf(gs[DC - 1]);
            for (int r = warp; r < DK; r += 8) {
                float acc = el * Ss[r][lane];
#pragma unroll
                for (int q = 0; q < DC; q++) acc += wl[q] * Ks[q][r] * ul[q];
                Ss[r][lane] = acc;
            }
        }
        __syncthreads();
    }
    if (col_ok)
        for (int r = warp; r < DK; r += 8) S[(u64)r * dv + j0 + lane] = Ss[r][lane];
}

#define CHUNKED_KERNEL(DK)                                                                                \
    extern "C" __global__ void __launch_bounds__(256) delta_chunked_##DK(                                 \
        const float* conv, int ch, int key_dim, const float* alpha, const float* beta, const float* A,    \
        const float* dt_bias, int nv, int nk, int dv, int tiled, float* out, float* states,               \
        u64 slot_floats, u64 layer_off, const int* seq_t0, const int* seq_len, const int* seq_slot) { GRID_DEP();    \
        delta_chunked<DK>(conv, ch, key_dim, alpha, beta, A, dt_bias, nv, nk, dv, tiled, out, states,     \
                          slot_floats, layer_off, seq_t0, seq_len, seq_slot);                             \
    }
CHUNKED_KERNEL(16)
CHUNKED_KERNEL(32)
CHUNKED_KERNEL(64)
CHUNKED_KERNEL(128)

// Per (token, value head), in place: x = x / rms(x) * w * silu(z); with q, also the int8 blocks
// of x (quantize_q's layout) for the output projection's mat-vec, which then needs no quantize
// launch of its own (dv a multiple of 32: each warp one block). grid (T, nv), blockDim = dv
// rounded up to 32.
extern "C" __global__ void gated_norm(float* x, const float* z, const float* w, int dv, float eps, i8* q,
                                      float2* qd) {
    int i = threadIdx.x;
    const float wi = i < dv ? w[i] : 0.f;  // a weight: loaded before the wait
    GRID_DEP();
    u64 at = ((u64)blockIdx.x * gridDim.y + blockIdx.y) * dv;
    float v = i < dv ? x[at + i] : 0.f;
    float zi = i < dv ? z[at + i] : 0.f;
    float ss = block_sum(v * v);
    float o = i < dv ? v * rsqrtf(ss / (float)dv + eps) * wi * silu(zi) : 0.f;
    if (i < dv) x[at + i] = o;
    if (q) quant32(o, q + at + (i & ~31), qd + (at + i) / 32);
}
