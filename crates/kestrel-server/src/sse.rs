//! Server-sent events: the engine's event stream turned into `data: {chunk}` lines.
//!
//! A route supplies an [`Assembler`] that turns engine events into chunk JSON (chat or text
//! completion shapes); [`event_stream`] drives it and frames the result:
//!
//! ```text
//! data: {first chunk}\n\n ... data: {last chunk}\n\n data: [DONE]\n\n
//! ```
//!
//! While nothing else goes out (a long prompt's prefill, a wait in the queue), a keep-alive
//! chunk with no text goes out every few seconds ([`KEEPALIVE`] by default): agent clients abandon a stream that is
//! silent for a few minutes (Qwen Code: 240 s), and SSE comments do not count for them.
//!
//! The stream owns the [`Generation`], so when hyper drops the body (the client went away) the
//! request is cancelled. An engine error after the headers went out becomes one
//! `data: {"error": {...}}` event, which the OpenAI SDKs raise as an API error.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use crate::backend::{Event, FinishReason, Generation, TokenLogprob, Usage};
use crate::errors::ApiError;
use crate::metrics::Metrics;

/// Turns engine events into the JSON of stream chunks.
pub trait Assembler: Send + 'static {
    /// Chunks sent before any token (the chat role chunk).
    fn start(&mut self) -> Vec<String>;
    /// Chunks for one generated token (often none while text is held back).
    fn token(&mut self, id: u32, text: &str, logprob: Option<TokenLogprob>) -> Vec<String>;
    /// Closing chunks: the finish reason, and usage if asked for.
    fn done(&mut self, finish: FinishReason, usage: &Usage) -> Vec<String>;
    /// A chunk that adds nothing (no text, no finish), sent to show the stream is alive.
    fn keepalive(&mut self) -> String;
}

/// Longest silence on a stream before a keep-alive chunk (the server's default).
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// One SSE event carrying `data`.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// The stream's last event.
pub const DONE: &str = "[DONE]";

struct Driver<A: Assembler> {
    generation: Generation,
    assembler: A,
    metrics: Arc<Metrics>,
    queue: VecDeque<Bytes>,
    finished: bool,
    /// The response id (logged with the request's figures).
    id: String,
    started: Instant,
    keepalive: Duration,
}

impl<A: Assembler> Driver<A> {
    /// Waits for the next engine event and queues the frames it produces; a keep-alive chunk
    /// if none comes within `keepalive`.
    async fn step(&mut self) {
        let event = match tokio::time::timeout(self.keepalive, self.generation.events.recv()).await
        {
            Ok(event) => event,
            Err(_) => {
                let chunk = self.assembler.keepalive();
                self.queue.push_back(frame(&chunk));
                return;
            }
        };
        match event {
            Some(Event::Token { id, text, logprob }) => {
                for chunk in self.assembler.token(id, &text, logprob) {
                    self.queue.push_back(frame(&chunk));
                }
            }
            Some(Event::Done { finish, usage }) => {
                self.metrics.record_finished(&self.id, &usage, finish);
                for chunk in self.assembler.done(finish, &usage) {
                    self.queue.push_back(frame(&chunk));
                }
                self.queue.push_back(frame(DONE));
                self.finished = true;
            }
            Some(Event::Error { message }) => self.fail(message),
            None => self.fail("the engine dropped the request".to_string()),
        }
    }

    fn fail(&mut self, message: String) {
        let err = ApiError::internal(format!("generation failed: {message}"));
        tracing::error!(%message, "generation failed mid-stream");
        self.queue.push_back(frame(&err.body_json()));
        self.finished = true;
    }
}

impl<A: Assembler> Drop for Driver<A> {
    fn drop(&mut self) {
        if !self.finished {
            self.metrics
                .record_cancelled(&self.id, self.started.elapsed());
        }
    }
}

/// The SSE response for a submitted generation; `id` is the response's id.
pub fn event_stream<A: Assembler>(
    generation: Generation,
    mut assembler: A,
    metrics: Arc<Metrics>,
    id: String,
    keepalive: Duration,
) -> Response {
    let queue: VecDeque<Bytes> = assembler.start().iter().map(|c| frame(c)).collect();
    let driver = Driver {
        generation,
        assembler,
        metrics,
        queue,
        finished: false,
        id,
        started: Instant::now(),
        keepalive,
    };
    let body = stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(bytes) = d.queue.pop_front() {
                return Some((Ok::<_, Infallible>(bytes), d));
            }
            if d.finished {
                return None;
            }
            d.step().await;
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Everything a non-streamed request produced.
#[derive(Debug, Default)]
pub struct Collected {
    pub ids: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
}

/// Counts a non-streamed generation as cancelled if its future is dropped early.
struct CancelCounter {
    metrics: Arc<Metrics>,
    armed: bool,
    id: String,
    started: Instant,
}

impl Drop for CancelCounter {
    fn drop(&mut self) {
        if self.armed {
            self.metrics
                .record_cancelled(&self.id, self.started.elapsed());
        }
    }
}

/// Runs a generation to its end (non-streamed responses). If the client disconnects, axum
/// drops this future and with it the `Generation`, which cancels the request.
pub async fn collect(
    mut generation: Generation,
    metrics: Arc<Metrics>,
    id: &str,
) -> Result<Collected, ApiError> {
    let mut guard = CancelCounter {
        metrics: metrics.clone(),
        armed: true,
        id: id.to_string(),
        started: Instant::now(),
    };
    let mut out = Collected::default();
    loop {
        match generation.events.recv().await {
            Some(Event::Token { id, text, logprob }) => {
                out.ids.push(id);
                out.text.push_str(&text);
                out.logprobs.extend(logprob);
            }
            Some(Event::Done { finish, usage }) => {
                guard.armed = false;
                metrics.record_finished(id, &usage, finish);
                out.finish = Some(finish);
                out.usage = usage;
                return Ok(out);
            }
            Some(Event::Error { message }) => {
                guard.armed = false;
                return Err(ApiError::internal(format!("generation failed: {message}")));
            }
            None => {
                guard.armed = false;
                return Err(ApiError::internal("the engine dropped the request"));
            }
        }
    }
}
