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
/// were asked for.
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
