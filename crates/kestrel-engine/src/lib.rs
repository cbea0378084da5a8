//! kestrel-engine: the serving engine between front ends (CLI, HTTP server) and a paged model.
//!
//! The shape follows a request:
//!
//! - [`Engine`] (`engine.rs`) is what front ends hold. [`Engine::submit`] checks a
//!   [`GenerateRequest`] against what could ever fit (context size, KV pool) and refuses it at
//!   once with a [`SubmitError`] that says what would fit; otherwise it hands the request to the
//!   one scheduler thread and returns a [`RequestHandle`] that streams [`Event`]s. Dropping the
//!   handle (or [`RequestHandle::cancel`]) cancels the request.
//! - The scheduler (`scheduler.rs`) owns the model and runs *steps*. Each step: drop cancelled
//!   work, admit queued requests (strict FIFO) while their blocks can be reserved, then build one
//!   batch: one decode token for every running sequence plus prefill chunks of the sequences
//!   still reading their prompt (at most `chunk_size` per sequence, `step_token_budget` in all),
//!   and run it as one [`StepModel::forward`] call. Logits are sampled per request
//!   (`sequence.rs`: sampler, stream decoder, stop strings, logprobs).
//! - The block pool (`blocks.rs`) is pure bookkeeping over block ids `0..n_blocks`: reference
//!   counts, a free list, and the **prefix index**, a chain of block hashes
//!   (`hash(parent hash, block tokens)`) over full blocks that every request shares. Cached blocks
//!   nobody references stay in the index and are evicted least-recently-used only when the pool
//!   needs a block. The model stores the K/V data; the engine never sees it.
//!
//! ## Memory policy: reservation, no over-commit
//! A request is admitted only when `ceil((prompt + max_tokens) / block_size)` blocks, less the
//! ones it shares from the prefix cache, can be *reserved* out of the free + evictable blocks not
//! already reserved by running sequences. A running sequence therefore always finds its next
//! block, never waits and never has to be preempted, so running sequences always finish and free
//! their blocks; the queue is FIFO and every queued request fits an empty pool (the others are
//! refused at submit), so the head is eventually admitted: no deadlock, no starvation. The price
//! is that `max_tokens` is budgeted in full even when generation stops early.
//!
//! ## Room for hybrid models (Qwen3.5), not implemented yet
//! Qwen3.5 keeps, besides K/V for its attention layers, a fixed-size recurrent state per
//! sequence that cannot be cut at an arbitrary token. Prefill chunks that do not end the prompt
//! are cut at block boundaries (see `scheduler.rs`), so every chunk boundary is also a block
//! boundary of the prefix index. The plan: the model snapshots its recurrent state at chunk
//! boundaries into a snapshot slot, the index entry of the block that ends a chunk records the
//! slot (`blocks.rs`, `CachedBlock`), and a prefix lookup for such a model stops at the deepest
//! matched block that carries a snapshot. Snapshot slots would be budgeted like blocks.

mod blocks;
mod config;
mod engine;
mod error;
pub mod mock;
mod model;
mod paged;
mod request;
mod scheduler;
mod sequence;
mod stats;
mod stop;
#[cfg(test)]
mod tests;

pub use blocks::BlockPool;
pub use config::EngineConfig;
pub use engine::Engine;
pub use error::{ConfigError, SubmitError};
pub use model::{SeqStep, StepModel};
pub use paged::{plan_pool, PoolPlan, DEFAULT_MEMORY_FRACTION};
pub use request::{Event, FinishReason, GenerateRequest, RequestHandle, TokenLogprob, Usage};
pub use stats::EngineStats;
pub use stop::{StopMatcher, StopOutcome};
