//! One file per model family: which tensors a layer has and the order of its steps.

pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;
pub mod qwen3moe;
