//! Llama (SmolLM2, Llama 2/3): pre-norm attention and SwiGLU MLP, no biases.

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
        qkv_bias: false,
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
    let qkv = layers::project_qkv(ctx, a, i, x)?;
    layers::attend(ctx, a, i, qkv, kv, x)?;
    layers::ffn(ctx, &l.ffn, i, x)
}
