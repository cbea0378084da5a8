//! kestrel's OpenAI-compatible HTTP server.
//!
//! A request follows one path through small modules:
//!
//! ```text
//! HTTP (axum) ─► routes/        auth (Bearer key on everything but /health), body limit,
//!                               JSON → openai_types (errors name the field: errors.rs)
//!              ─► validate.rs   OpenAI defaults, field checks, messages normalized,
//!                               tool_choice applied, token budget against the context
//!              ─► chat template + tokenizer (kestrel-tokenizer), on a blocking thread
//!              ─► backend.rs    Backend::submit → Generation (events + cancel-on-drop guard)
//!              ─► sse.rs        streamed: engine events → chunk JSON → `data:` lines, [DONE]
//!                               or collected into one response
//!                 tool_calls/   Qwen tool calls (JSON, XML, bare) → OpenAI `tool_calls`
//!                 metrics.rs    counters, TTFT / decode histograms, engine gauges
//! ```
//!
//! The engine sits behind the [`Backend`] trait so the HTTP layer can be tested without a
//! model. Client disconnects cancel work by ownership: the response future (non-streamed) or
//! the SSE body (streamed) owns the [`Generation`], and dropping it drops the engine's
//! request handle. Client mistakes are always 4xx with an OpenAI-style error object; the
//! server never unwraps on a request path.
//!
//! Sampling defaults are OpenAI's, not llama.cpp's: temperature 1, top_p 1, top_k and min_p
//! off, unless the request says otherwise (`top_k`, `min_p`, `repeat_penalty` and
//! `ignore_eos` are accepted as extensions).

pub mod backend;
pub mod errors;
pub mod metrics;
pub mod openai_types;
pub mod routes;
pub mod sse;
pub mod tool_calls;
pub mod validate;

use std::sync::Arc;

use kestrel_tokenizer::{ChatTemplate, TemplateError, Tokenizer};

pub use backend::{
    Backend, BackendStats, Event, FinishReason, GenerateRequest, Generation, SubmitError,
    TokenLogprob, Usage,
};
pub use errors::ApiError;
pub use routes::router;

/// Default limit on request bodies (413 above it).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Server settings, built once by the front end (`kestrel serve`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests must use (a request may also omit `model`).
    pub model_name: String,
    /// When set, every route but `/health` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Tokens of one request (prompt + generated), as the engine's `EngineConfig::ctx_size`.
    pub ctx_size: usize,
    /// The model's own context length (trained maximum): `max_tokens` up to it is accepted.
    pub model_context: usize,
    /// Sampling for what a request leaves out (OpenAI's defaults unless the operator chose).
    pub sampling_defaults: kestrel_sampler::SamplingParams,
    /// Longest silence on a stream before a keep-alive chunk (default [`sse::KEEPALIVE`]).
    pub keepalive: std::time::Duration,
    /// Largest request body accepted (default [`DEFAULT_MAX_BODY_BYTES`], 8 MiB).
    pub max_body_bytes: usize,
}

impl ServerConfig {
    /// No API key, 8 MiB body limit, the model's context taken to be `ctx_size`.
    pub fn new(model_name: impl Into<String>, ctx_size: usize) -> Self {
        ServerConfig {
            model_name: model_name.into(),
            api_key: None,
            ctx_size,
            model_context: ctx_size,
            sampling_defaults: validate::openai_sampling_defaults(),
            keepalive: sse::KEEPALIVE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Failure to set the server up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the model's chat template does not compile: {0}")]
    Template(#[from] TemplateError),
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Everything a route needs, shared by all requests.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

pub(crate) struct Shared {
    pub config: ServerConfig,
    pub backend: Arc<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    /// `None`: the model has no chat template (chat requests get a 400 saying so).
    pub template: Option<Arc<ChatTemplate>>,
    pub metrics: Arc<metrics::Metrics>,
    pub created: u64,
}

impl AppState {
    /// Compiles the model's chat template once; fails if it does not compile.
    pub fn new(
        config: ServerConfig,
        backend: Arc<dyn Backend>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<AppState, ServerError> {
        let template = tokenizer.chat_template()?.map(Arc::new);
        Ok(Self::with_template(config, backend, tokenizer, template))
    }

    /// Uses `template` instead of the tokenizer's own (tests, `--chat-template` overrides).
    pub fn with_template(
        config: ServerConfig,
        backend: Arc<dyn Backend>,
        tokenizer: Arc<Tokenizer>,
        template: Option<Arc<ChatTemplate>>,
    ) -> AppState {
        AppState {
            inner: Arc::new(Shared {
                config,
                backend,
                tokenizer,
                template,
                metrics: Arc::new(metrics::Metrics::default()),
                created: routes::unix_now(),
            }),
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner
    }
}

/// Serves until the listener fails. Bind the listener yourself (tests: `127.0.0.1:0`).
pub async fn serve(state: AppState, listener: tokio::net::TcpListener) -> Result<(), ServerError> {
    serve_with_shutdown(state, listener, std::future::pending()).await
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve_with_shutdown(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, model = %state.config().model_name, "kestrel server listening");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
