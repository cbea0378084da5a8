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
//! ## Hybrid models (Qwen3.5): recurrent state in the prefix cache
//! A hybrid model keeps, besides K/V for its attention layers, a fixed-size recurrent state per
//! sequence that cannot be cut at an arbitrary position. The model holds state slots
//! ([`StepModel::state_slots`]): the first `max_running` belong to running sequences, the rest
//! are the snapshot pool. Prefill chunks that do not end the prompt end on block boundaries
//! (`scheduler.rs`), and after each chunk and at the end of every prompt the scheduler copies
//! the sequence's state into a snapshot slot that hangs off the prefix index
//! (`blocks/snapshots.rs`; a prompt ending inside a block gets a tail entry that keeps that
//! block's positions with the snapshot). A hybrid prompt resumes from the longest cached
//! prefix that ends at a snapshot (`scheduler/state.rs`). Snapshots are bounded per sequence
//! ([`SNAPSHOTS_PER_SEQUENCE`]) and in all (the pool, least recently used evicted first); a
//! snapshot lives exactly as long as its index entry.

//!
//! ## Speculative decoding
//! With [`SpecConfig`] on, a decoding sequence's step carries its pending token plus up to `k`
//! proposals (n-gram lookup in its own tokens, `speculative.rs`, or a draft model that stores
//! its K/V under the same block ids, `scheduler/speculate.rs`); the one forward pass returns
//! logits for each, the sampler keeps the agreeing run (`kestrel_sampler::speculative`), and
//! `computed` moves back over the rejected positions, whose K/V the next step overwrites.
//! Blocks enter the prefix index only up to `computed`. Speculation pauses while more than
//! `max_batch` sequences decode together, and per sequence while its proposals keep failing.

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
mod speculative;
mod stats;
mod stop;
#[cfg(test)]
mod tests;

pub use blocks::BlockPool;
pub use config::{EngineConfig, SpecConfig, SpecMode};
pub use engine::Engine;
pub use error::{ConfigError, SubmitError};
pub use model::{Logits, LogitsMemory, SeqStep, StepModel};
pub use paged::{plan_pool, PoolPlan, DEFAULT_MEMORY_FRACTION, SNAPSHOTS_PER_SEQUENCE};
pub use request::{Event, FinishReason, GenerateRequest, RequestHandle, TokenLogprob, Usage};
pub use stats::EngineStats;
pub use stop::{StopMatcher, StopOutcome};
