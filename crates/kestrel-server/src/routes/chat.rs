//! `POST /v1/chat/completions`: messages → chat template → engine → a message or a stream of
//! chunks, with Qwen-style tool calls turned into OpenAI `tool_calls`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use kestrel_tokenizer::{ChatTemplate, TemplateError, Tokenizer};

use super::{blocking, body_bytes, chat_logprob, new_id, submit, unix_now};
use crate::backend::{FinishReason, TokenLogprob, Usage};
use crate::errors::{parse_json, ApiError};
use crate::openai_types::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta, ChatLogprob, ChatLogprobs,
    ChatMessageBody, ChatRequest, FunctionBody, ToolCallBody, UsageBody, SYSTEM_FINGERPRINT,
};
use crate::sse::{self, Assembler};
use crate::tool_calls::{self, End, ParsedToolCall, Segment, ToolCallParser, ToolSpec};
use crate::validate::{self, token_budget};
use crate::AppState;

pub(super) async fn chat_completions(
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
    let req: ChatRequest = parse_json(&body)?;
    let shared = state.shared();
    validate::check_model(req.model.as_deref(), &shared.config.model_name)?;
    let plan = validate::chat(req, &shared.config.sampling_defaults)?;
    let template = shared.template.clone().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions with a raw prompt",
        )
    })?;
    let parse_tools = plan.tools.is_some();
    let tool_specs = ToolSpec::from_tools(plan.tools.as_deref().unwrap_or_default());
    let tokenizer = shared.tokenizer.clone();
    let (messages, tools) = (plan.messages, plan.tools);
    let prompt =
        blocking(move || render_prompt(&template, &tokenizer, &messages, tools.as_deref())).await?;
    let max_tokens = token_budget(
        prompt.len(),
        plan.options.max_tokens,
        plan.options.max_tokens_param,
        shared.config.ctx_size,
        shared.config.model_context,
        "messages",
    )?;
    let generation = submit(shared, prompt, max_tokens, &plan.options)?;
    let base = ChunkBase {
        id: new_id("chatcmpl-"),
        created: unix_now(),
        model: shared.config.model_name.clone(),
    };
    let tokenizer = shared.tokenizer.clone();
    let want_logprobs = plan.options.logprobs.is_some();
    if plan.options.stream {
        let id = base.id.clone();
        let assembler = ChatStream {
            base,
            parser: parse_tools.then(|| ToolCallParser::with_tools(tool_specs.clone())),
            tokenizer,
            want_logprobs,
            pending_logprobs: vec![],
            tool_calls: 0,
            include_usage: plan.options.include_usage,
            raw: (parse_tools && tracing::enabled!(tracing::Level::DEBUG)).then(String::new),
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
    if parse_tools {
        tracing::debug!(id = %base.id, raw = %out.text, "model output");
    }
    let end = parser_end(out.finish.unwrap_or(FinishReason::Stop));
    let segments = if parse_tools {
        tool_calls::parse_all_with(ToolCallParser::with_tools(tool_specs), &out.text, end)
    } else {
        vec![Segment::Content(out.text)]
    };
    let mut content = String::new();
    let mut calls = Vec::new();
    for s in segments {
        match s {
            Segment::Content(c) => content.push_str(&c),
            Segment::ToolCall(c) => calls.push(tool_call_body(c, None)),
        }
    }
    let finish = finish_reason(out.finish.unwrap_or(FinishReason::Stop), !calls.is_empty());
    let logprobs = want_logprobs.then(|| ChatLogprobs {
        content: out
            .logprobs
            .iter()
            .map(|lp| chat_logprob(&tokenizer, lp))
            .collect(),
        refusal: None,
    });
    let body = ChatCompletion {
        id: base.id,
        object: "chat.completion",
        created: base.created,
        model: base.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![ChatChoice {
            index: 0,
            message: ChatMessageBody {
                role: "assistant",
                content: (calls.is_empty() || !content.is_empty()).then_some(content),
                tool_calls: calls,
                refusal: None,
            },
            logprobs,
            finish_reason: finish,
        }],
        usage: out.usage.into(),
    };
    Ok(Json(body).into_response())
}

/// Renders the conversation with the model's template (generation prompt on) and tokenizes
/// it with special tokens added and parsed.
pub(crate) fn render_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    tools: Option<&[Value]>,
) -> Result<Vec<u32>, ApiError> {
    let text = template.apply(messages, tools, true).map_err(|e| match e {
        TemplateError::Syntax(_) => ApiError::internal(e.to_string()),
        TemplateError::Raised(m) => ApiError::invalid_param(
            "messages",
            format!("the model's chat template rejected the messages: {m}"),
        ),
        TemplateError::Render(_) | TemplateError::BadRequest(_) => {
            ApiError::invalid_param("messages", e.to_string())
        }
    })?;
    tokenizer.encode(&text, true, true).map_err(|e| {
        ApiError::invalid_param("messages", format!("tokenizing the prompt failed: {e}"))
    })
}

