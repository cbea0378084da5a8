//! The HTTP surface: the router, its middleware (API key, request counting, body limit), and
//! helpers shared by the route handlers.

mod chat;
mod completions;
mod misc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use kestrel_tokenizer::Tokenizer;

use crate::backend::{GenerateRequest, Generation, SubmitError, TokenLogprob};
use crate::errors::ApiError;
use crate::openai_types::{ChatLogprob, TopLogprob};
use crate::validate::GenOptions;
use crate::{AppState, Shared};

/// The whole API. `/health` is always open; with an API key every other route needs it.
pub fn router(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(misc::models))
        .route("/v1/models/{id}", get(misc::model))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/metrics", get(misc::metrics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .merge(protected)
        .route("/health", get(misc::health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::bad_request(format!(
            "{} is not allowed on {}",
            req.method(),
            req.uri().path()
        ))
    }
}

/// `Authorization: Bearer <key>` when the server has a key.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.config().api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    match given {
        None => {
            ApiError::unauthorized("missing API key: send the header `Authorization: Bearer <key>`")
                .into_response()
        }
        Some(g) if !constant_time_eq(g.trim().as_bytes(), key.as_bytes()) => {
            ApiError::unauthorized("incorrect API key").into_response()
        }
        Some(_) => next.run(req).await,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every response by matched route and status for `/metrics`.
async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(req).await;
    state
        .shared()
        .metrics
        .record_http(&route, response.status().as_u16());
    response
}

/// The request body, or the error for a body that could not be read (413 over the limit).
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|r| ApiError::from_body_rejection(r, state.config().max_body_bytes))
}

/// Submits to the engine; a refusal (the request can never fit) is the client's 400.
pub(crate) fn submit(
    shared: &Shared,
    prompt: Vec<u32>,
    max_tokens: usize,
    options: &GenOptions,
) -> Result<Generation, ApiError> {
    let req = GenerateRequest {
        prompt,
        max_tokens,
        sampling: options.sampling.clone(),
        stop: options.stop.clone(),
        ignore_eos: options.ignore_eos,
        logprobs: options.logprobs,
    };
    shared.backend.submit(req).map_err(submit_error)
}

/// The engine's refusals: the request can never fit (400), or the engine is gone (503).
pub(crate) fn submit_error(e: SubmitError) -> ApiError {
    let message = format!("the request cannot be served: {e}");
    match &e {
        SubmitError::ContextExceeded { .. } | SubmitError::PoolTooSmall { .. } => {
            ApiError::invalid_param("max_tokens", message).with_code("context_length_exceeded")
        }
        SubmitError::EmptyPrompt | SubmitError::TokenOutOfRange { .. } => {
            ApiError::invalid_param("prompt", message)
        }
        SubmitError::ZeroMaxTokens => ApiError::invalid_param("max_tokens", message),
        SubmitError::Sampling(kestrel_sampler::SamplerError::InvalidParam { param, .. }) => {
            ApiError::invalid_param(*param, message)
        }
        SubmitError::ShutDown => ApiError {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            ..ApiError::bad_request(message)
        },
    }
}

/// Runs CPU-heavy request preparation (template, tokenizer) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

/// Checks that prompt token ids are in the vocabulary.
pub(crate) fn check_ids(tokenizer: &Tokenizer, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = tokenizer.vocab_size();
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(ApiError::invalid_param(
            param,
            format!("token id {id} is outside the vocabulary (size {vocab})"),
        )),
        None => Ok(()),
    }
}

/// A token's text and bytes as logprobs report them.
pub(crate) fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer
        .token_bytes(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat `logprobs.content[i]`.
pub(crate) fn chat_logprob(tokenizer: &Tokenizer, lp: &TokenLogprob) -> ChatLogprob {
    let (token, bytes) = token_text(tokenizer, lp.id);
    let top_logprobs = lp
        .top
        .iter()
        .map(|&(id, logprob)| {
            let (token, bytes) = token_text(tokenizer, id);
            TopLogprob {
                token,
                logprob,
                bytes,
            }
        })
        .collect();
    ChatLogprob {
        token,
        logprob: lp.logprob,
        bytes,
        top_logprobs,
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A unique-enough id: `prefix` + 24 hex digits (a counter mixed with the clock).
pub(crate) fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let a = splitmix64(nanos ^ n.rotate_left(32));
    let b = splitmix64(a ^ n);
    format!("{prefix}{a:016x}{:08x}", b as u32)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_prefixed() {
        let a = new_id("call_");
        let b = new_id("call_");
        assert!(a.starts_with("call_") && a.len() == 5 + 24, "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn key_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
