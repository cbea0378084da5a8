// Qwen3.5's hybrid layers: the gated attention's split and sigmoid gate, and the gated-DeltaNet
// layer's convolution, delta rule and gated norm (deltanet/ in kestrel-models has the math).
//
// The recurrent state lives in slots (one per running sequence or snapshot), each `slot_floats`
// floats: for every DeltaNet layer in order, the convolution window [K-1, channels] (oldest
// first) and then the state matrices [n_v_heads, d_k, d_v] — the CPU's StatePool layout.
// A step's sequences come as three int arrays: first token row, token count, slot.

// qg [T, H, 2, hd] -> q [T, H, hd], gate [T, H, hd].
extern "C" __global__ void split_gate(const float* qg, float* q, float* gate, int hd, u64 total) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= total) return;
    u64 head = i / hd, e = i % hd;
    q[i] = qg[2 * head * hd + e];
    gate[i] = qg[(2 * head + 1) * hd + e];
}

// x *= sigmoid(g), elementwise.
extern "C" __global__ void mul_sigmoid(float* x, const float* g, u64 total) { GRID_DEP();
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < total) x[i] *= 1.f / (1.f + __expf(-g[i]));
}

#define CONV_MAXK 8

// out[t, c] = silu(sum_j taps[j, c] * x[t - (K-1) + j, c]) over each sequence's tokens, inputs
// before the step from the window of its slot, which then slides to the last K-1 inputs.
// grid (n_seqs, ceil(ch / 256)), 256 threads: one channel per thread, tokens in order.
extern "C" __global__ void conv_silu_seq(const float* x, float* out, const float* taps, int ch, int K,
                                         float* states, u64 slot_floats, u64 layer_off,
                                         const int* seq_t0, const int* seq_len, const int* seq_slot) { GRID_DEP();
    int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    int t0 = seq_t0[s], n = seq_len[s];
    float* win = states + (u64)seq_slot[s] * slot_floats + layer_off;
    float h[CONV_MAXK - 1], w[CONV_MAXK];
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++) h[j] = j < K - 1 ? win[(u64)j * ch + c] : 0.f;
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) w[j] = j < K ? taps[(u64)j * ch + c] : 0.f;
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

// Tokens whose q and k one chunk of the rule kernel stages in shared memory.
#define RULE_CHUNK 16
// Value columns per block of the rule kernel (one warp): a head's state is split over
// dv / RULE_COLS blocks, so a decode step keeps n_seqs * nv * dv / 32 warps busy.
#define RULE_COLS 32