/// `finish_reason`: "tool_calls" when the model stopped after calling tools.
pub(crate) fn finish_reason(finish: FinishReason, had_tool_calls: bool) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled if had_tool_calls => "tool_calls",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// A reply cut by the token limit may end inside a call whose last value is truncated.
fn parser_end(finish: FinishReason) -> End {
    match finish {
        FinishReason::Length => End::Cut,
        FinishReason::Stop | FinishReason::Cancelled => End::Stopped,
    }
}

fn tool_call_body(c: ParsedToolCall, index: Option<usize>) -> ToolCallBody {
    ToolCallBody {
        index,
        id: new_id("call_"),
        kind: "function",
        function: FunctionBody {
            name: c.name,
            arguments: c.arguments,
        },
    }
}

/// What every chunk of one response shares.
#[derive(Debug, Clone)]
pub(crate) struct ChunkBase {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Builds `chat.completion.chunk`s from engine events.
pub(crate) struct ChatStream {
    pub base: ChunkBase,
    /// Present when tools were offered: model output goes through the tool-call parser.
    pub parser: Option<ToolCallParser>,
    pub tokenizer: Arc<Tokenizer>,
    pub want_logprobs: bool,
    /// Logprobs of tokens whose text is still held back; sent with the next chunk.
    pub pending_logprobs: Vec<ChatLogprob>,
    pub tool_calls: usize,
    pub include_usage: bool,
    /// The model's output as generated, kept for the debug log when tools were offered.
    pub raw: Option<String>,
}

impl ChatStream {
    fn chunk(&mut self, delta: ChatDelta, finish: Option<&'static str>) -> String {
        let logprobs = (!self.pending_logprobs.is_empty()).then(|| ChatLogprobs {
            content: std::mem::take(&mut self.pending_logprobs),
            refusal: None,
        });
        let chunk = ChatChunk {
            id: self.base.id.clone(),
            object: "chat.completion.chunk",
            created: self.base.created,
            model: self.base.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices: vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason: finish,
            }],
            usage: None,
        };
        to_json(&chunk)
    }

    fn segments(&mut self, segments: Vec<Segment>) -> Vec<String> {
        segments
            .into_iter()
            .map(|s| match s {
                Segment::Content(text) => self.chunk(
                    ChatDelta {
                        content: Some(text),
                        ..ChatDelta::default()
                    },
                    None,
                ),
                Segment::ToolCall(call) => {
                    let body = tool_call_body(call, Some(self.tool_calls));
                    self.tool_calls += 1;
                    self.chunk(
                        ChatDelta {
                            tool_calls: vec![body],
                            ..ChatDelta::default()
                        },
                        None,
                    )
                }
            })
            .collect()
    }
}

impl Assembler for ChatStream {
    fn keepalive(&mut self) -> String {
        let logprobs = std::mem::take(&mut self.pending_logprobs);
        let chunk = self.chunk(ChatDelta::default(), None);
        self.pending_logprobs = logprobs; // they belong to text still held back
        chunk
    }

