//! What front ends send and receive: requests, events, the handle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

/// One generation request: prompt token ids in, streamed tokens out.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: kestrel_sampler::SamplingParams,
    /// Stop strings: generation stops at the first one and the text is cut before it.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Top-N logprobs per generated token.
    pub logprobs: Option<usize>,
}

/// What a request streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One generated token and the text it completed (may be "" while a UTF-8 char or a
    /// possible stop string is pending). The end-of-generation token that ends a request is
    /// sent too (with the text still held back, if any).
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The last event of a request that ran (or was cancelled).
    Done { finish: FinishReason, usage: Usage },
    /// The last event of a request that failed (model error); its blocks were released.
    Error { message: String },
}

/// The chosen token's log-probability and the top-N alternatives, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    Cancelled,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache (not computed).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Forward steps that produced the tokens after the first (`completion_tokens - 1`
    /// without speculation; fewer when proposed tokens were accepted).
    pub decode_steps: usize,
    /// Speculative decoding: tokens proposed for this request, and how many were kept.
    pub spec_proposed: usize,
    pub spec_accepted: usize,
    /// Submit to first generated token.
    pub ttft_ms: f64,
    /// First generated token to the end.
    pub decode_ms: f64,
}

/// A submitted request. Dropping the handle (or calling [`RequestHandle::cancel`]) cancels the
/// request; the engine stops its work within one step. Dropping `events` alone is seen as a
/// cancellation too.
#[derive(Debug)]
pub struct RequestHandle {
    /// Engine-wide request id (for logs).
    pub id: u64,
    /// The request's events; `blocking_recv()` in sync code. Ends with `Done` or `Error`.
    pub events: UnboundedReceiver<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl RequestHandle {
    /// Asks the engine to stop this request; a `Done { finish: Cancelled }` follows unless it
    /// had already finished.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Whether cancellation was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}
