//! The backend seam: a recipe is written once against [`Ops`], and every backend (the CUDA
//! one in `kestrel-cuda`; later Metal) carries out its steps on its own buffers.
//!
//! Why a trait of operations over *named* weights and buffers (SEAMS.md, "middle road"):
//! - The recipe ([`dense`]) names what to do (`matmul(Wq of layer 3, H -> Q)`) and never holds a
//!   device pointer, a host slice or a shape: the backend owns the bytes, sizes its buffers for
//!   the step, and resolves a [`W`] to wherever it keeps that weight.
//! - An operation may not synchronize with the host or allocate, so a backend can wrap a whole
//!   forward pass in a capture (the CUDA backend records the decode step into a CUDA graph once
//!   and replays it), and may fuse consecutive operations behind the recipe's back (the CUDA
//!   backend runs bias → q/k norm → RoPE → KV write as one kernel).
//! - Per-step values (token ids, positions, block tables, which rows want logits) are data the
//!   backend uploads before the pass, never constants in the recipe.
//! - A missing operation is a compile error in the backend that lacks it, not a run-time
//!   surprise; a third backend is one more `impl Ops`.

pub mod cpu;
pub mod dense;
pub mod hybrid;
pub mod moe;

/// A weight of one layer, by role (GGUF's names in comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    AttnNorm, // attn_norm (dim)
    Wq,       // attn_q (n_heads * head_dim, dim)
    Wk,       // attn_k (n_kv_heads * head_dim, dim)
    Wv,       // attn_v (n_kv_heads * head_dim, dim)
    Wo,       // attn_output (dim, n_heads * head_dim)
    BiasQ,    // attn_q.bias (n_heads * head_dim), Qwen2
    BiasK,    // attn_k.bias (n_kv_heads * head_dim), Qwen2
    BiasV,    // attn_v.bias (n_kv_heads * head_dim), Qwen2
    QNorm,    // attn_q_norm (head_dim), Qwen3
    KNorm,    // attn_k_norm (head_dim), Qwen3
    FfnNorm,  // ffn_norm (dim)
    Gate,     // ffn_gate (ffn_dim, dim)
    Up,       // ffn_up (ffn_dim, dim)
    Down,     // ffn_down (dim, ffn_dim)
    // Qwen3.5's gated attention: attn_q holds per head the query's rows then its output gate's
    // ((n_heads * 2 * head_dim, dim)); a backend splits them at load into Wq (the queries) and
    // WqGate (the gates), so each is one plain matmul
    WqGate, // the gate rows of attn_q (n_heads * head_dim, dim)
    // Qwen3.5's gated-DeltaNet layers
    SsmQkv,    // attn_qkv (conv channels = 2 * key_dim + value_dim, dim)
    SsmZ,      // attn_gate (value_dim, dim): the output gate z
    SsmAlpha,  // ssm_alpha (n_v_heads, dim): decay input
    SsmBeta,   // ssm_beta (n_v_heads, dim): update strength
    SsmConv,   // ssm_conv1d (conv_kernel, conv channels), tap-major
    SsmA,      // ssm_a (n_v_heads): -exp(A_log)
    SsmDtBias, // ssm_dt.bias (n_v_heads)
    SsmNorm,   // ssm_norm (head_v_dim): the gated RMSNorm's weight
    SsmOut,    // ssm_out (dim, value_dim)
    // Qwen3-MoE's routed FFN (n_experts experts of expert_ffn_dim rows each)
    MoeRouter, // ffn_gate_inp (n_experts, dim)
    GateExps,  // ffn_gate_exps (n_experts, expert_ffn_dim, dim)
    UpExps,    // ffn_up_exps (n_experts, expert_ffn_dim, dim)
    DownExps,  // ffn_down_exps (n_experts, dim, expert_ffn_dim)
}

/// A weight of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum W {
    Layer(usize, Param),
    /// token_embd (vocab, dim)
    Embed,
    /// output_norm (dim)
    OutputNorm,
    /// output (vocab, dim); the embedding itself when tied
    Output,
}

/// The activation buffers a recipe works in. Rows are the step's tokens (`T`, from every
/// sequence of the batch) except `Picked` and `Logits`, whose rows are the tokens whose logits
/// were asked for. `Buf as usize` numbers them from 0 to [`Buf::COUNT`] - 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    X,      // [T, dim] the residual stream
    H,      // [T, dim] a normed copy of X
    Q,      // [T, n_heads * head_dim]
    K,      // [T, n_kv_heads * head_dim]
    V,      // [T, n_kv_heads * head_dim]
    Att,    // [T, n_heads * head_dim] attention output
    Ffn,    // [T, ffn_dim] silu(gate) * up
    Picked, // [n_out, dim]
    Logits, // [n_out, vocab]
    // hybrid models (Qwen3.5)
    Gate,  // [T, n_heads * head_dim] the attention's output gate (before its sigmoid)
    Mixed, // [T, conv channels] a DeltaNet layer's q | k | v before the convolution
    Conv,  // [T, conv channels] after the convolution and SiLU
    Z,     // [T, value_dim] the DeltaNet output gate
    Alpha, // [T, n_v_heads]
    Beta,  // [T, n_v_heads]
    Delta, // [T, value_dim] the delta rule's output
    // mixture-of-experts models (Qwen3-MoE)
    Router,    // [T, n_experts] the router's logits
    ExpertFfn, // [T * n_used, expert_ffn_dim] silu(gate) * up of each token's routed experts
}

