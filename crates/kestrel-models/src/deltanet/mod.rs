//! Gated DeltaNet, the linear-attention layers of hybrid models (Qwen3.5): their shapes
//! ([`config`]), the recurrent state kept per sequence outside the model ([`state`]), the
//! short causal convolution ([`conv`]), the delta rule in its chunked and recurrent forms
//! ([`rule`]), and the layer that strings them together ([`layer`]).

#[macro_use]
mod simd;
pub mod config;
pub mod conv;
pub mod gemm;
pub mod layer;
pub mod rule;
pub mod state;

pub use config::{DeltaNetConfig, HeadGrouping};
pub use layer::DeltaNetWeights;
pub use state::StatePool;
