//! One file per model family: which tensors a layer has and the order of its steps.

pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;
pub mod qwen3moe;

use crate::weights::TensorStore;
use crate::{Arch, ModelConfig, ModelError};

/// The final norm's weights (dim) as every backend applies them: Qwen3.5's Hugging Face files
/// store `w` for `1 + w`, its GGUF files and every other family store the factor itself.
pub fn output_norm(store: &TensorStore, cfg: &ModelConfig) -> Result<Vec<f32>, ModelError> {
    match cfg.arch {
        Arch::Qwen35 => qwen35::output_norm(store, cfg),
        _ => store.vector("output_norm.weight", cfg.dim),
    }
}
