//! The one seam between the HTTP layer and the engine.
//!
//! Routes never touch the engine directly: they build a [`GenerateRequest`], hand it to a
//! [`Backend`], and read [`Event`]s from the returned [`Generation`]. Dropping the
//! `Generation` cancels the request (it owns the engine's `RequestHandle`), which is how a
//! client that disconnects stops its work: axum drops the response future or the SSE body,
//! the `Generation` goes with it.
//!
//! The request/event types are the engine's own (`docs/engine-api.md`), re-exported; the
//! real engine implements [`Backend`] below. Tests drive the server with a scripted fake
//! backend, so no model is needed to test the HTTP layer.

use tokio::sync::mpsc::UnboundedReceiver;

pub use kestrel_engine::{
    Engine, EngineStats, Event, FinishReason, GenerateRequest, RequestHandle, SubmitError,
    TokenLogprob, Usage,
};
pub use kestrel_sampler::SamplingParams;

/// Gauges the `/metrics` route reads from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendStats {
    pub kv_blocks_used: usize,
    pub kv_blocks_cached: usize,
    pub kv_blocks_free: usize,
    pub queue_depth: usize,
    pub running: usize,
    /// Speculative decoding since start: tokens proposed, and kept after verification.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Hybrid models: kept tokens run again to restore the recurrent state after a rejection.
    pub spec_redone: u64,
    /// Model steps since start, and the time spent in the model's forward passes and in the
    /// engine's work on their logits (sampling, indexing, streaming), in nanoseconds.
    pub forward_steps: u64,
    pub forward_ns: u64,
    pub sample_ns: u64,
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

impl From<&EngineStats> for BackendStats {
    fn from(s: &EngineStats) -> Self {
        BackendStats {
            kv_blocks_used: s.blocks_used,
            kv_blocks_cached: s.blocks_cached,
            kv_blocks_free: s.blocks_free,
            queue_depth: s.queue_depth,
            running: s.running,
            spec_proposed: s.spec_proposed,
            spec_accepted: s.spec_accepted,
            spec_redone: s.spec_redone_tokens,
            forward_steps: s.forward_steps,
            forward_ns: s.forward_ns,
            sample_ns: s.sample_ns,
        }
    }
}

impl Backend for Engine {
    fn submit(&self, req: GenerateRequest) -> Result<Generation, SubmitError> {
        let mut handle = Engine::submit(self, req)?;
        // Move the receiver out; the handle stays behind as the cancel-on-drop guard.
        let (_, placeholder) = tokio::sync::mpsc::unbounded_channel();
        let events = std::mem::replace(&mut handle.events, placeholder);
        Ok(Generation::new(events, Box::new(handle)))
    }

    fn stats(&self) -> BackendStats {
        BackendStats::from(&Engine::stats(self))
    }
}
