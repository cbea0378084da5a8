//! Model recipes and the CPU forward pass.
//!
//! Data flow: a [`weights::TensorStore`] indexes the tensors of a GGUF file or a Hugging Face
//! folder (memory-mapped, GGUF names); a recipe ([`recipes`]) picks the tensors of each layer
//! and orders the steps written in [`layers`] (norms, projections, RoPE, attention, MLP), which
//! call the kernels through [`ops::matmul`]. The KV cache is reached only through [`kv::KvCache`]
//! (one sequence) or [`kv::KvPool`] (many); the recurrent state of hybrid models (Qwen3.5) lives
//! beside it in a [`deltanet::StatePool`], one slot per sequence, outside the model.
//!
//! Two matmul paths exist side by side: [`ops::MatmulPath::Reference`] (f32, plain loops — the
//! oracle) and [`ops::MatmulPath::Quantized`] (8-bit activations, SIMD integer dot products).

pub mod attention;
pub mod backend;
pub mod config;
pub mod deltanet;
mod error;
pub mod kv;
pub mod layers;
pub mod libm_exp;
pub mod model;
pub mod moe;
pub mod ops;
pub mod paged;
pub mod plan;
pub mod pool;
pub mod quantize;
pub mod recipes;
pub mod tap;
pub mod vexp;
pub mod weights;

pub use config::{Arch, ModelConfig, RopeLayout};
pub use deltanet::StatePool;
pub use error::ModelError;
pub use kv::{KvCache, KvPool, KvType};
pub use model::{LoadOptions, Logits, Model, SeqStep, WantLogits};
pub use ops::MatmulPath;
pub use paged::{PagedModel, PagedStep};
pub use plan::MemoryPlan;
