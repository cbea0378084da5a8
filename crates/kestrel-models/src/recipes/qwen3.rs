//! Qwen3: llama's layer plus an RMSNorm over each head of q and k before RoPE; no biases.

use crate::config::ModelConfig;
use crate::kv::KvPool;
use crate::layers::{self, AttnParts, Ctx, LayerWeights};
use crate::weights::TensorStore;
use crate::ModelError;

/// Qwen3's attention block (Qwen3-MoE's too).
pub const ATTENTION: AttnParts = AttnParts {
    qkv_bias: false,
    qk_norm: true,
};

pub fn load_layer(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
) -> Result<LayerWeights, ModelError> {
    layers::load_layer(store, cfg, i, ATTENTION)
}

pub fn forward_layer(
    ctx: &Ctx,
    l: &LayerWeights,
    i: usize,
    kv: &mut KvPool,
    x: &mut [f32],
) -> Result<(), ModelError> {
    let a = l.attention(i)?;
    let mut qkv = layers::project_qkv(ctx, a, i, x)?;
    if let Some(n) = &a.qk_norm {
        layers::qk_head_norm(ctx, &mut qkv, n); // what makes it Qwen3
    }
    layers::attend(ctx, a, i, qkv, kv, x)?;
    layers::ffn(ctx, &l.ffn, i, x)
}