    fn start(&mut self) -> Vec<String> {
        let delta = ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..ChatDelta::default()
        };
        vec![self.chunk(delta, None)]
    }

    fn token(&mut self, _id: u32, text: &str, logprob: Option<TokenLogprob>) -> Vec<String> {
        if self.want_logprobs {
            if let Some(lp) = &logprob {
                self.pending_logprobs
                    .push(chat_logprob(&self.tokenizer, lp));
            }
        }
        if let Some(raw) = &mut self.raw {
            raw.push_str(text);
        }
        let segments = match &mut self.parser {
            Some(p) => p.push(text),
            None if text.is_empty() => vec![],
            None => vec![Segment::Content(text.to_string())],
        };
        self.segments(segments)
    }

    fn done(&mut self, finish: FinishReason, usage: &Usage) -> Vec<String> {
        let rest = self
            .parser
            .as_mut()
            .map(|p| p.finish(parser_end(finish)))
            .unwrap_or_default();
        let mut out = self.segments(rest);
        let reason = finish_reason(finish, self.tool_calls > 0);
        if let Some(raw) = &self.raw {
            tracing::debug!(id = %self.base.id, calls = self.tool_calls, raw = %raw, "model output");
        }
        out.push(self.chunk(ChatDelta::default(), Some(reason)));
        if self.include_usage {
            let chunk = ChatChunk {
                id: self.base.id.clone(),
                object: "chat.completion.chunk",
                created: self.base.created,
                model: self.base.model.clone(),
                system_fingerprint: SYSTEM_FINGERPRINT,
                choices: vec![],
                usage: Some(UsageBody::from(*usage)),
            };
            out.push(to_json(&chunk));
        }
        out
    }
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| {
        ApiError::internal(format!("serializing a chunk failed: {e}")).body_json()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(parse_tools: bool, include_usage: bool, tokenizer: Arc<Tokenizer>) -> ChatStream {
        ChatStream {
            base: ChunkBase {
                id: "chatcmpl-x".into(),
                created: 7,
                model: "m".into(),
            },
            parser: parse_tools.then(ToolCallParser::new),
            tokenizer,
            want_logprobs: false,
            pending_logprobs: vec![],
            tool_calls: 0,
            include_usage,
            raw: None,
        }
    }

    fn parse(chunks: &[String]) -> Vec<Value> {
        chunks
            .iter()
            .map(|c| serde_json::from_str(c).unwrap())
            .collect()
    }

    fn tokenizer() -> Option<Arc<Tokenizer>> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny/tiny-qwen2");
        Tokenizer::from_hf_dir(dir).ok().map(Arc::new)
    }

    #[test]
    fn chunk_shapes() {
        let Some(tok) = tokenizer() else { return };
        let mut s = stream(false, true, tok);
        let first = parse(&s.start());
        assert_eq!(first[0]["object"], "chat.completion.chunk");
        assert_eq!(first[0]["id"], "chatcmpl-x");
        assert_eq!(
            first[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(first[0]["choices"][0]["finish_reason"], Value::Null);
        assert!(s.token(1, "", None).is_empty());
        let alive = parse(&[s.keepalive()]);
        assert_eq!(alive[0]["choices"][0]["delta"], json!({}));
        assert_eq!(alive[0]["choices"][0]["finish_reason"], Value::Null);
        let c = parse(&s.token(1, "Hi", None));
        assert_eq!(c[0]["choices"][0]["delta"], json!({"content": "Hi"}));
        let usage = Usage {
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: 1,
            ..Usage::default()
        };
        let end = parse(&s.done(FinishReason::Length, &usage));
        assert_eq!(end[0]["choices"][0]["delta"], json!({}));
        assert_eq!(end[0]["choices"][0]["finish_reason"], "length");
        assert_eq!(end[1]["choices"], json!([]));
        assert_eq!(
            end[1]["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                   "prompt_tokens_details": {"cached_tokens": 2}})
        );
    }

    #[test]
    fn streamed_tool_calls() {
        let Some(tok) = tokenizer() else { return };
        let mut s = stream(true, false, tok);
        s.start();
        let mut chunks = vec![];
        for piece in [
            "<tool",
            "_call>\n{\"name\": \"f\", ",
            "\"arguments\": {\"a\": 1}}\n</tool_call>",
            "\n",
        ] {
            chunks.extend(s.token(0, piece, None));
        }
        chunks.extend(s.done(FinishReason::Stop, &Usage::default()));
        let c = parse(&chunks);
        assert_eq!(c.len(), 2, "{c:?}");
        let call = &c[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            call["function"],
            json!({"name": "f", "arguments": "{\"a\":1}"})
        );
        assert_eq!(c[1]["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn finish_reasons() {
        assert_eq!(finish_reason(FinishReason::Stop, false), "stop");
        assert_eq!(finish_reason(FinishReason::Stop, true), "tool_calls");
        assert_eq!(finish_reason(FinishReason::Length, true), "length");
    }
}
