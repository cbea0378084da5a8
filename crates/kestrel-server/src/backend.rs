//! The one seam between the HTTP layer and the engine.
//!
//! Routes never touch the engine directly: they build a [`GenerateRequest`], hand it to a
//! [`Backend`], and read [`Event`]s from the returned [`Generation`]. Dropping the
//! `Generation` cancels the request (it owns the engine's `RequestHandle`), which is how a
//! client that disconnects stops its work: axum drops the response future or the SSE body,
//! the `Generation` goes with it.
//!
//! The request/event types follow `docs/engine-api.md`. They are defined here until
//! `kestrel-engine` compiles, then become re-exports of the engine's own types and
//! `impl Backend for kestrel_engine::Engine` joins this module. Tests drive the server with a
//! scripted fake backend, so no model is needed to test the HTTP layer.

use tokio::sync::mpsc::UnboundedReceiver;

pub use kestrel_sampler::SamplingParams;

/// What the server asks the engine to generate (engine contract).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: the engine cuts the text before them and finishes with `Stop`.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Top-N logprobs per generated token (`Some(0)`: only the chosen token's).
    pub logprobs: Option<usize>,
}

/// One event of a running request (engine contract).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it completed ("" while a UTF-8 character or a possible
    /// stop string is pending).
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Error {
        message: String,
    },
}

/// Log-probability of a generated token and the top alternatives (engine contract).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Why a request finished (engine contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    Cancelled,
}

/// Token counts and timings of a finished request (engine contract).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub decode_ms: f64,
}

/// The engine refused a request that can never fit (its message says what would).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SubmitError(pub String);

/// Gauges the `/metrics` route reads from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendStats {
    pub kv_blocks_used: usize,
    pub kv_blocks_cached: usize,
    pub kv_blocks_free: usize,
    pub queue_depth: usize,
    pub running: usize,
}

/// A submitted request: its event stream, and a guard whose drop cancels it.
pub struct Generation {
    pub events: UnboundedReceiver<Event>,
    /// Cancels the request when dropped (the engine's `RequestHandle`, or a test's flag).
    _cancel_on_drop: Box<dyn Send + Sync>,
}

impl Generation {
    /// Pairs an event stream with the guard that cancels the request when dropped.
    pub fn new(events: UnboundedReceiver<Event>, cancel_on_drop: Box<dyn Send + Sync>) -> Self {
        Generation {
            events,
            _cancel_on_drop: cancel_on_drop,
        }
    }
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation").finish_non_exhaustive()
    }
}

/// What the server needs from an engine.
pub trait Backend: Send + Sync + 'static {
    /// Queues a request, or refuses at once one that can never fit.
    fn submit(&self, req: GenerateRequest) -> Result<Generation, SubmitError>;
    /// Current KV-pool and scheduler gauges.
    fn stats(&self) -> BackendStats;
}