// The gated delta rule, tokens in order: S = a S + k (beta (v - a Sᵀk))ᵀ, o = Sᵀq per value
// head, from the raw convolution output and gate inputs (prepared here, per chunk: q and k
// L2-normalized, q also scaled by 1/sqrt(dk); beta = sigmoid(beta); the decay
// a = exp(A softplus(alpha + dt_bias))). grid (n_seqs, nv, ceil(dv / RULE_COLS)), one warp:
// lane j keeps column j of its block's slice of the head's state [DK, dv] in registers, so a
// token's update and output are one thread's own loop over DK.
template <int DK>
__device__ __forceinline__ void delta_rule(const float* conv, int ch, int key_dim, const float* alpha,
                                           const float* beta, const float* A, const float* dt_bias,
                                           int nv, int nk, int dv, int tiled, float* out, float* states,
                                           u64 slot_floats, u64 layer_off, const int* seq_t0,
                                           const int* seq_len, const int* seq_slot) {
    __shared__ float qs[RULE_CHUNK][DK], ks[RULE_CHUNK][DK], decay[RULE_CHUNK], gate[RULE_CHUNK];
    int s = blockIdx.x, vh = blockIdx.y, lane = threadIdx.x, j = blockIdx.z * RULE_COLS + lane;
    int t0 = seq_t0[s], n = seq_len[s];
    int kh = tiled ? vh % nk : vh / (nv / nk);
    int value_dim = nv * dv;
    float* S = states + (u64)seq_slot[s] * slot_floats + layer_off + (u64)vh * DK * dv;
    bool act = j < dv;
    float qscale = rsqrtf((float)DK);
    float col[DK];
#pragma unroll
    for (int r = 0; r < DK; r++) col[r] = act ? S[(u64)r * dv + j] : 0.f;
    for (int c0 = 0; c0 < n; c0 += RULE_CHUNK) {
        int m = min(RULE_CHUNK, n - c0);
        __syncwarp();
        for (int i = 0; i < m; i++) {
            const float* row = conv + (u64)(t0 + c0 + i) * ch;
            float sq = 0.f, sk = 0.f;
            for (int r = lane; r < DK; r += 32) {
                float q = row[kh * DK + r], k = row[key_dim + kh * DK + r];
                qs[i][r] = q;
                ks[i][r] = k;
                sq += q * q;
                sk += k * k;
            }
            float iq = qscale / sqrtf(warp_sum(sq) + 1e-6f), ik = 1.f / sqrtf(warp_sum(sk) + 1e-6f);
            for (int r = lane; r < DK; r += 32) {
                qs[i][r] *= iq;
                ks[i][r] *= ik;
            }
        }
        if (lane < m) {
            u64 at = (u64)(t0 + c0 + lane) * nv + vh;
            float a = alpha[at] + dt_bias[vh];
            float sp = a > 20.f ? a : log1pf(expf(a));
            decay[lane] = expf(A[vh] * sp);
            gate[lane] = 1.f / (1.f + expf(-beta[at]));
        }
        __syncwarp();
        if (!act) continue;
        for (int i = 0; i < m; i++) {
            u64 t = t0 + c0 + i;
            float a = decay[i], b = gate[i];
            float v = conv[t * ch + 2 * key_dim + vh * dv + j];
            float kv = 0.f;
#pragma unroll
            for (int r = 0; r < DK; r++) kv += col[r] * ks[i][r];
            float d = b * (v - a * kv);
            float o = 0.f;
#pragma unroll
            for (int r = 0; r < DK; r++) {
                col[r] = col[r] * a + ks[i][r] * d;
                o += col[r] * qs[i][r];
            }
            out[t * value_dim + vh * dv + j] = o;
        }
    }
    if (act) {
#pragma unroll
        for (int r = 0; r < DK; r++) S[(u64)r * dv + j] = col[r];
    }
}

#define RULE_KERNEL(DK)                                                                                   \
    extern "C" __global__ void __launch_bounds__(RULE_COLS) delta_rule_##DK(                              \
        const float* conv, int ch, int key_dim, const float* alpha, const float* beta, const float* A,    \
        const float* dt_bias, int nv, int nk, int dv, int tiled, float* out, float* states,               \
        u64 slot_floats, u64 layer_off, const int* seq_t0, const int* seq_len, const int* seq_slot) { GRID_DEP();    \
        delta_rule<DK>(conv, ch, key_dim, alpha, beta, A, dt_bias, nv, nk, dv, tiled, out, states,        \
                       slot_floats, layer_off, seq_t0, seq_len, seq_slot);                                \
    }
RULE_KERNEL(16)
RULE_KERNEL(32)
RULE_KERNEL(64)
RULE_KERNEL(128)

// Per (token, value head), in place: x = x / rms(x) * w * silu(z). grid (T, nv), blockDim = dv
// rounded up to 32.
extern "C" __global__ void gated_norm(float* x, const float* z, const float* w, int dv, float eps) { GRID_DEP();
    u64 at = ((u64)blockIdx.x * gridDim.y + blockIdx.y) * dv;
    int i = threadIdx.x;
    float v = i < dv ? x[at + i] : 0.f;
    float ss = block_sum(v * v);
    if (i < dv) x[at + i] = v * rsqrtf(ss / (float)dv + eps) * w[i] * silu(z[at + i]);
}
