//! The mixture-of-experts recipe (Qwen3-MoE), written once over [`MoeOps`]: Qwen3's attention
//! block, then per layer either the routed experts or, on the layers the config keeps dense,
//! the dense recipe's SwiGLU MLP. The CPU's serving path runs the same steps in
//! `recipes::qwen3moe` and [`crate::moe`] (the reference the GPU is checked against).

use super::{dense, Buf, MoeOps, Param, W};
use crate::config::ModelConfig;

/// One forward pass: embeddings, every layer, then the logits of the picked rows.
pub fn forward<O: MoeOps + ?Sized>(o: &mut O, cfg: &ModelConfig) -> Result<(), O::Error> {
    o.embed(Buf::X)?;
    for l in 0..cfg.n_layers {
        dense::attention(o, dense::Family::QWEN3, l)?;
        if cfg.moe.as_ref().is_some_and(|m| m.is_sparse(l)) {
            routed(o, l)?;
        } else {
            dense::mlp(o, l)?;
        }
    }
    dense::logits(o)
}

/// The routed FFN of layer `l`: `x += sum_j w_j * expert_{e_j}(norm(x))` over each token's
/// routes (see [`crate::moe`] for the math).
pub fn routed<O: MoeOps + ?Sized>(o: &mut O, l: usize) -> Result<(), O::Error> {
    let w = |p| W::Layer(l, p);
    o.rms_norm(Buf::X, w(Param::FfnNorm), Buf::H)?;
    o.matmul(w(Param::MoeRouter), Buf::H, Buf::Router)?;
    o.moe_route(l, Buf::Router)?;
    o.expert_swiglu(l, Buf::H, Buf::ExpertFfn)?;
    o.expert_down_add(l, Buf::ExpertFfn, Buf::X)
}
