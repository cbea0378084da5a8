//! `POST /v1/completions`: a raw prompt (text or token ids) → engine → text, streamed or not.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use kestrel_tokenizer::Tokenizer;

use super::chat::{finish_reason, to_json, ChunkBase};
use super::{blocking, body_bytes, check_ids, new_id, submit, token_text, unix_now};
use crate::backend::{FinishReason, TokenLogprob, Usage};
use crate::errors::{parse_json, ApiError};
use crate::openai_types::{
    Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, UsageBody,
    SYSTEM_FINGERPRINT,
};
use crate::sse::{self, Assembler};
use crate::validate::{self, token_budget, PromptInput};
use crate::AppState;

pub(super) async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: CompletionRequest = parse_json(&body)?;
    let shared = state.shared();
    validate::check_model(req.model.as_deref(), &shared.config.model_name)?;
    let plan = validate::completion(req, &shared.config.sampling_defaults)?;
    let tokenizer = shared.tokenizer.clone();
    let prompt = match plan.prompt {
        PromptInput::Ids(ids) => {
            check_ids(&tokenizer, &ids, "prompt")?;
            ids
        }
        PromptInput::Text(text) => {
            let tok = tokenizer.clone();
            blocking(move || {
                tok.encode(&text, true, true).map_err(|e| {
                    ApiError::invalid_param("prompt", format!("tokenizing the prompt failed: {e}"))
                })
            })
            .await?
        }
    };
    let max_tokens = token_budget(
        prompt.len(),
        plan.options.max_tokens,
        plan.options.max_tokens_param,
        shared.config.ctx_size,
        shared.config.model_context,
        "prompt",
    )?;
    let generation = submit(shared, prompt, max_tokens, &plan.options)?;
    let base = ChunkBase {
        id: new_id("cmpl-"),
        created: unix_now(),
        model: shared.config.model_name.clone(),
    };
    let want_logprobs = plan.options.logprobs.is_some();
    if plan.options.stream {
        let id = base.id.clone();
        let assembler = TextStream {
            base,
            tokenizer,
            want_logprobs,
            include_usage: plan.options.include_usage,
            offset: 0,
        };
        return Ok(sse::event_stream(
            generation,
            assembler,
            shared.metrics.clone(),
            id,
            shared.config.keepalive,
        ));
    }
    let out = sse::collect(generation, shared.metrics.clone(), &base.id).await?;
    let logprobs = want_logprobs.then(|| {
        let mut lp = CompletionLogprobs::default();
        let mut offset = 0;
        for t in &out.logprobs {
            offset = push_logprob(&mut lp, &tokenizer, t, offset);
        }
        lp
    });
    let body = Completion {
        id: base.id,
        object: "text_completion",
        created: base.created,
        model: base.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![CompletionChoice {
            index: 0,
            text: out.text,
            logprobs,
            finish_reason: Some(finish_reason(
                out.finish.unwrap_or(FinishReason::Stop),
                false,
            )),
        }],
        usage: Some(out.usage.into()),
    };
    Ok(Json(body).into_response())
}

/// Appends one token to legacy logprobs; returns the text offset after it.
fn push_logprob(
    lp: &mut CompletionLogprobs,
    tokenizer: &Tokenizer,
    t: &TokenLogprob,
    offset: usize,
) -> usize {
    let (token, _) = token_text(tokenizer, t.id);
    let next = offset + token.len();
    lp.text_offset.push(offset);
    lp.tokens.push(token);
    lp.token_logprobs.push(t.logprob);
    let mut top = Map::new();
    for &(id, logprob) in &t.top {
        top.insert(token_text(tokenizer, id).0, Value::from(logprob));
    }
    lp.top_logprobs.push(top);
    next
}

/// Builds `text_completion` stream chunks from engine events.
struct TextStream {
    base: ChunkBase,
    tokenizer: Arc<Tokenizer>,
    want_logprobs: bool,
    include_usage: bool,
    offset: usize,
}

impl TextStream {
    fn chunk(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> String {
        to_json(&Completion {
            id: self.base.id.clone(),
            object: "text_completion",
            created: self.base.created,
            model: self.base.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs,
                finish_reason: finish,
            }],
            usage: None,
        })
    }
}

impl Assembler for TextStream {
    fn start(&mut self) -> Vec<String> {
        vec![]
    }

    fn keepalive(&mut self) -> String {
        self.chunk(String::new(), None, None)
    }

    fn token(&mut self, _id: u32, text: &str, logprob: Option<TokenLogprob>) -> Vec<String> {
        let logprobs = match (&logprob, self.want_logprobs) {
            (Some(t), true) => {
                let mut lp = CompletionLogprobs::default();
                self.offset = push_logprob(&mut lp, &self.tokenizer, t, self.offset);
                Some(lp)
            }
            _ => None,
        };
        if text.is_empty() && logprobs.is_none() {
            return vec![];
        }
        vec![self.chunk(text.to_string(), logprobs, None)]
    }

    fn done(&mut self, finish: FinishReason, usage: &Usage) -> Vec<String> {
        let mut out = vec![self.chunk(String::new(), None, Some(finish_reason(finish, false)))];
        if self.include_usage {
            out.push(to_json(&Completion {
                id: self.base.id.clone(),
                object: "text_completion",
                created: self.base.created,
                model: self.base.model.clone(),
                system_fingerprint: SYSTEM_FINGERPRINT,
                choices: vec![],
                usage: Some(UsageBody::from(*usage)),
            }));
        }
        out
    }
}
