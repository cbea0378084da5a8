//! The hybrid recipe (Qwen3.5), written once over [`HybridOps`]: gated-DeltaNet layers (three
//! of every four) and gated full attention, each followed by the dense recipe's SwiGLU MLP.
//! The CPU's serving path runs the same steps in `recipes::qwen35` and `deltanet` (the
//! reference the GPU is checked against); this is what the GPU runs.

use super::{dense, Buf, HybridOps, Param, W};
use crate::config::ModelConfig;

/// One forward pass: embeddings, every layer, then the logits of the picked rows.
pub fn forward<O: HybridOps + ?Sized>(o: &mut O, cfg: &ModelConfig) -> Result<(), O::Error> {
    o.embed(Buf::X)?;
    for l in 0..cfg.n_layers {
        if cfg.is_recurrent(l) {
            deltanet(o, l)?;
        } else {
            gated_attention(o, l)?;
        }
        dense::mlp(o, l)?;
    }
    dense::logits(o)
}

/// Qwen3's attention with an output gate: the q projection also yields, per head, a gate that
/// scales the attention output by its sigmoid (`WqGate`: those rows of attn_q); RoPE turns the
/// config's `rope_dim` dimensions.
fn gated_attention<O: HybridOps + ?Sized>(o: &mut O, l: usize) -> Result<(), O::Error> {
    let w = |p| W::Layer(l, p);
    o.rms_norm(Buf::X, w(Param::AttnNorm), Buf::H)?;
    o.matmul(w(Param::Wq), Buf::H, Buf::Q)?;
    o.matmul(w(Param::WqGate), Buf::H, Buf::Gate)?;
    o.matmul(w(Param::Wk), Buf::H, Buf::K)?;
    o.matmul(w(Param::Wv), Buf::H, Buf::V)?;
    o.head_norm(Buf::Q, w(Param::QNorm))?;
    o.head_norm(Buf::K, w(Param::KNorm))?;
    o.rope(Buf::Q)?;
    o.rope(Buf::K)?;
    o.kv_write(l, Buf::K, Buf::V)?;
    o.attention(l, Buf::Q, Buf::Att)?;
    o.mul_sigmoid(Buf::Att, Buf::Gate)?;
    o.matmul_add(w(Param::Wo), Buf::Att, Buf::X)
}

/// A gated-DeltaNet layer (see `deltanet::layer` for the math), added to the residual stream.
fn deltanet<O: HybridOps + ?Sized>(o: &mut O, l: usize) -> Result<(), O::Error> {
    let w = |p| W::Layer(l, p);
    o.rms_norm(Buf::X, w(Param::AttnNorm), Buf::H)?;
    o.matmul(w(Param::SsmQkv), Buf::H, Buf::Mixed)?;
    o.matmul(w(Param::SsmZ), Buf::H, Buf::Z)?;
    o.matmul(w(Param::SsmAlpha), Buf::H, Buf::Alpha)?;
    o.matmul(w(Param::SsmBeta), Buf::H, Buf::Beta)?;
    o.conv_silu(l, Buf::Mixed, Buf::Conv)?;
    o.delta_rule(l, Buf::Conv, Buf::Alpha, Buf::Beta, Buf::Delta)?;
    o.gated_norm(Buf::Delta, Buf::Z, w(Param::SsmNorm))?;
    o.matmul_add(w(Param::SsmOut), Buf::Delta, Buf::X)
}
