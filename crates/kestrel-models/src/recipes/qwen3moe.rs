//! Qwen3-MoE: Qwen3's attention (q/k norms, no biases), then a routed mixture of SwiGLU
//! experts ([`crate::moe`]) in place of the MLP (a dense MLP on the layers the config names).
//! The forward pass is Qwen3's: the layer's FFN decides dense or routed.

use crate::config::ModelConfig;
use crate::layers::{self, Ffn, LayerWeights};
use crate::moe::MoeWeights;
use crate::weights::TensorStore;
use crate::ModelError;

pub fn load_layer(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
) -> Result<LayerWeights, ModelError> {
    let mixer = layers::load_attention(store, cfg, i, super::qwen3::ATTENTION)?;
    let norm = store.vector(&format!("blk.{i}.ffn_norm.weight"), cfg.dim)?;
    let moe = cfg
        .moe
        .as_ref()
        .ok_or_else(|| ModelError::MissingParam("qwen3moe.expert_count".into()))?;
    let ffn = if moe.is_sparse(i) {
        Ffn::Moe(MoeWeights::load(store, cfg, moe, i, norm)?)
    } else {
        Ffn::Dense(layers::load_mlp(store, cfg, i, norm)?)
    };
    Ok(LayerWeights { mixer, ffn })
}