impl Buf {
    pub const COUNT: usize = Buf::ExpertFfn as usize + 1;
}

/// The operations a backend carries out. Every call is enqueued work: no host
/// synchronization, no allocation (see the module doc).
pub trait Ops {
    type Error;
    /// `out[t] = embedding row of token t`.
    fn embed(&mut self, out: Buf) -> Result<(), Self::Error>;
    /// `out[t] = x[t] / rms(x[t]) * w` (`out` may be `x`).
    fn rms_norm(&mut self, x: Buf, w: W, out: Buf) -> Result<(), Self::Error>;
    /// RMSNorm over each `head_dim` slice of every row, in place (Qwen3's q/k norm).
    fn head_norm(&mut self, x: Buf, w: W) -> Result<(), Self::Error>;
    /// `x[t] += b`.
    fn add_bias(&mut self, x: Buf, b: W) -> Result<(), Self::Error>;
    /// `out[t] = w · x[t]`.
    fn matmul(&mut self, w: W, x: Buf, out: Buf) -> Result<(), Self::Error>;
    /// `out[t] += w · x[t]` (the residual add in the matmul's epilogue).
    fn matmul_add(&mut self, w: W, x: Buf, out: Buf) -> Result<(), Self::Error>;
    /// `out[t] = silu(gate · x[t]) * (up · x[t])`.
    fn gate_up_swiglu(&mut self, gate: W, up: W, x: Buf, out: Buf) -> Result<(), Self::Error>;
    /// RoPE at each token's position, over every head of `x`, in place.
    fn rope(&mut self, x: Buf) -> Result<(), Self::Error>;
    /// Stores each token's K and V rows at its position in the KV cache of `layer`.
    fn kv_write(&mut self, layer: usize, k: Buf, v: Buf) -> Result<(), Self::Error>;
    /// Causal attention of each token's query over its sequence's cache (positions `0..=pos`).
    fn attention(&mut self, layer: usize, q: Buf, out: Buf) -> Result<(), Self::Error>;
    /// The rows of `x` whose logits were asked for, in order, into `out`.
    fn pick_rows(&mut self, x: Buf, out: Buf) -> Result<(), Self::Error>;
}

/// The operations of hybrid models (Qwen3.5: gated DeltaNet and gated attention) beyond
/// [`Ops`]. The recurrent state lives in the backend: per sequence a slot (the engine's
/// `SeqStep::slot`) holding, for every DeltaNet layer, the convolution window and the state
/// matrices; a sequence whose step starts at position 0 starts from a cleared slot.
pub trait HybridOps: Ops {
    /// `x *= sigmoid(gate)`, elementwise.
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf) -> Result<(), Self::Error>;
    /// DeltaNet layer `layer`'s short causal convolution (taps `SsmConv`) + SiLU over each
    /// sequence's tokens of `x`, continuing from the window in the sequence's slot, which then
    /// holds the last `conv_kernel - 1` inputs.
    fn conv_silu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<(), Self::Error>;
    /// The gated delta rule of DeltaNet layer `layer` over each sequence's tokens, from and into
    /// the state in its slot: q, k (from `conv`) L2-normalized (q scaled by 1/sqrt(d_k)),
    /// `beta = sigmoid(beta_in)`, decay `exp(A softplus(alpha + dt_bias))`, the per-value-head
    /// outputs into `out`. The backend may overwrite `conv`, `alpha` and `beta`.
    fn delta_rule(
        &mut self,
        layer: usize,
        conv: Buf,
        alpha: Buf,
        beta: Buf,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// Per value head, in place: `x = rms_norm(x) * w * silu(z)`.
    fn gated_norm(&mut self, x: Buf, z: Buf, w: W) -> Result<(), Self::Error>;
}

/// The operations of mixture-of-experts models (Qwen3-MoE) beyond [`Ops`]: a router picks
/// each token's `n_used` experts, the tokens go through them, and the outputs are summed with
/// the router's weights. The routes live in the backend between [`MoeOps::moe_route`] and the
/// expert operations of the same layer.
pub trait MoeOps: Ops {
    /// Routes each token from its router logits (`[T, n_experts]`): softmax over every expert,
    /// the `n_used` most probable (ties to the lower index), their probabilities renormalized
    /// to sum to 1 where the config says so (`norm_top_k`).
    fn moe_route(&mut self, layer: usize, logits: Buf) -> Result<(), Self::Error>;
    /// For token `t` and its `j`-th route to expert `e`: `out[t * n_used + j] =
    /// silu(gate_e · x[t]) * (up_e · x[t])`.
    fn expert_swiglu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<(), Self::Error>;
    /// `out[t] += sum over j of weight_j * (down_{e_j} · ffn[t * n_used + j])`, the routes in
    /// order (as the CPU sums them).
    fn expert_down_add(&mut self, layer: usize, ffn: Buf, out: Buf) -> Result<(), Self::Error>;
}
