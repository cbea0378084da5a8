//! Per-request state: a queued request ([`Pending`]) and an admitted one ([`Sequence`]), with
//! the sampling, streaming detokenization, stop strings and logprobs of its tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kestrel_sampler::Sampler;
use kestrel_tokenizer::StreamDecoder;
use tokio::sync::mpsc::UnboundedSender;

use crate::request::{Event, FinishReason, GenerateRequest, TokenLogprob, Usage};
use crate::speculative::SpecState;
use crate::stop::{StopMatcher, StopOutcome};

/// A request accepted by `submit`, waiting for admission.
pub(crate) struct Pending {
    pub req: GenerateRequest,
    pub sampler: Sampler,
    pub tx: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
}

impl Pending {
    /// Cancel flag set, or the receiver is gone.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || self.tx.is_closed()
    }

    pub fn send(&self, ev: Event) {
        // A closed receiver is handled as a cancellation at the next step.
        let _ = self.tx.send(ev);
    }
}

/// An admitted request: its tokens, its blocks, and where its computation stands.
pub(crate) struct Sequence<'t> {
    pub tx: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
    pub first_token_at: Option<Instant>,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: usize,
    /// Positions whose K/V are in `blocks` (`tokens[..computed]`).
    pub computed: usize,
    /// Block table: block i holds positions [i*block_size, (i+1)*block_size).
    pub blocks: Vec<u32>,
    /// Chain hashes of the leading full, computed blocks (all registered or found in the
    /// prefix index).
    pub hashes: Vec<u64>,
    /// Blocks reserved at admission and not handed out yet.
    pub reserved_left: usize,
    /// Recurrent-state slot (hybrid models; 0 otherwise).
    pub slot: u32,
    /// Chain hashes of the entries this sequence attached chunk-boundary snapshots to, oldest
    /// first (hybrid models; bounded by `SNAPSHOTS_PER_SEQUENCE - 1`).
    pub snapshots: std::collections::VecDeque<u64>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub logprobs: Option<usize>,
    pub sampler: Sampler,
    pub decoder: StreamDecoder<'t>,
    pub stop: StopMatcher,
    /// Speculative decoding's state (unused when speculation is off).
    pub spec: SpecState,
}

impl<'t> Sequence<'t> {
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || self.tx.is_closed()
    }

    pub fn in_prefill(&self) -> bool {
        self.computed < self.prompt_len
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn send(&self, ev: Event) {
        let _ = self.tx.send(ev);
    }

    pub fn usage(&self, now: Instant) -> Usage {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        Usage {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.generated(),
            decode_steps: self.spec.decode_steps,
            spec_proposed: self.spec.proposed,
            spec_accepted: self.spec.accepted,
            ttft_ms: self.first_token_at.map_or(0.0, |t| ms(self.submitted, t)),
            decode_ms: self.first_token_at.map_or(0.0, |t| ms(t, now)),
        }
    }

    /// Whether this sequence's next token is the plain argmax of its logits and nothing else
    /// reads them (greedy, no penalties, no log-probabilities).
    pub fn argmax_suffices(&self) -> bool {
        self.sampler.argmax_suffices() && self.logprobs.is_none()
    }

    /// Samples the next token from `logits`, streams it, and says whether the request is done.
    pub fn on_logits(&mut self, logits: &[f32], eog: &[u32]) -> Option<FinishReason> {
        let id = self.sampler.sample(logits, &self.tokens);
        self.emit(id, logits, eog)
    }

    /// Appends token `id` (chosen from `logits`), streams it, and says whether the request is
    /// done.
    pub fn emit(&mut self, id: u32, logits: &[f32], eog: &[u32]) -> Option<FinishReason> {
        let logprob = self.logprobs.map(|n| {
            let (logprob, top) = kestrel_sampler::token_logprobs(logits, id, n);
            TokenLogprob { id, logprob, top }
        });
        self.tokens.push(id);
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
        }

        let piece = self.decoder.push(id);
        let (mut text, mut finish) = match self.stop.push(&piece) {
            StopOutcome::Emit(t) => (t, None),
            StopOutcome::Stopped(t) => (t, Some(FinishReason::Stop)),
        };
        if finish.is_none() {
            if !self.ignore_eos && eog.contains(&id) {
                finish = Some(FinishReason::Stop);
            } else if self.generated() >= self.max_tokens {
                finish = Some(FinishReason::Length);
            }
            if finish.is_some() {
                // End of stream: release what the decoder and the stop matcher held back.
                let tail = self.decoder.finish();
                match self.stop.push(&tail) {
                    StopOutcome::Emit(t) => {
                        text.push_str(&t);
                        text.push_str(&self.stop.flush());
                    }
                    StopOutcome::Stopped(t) => text.push_str(&t),
                }
            }
        }
        self.send(Event::Token { id, text, logprob });
        finish
    }
}
