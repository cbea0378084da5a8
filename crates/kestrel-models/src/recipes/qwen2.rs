//! Qwen2 / Qwen2.5: llama's layer plus biases on the q, k and v projections.

use crate::config::ModelConfig;
use crate::kv::KvPool;
use crate::layers::{self, AttnParts, Ctx, LayerWeights};
use crate::weights::TensorStore;
use crate::ModelError;

pub fn load_layer(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
) -> Result<LayerWeights, ModelError> {
    let parts = AttnParts {
        qkv_bias: true,
        qk_norm: false,
    };
    layers::load_layer(store, cfg, i, parts)
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
    if let Some(b) = &a.bias {
        layers::add_qkv_bias(&mut qkv, b); // what makes it Qwen2
    }
    layers::attend(ctx, a, i, qkv, kv, x)?;
    layers::ffn(ctx, &l.ffn, i, x)
}
