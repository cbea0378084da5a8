//! kestrel's CUDA backend: the shared recipes ([`kestrel_models::backend::dense`] for llama,
//! qwen2, qwen3; [`kestrel_models::backend::hybrid`] for Qwen3.5) carried out on an NVIDIA GPU.
//!
//! Shaped like the data's path:
//! - [`probe`]: the CUDA libraries are found (or the one missing is named) before any CUDA
//!   call, so one binary runs everywhere and says "no CUDA device found" as one line.
//! - [`compile`]: the CUDA C++ kernels in `kernels/`, compiled by NVRTC for the device's
//!   architecture at start and cached on disk (the doc there says why not shipped PTX).
//! - [`device`]: context, stream, cuBLAS, device buffers.
//! - [`weights`]: GGUF blocks uploaded in the kernels' layout.
//! - [`ops`]: the backend's [`kestrel_models::backend::Ops`] (fusions documented there);
//!   `hybrid_ops`: its `HybridOps` (gated attention, the DeltaNet layer; the recurrent state's
//!   slots live in device memory, in [`model`]).
//! - [`model`]: weights + paged KV pool + scratch on the device, the forward pass, CUDA graphs
//!   for decode, and the engine's `StepModel`; `graph`: a captured step with programmatic
//!   (early-launch) edges between its kernels; `scratch`: the activation and step buffers
//!   sized for a step, and decode attention's context ranges; [`timeline`]: a replayed
//!   step's kernels stamped on the GPU's timer (`KESTREL_CUDA_TIMELINE`).
//! - [`plan`]: the GPU memory plan. [`check`]: every op against the CPU, and whole models.

pub mod check;
pub mod compile;
mod deferred;
pub mod device;
pub mod error;
mod graph;
mod hybrid_ops;
mod matmul;
mod mmq;
pub mod model;
pub mod moe;
pub mod ops;
pub mod plan;
pub mod probe;
mod scratch;
pub mod timeline;
pub mod weights;

pub use device::{parse_ordinal, Gpu};
pub use error::{CudaError, Result};
pub use model::{CudaModel, GpuShape, SeqIn};
