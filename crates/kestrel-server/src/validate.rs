//! Request validation: OpenAI request bodies → what the engine runs.
//!
//! Where the request is silent, the server's sampling defaults apply: OpenAI's unless the
//! operator set others (`kestrel serve --temp ...`): temperature 1, top_p 1, and the llama.cpp
//! extensions off (top_k 0, min_p 0, repeat_penalty 1), so an OpenAI client gets OpenAI
//! semantics rather than llama.cpp's. Every rejection names the field at fault.

use serde_json::Value;

use kestrel_sampler::{SamplerError, SamplingParams};

use crate::errors::ApiError;
use crate::openai_types::{ChatRequest, CommonFields, CompletionRequest};

/// Most alternatives `top_logprobs` / legacy `logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// How many recent tokens presence / frequency penalties look at (llama.cpp's default).
pub const PENALTY_WINDOW: i32 = 64;

/// OpenAI's sampling defaults (the server's unless the operator sets others).
pub fn openai_sampling_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: PENALTY_WINDOW,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: None,
    }
}

/// Generation options shared by chat and text completions.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOptions {
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// `max_completion_tokens` or `max_tokens`; `None`: whatever the context leaves.
    pub max_tokens: Option<u32>,
    /// The field `max_tokens` came in, for errors that blame it.
    pub max_tokens_param: &'static str,
    pub ignore_eos: bool,
    /// Top-N alternatives per token; `None` = no logprobs.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
}

/// How the chat route should treat tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPlan {
    /// Messages normalized for the template (text content, `developer` → `system`).
    pub messages: Vec<Value>,
    /// Tools given to the template (`None` when absent or `tool_choice: "none"`).
    pub tools: Option<Vec<Value>>,
    pub options: GenOptions,
}

/// A text completion's prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionPlan {
    pub prompt: PromptInput,
    pub options: GenOptions,
}

/// The served model must be the one asked for (a missing `model` means the served one).
pub fn check_model(requested: Option<&str>, served: &str) -> Result<(), ApiError> {
    match requested {
        Some(m) if m != served => Err(ApiError::model_not_found(m, served)),
        _ => Ok(()),
    }
}

pub fn chat(req: ChatRequest, defaults: &SamplingParams) -> Result<ChatPlan, ApiError> {
    if req.functions.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported("functions", "use `tools` instead"));
    }
    if req.function_call.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported(
            "function_call",
            "use `tool_choice` instead",
        ));
    }
    if req.audio.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported(
            "audio",
            "kestrel generates text only",
        ));
    }
    if let Some(m) = req.modalities.as_ref().and_then(Value::as_array) {
        if m.iter().any(|x| x.as_str() != Some("text")) {
            return Err(ApiError::unsupported(
                "modalities",
                "kestrel generates text only",
            ));
        }
    }
    check_response_format(req.response_format.as_ref())?;
    let top = match (req.logprobs, req.top_logprobs) {
        (Some(true), k) => Some(check_top_logprobs("top_logprobs", k.unwrap_or(0))?),
        (_, Some(_)) => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            ))
        }
        _ => None,
    };
    let max = req.max_completion_tokens.or(req.max_tokens);
    let param = if req.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let options = common(&req.common(), defaults, max, param, top)?;

    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    let messages = normalize_messages(&req.messages)?;
    let tools = tools_for_template(req.tools, req.tool_choice.as_ref())?;
    Ok(ChatPlan {
        messages,
        tools,
        options,
    })
}

pub fn completion(
    req: CompletionRequest,
    defaults: &SamplingParams,
) -> Result<CompletionPlan, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::unsupported(
            "echo",
            "the prompt is not echoed back",
        ));
    }
    if req.best_of.is_some_and(|b| b > 1) {
        return Err(ApiError::unsupported(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "fill-in-the-middle is not implemented",
        ));
    }
    let top = match req.logprobs {
        Some(k) => Some(check_top_logprobs("logprobs", k)?),
        None => None,
    };
    let options = common(&req.common(), defaults, req.max_tokens, "max_tokens", top)?;
    let prompt = prompt_input(&req.prompt)?;
    Ok(CompletionPlan { prompt, options })
}

fn check_top_logprobs(param: &str, k: u32) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` = {k} is too large; at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    Ok(k as usize)
}

fn check_response_format(v: Option<&Value>) -> Result<(), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(()),
        Some(t @ ("json_object" | "json_schema")) => Err(ApiError::unsupported(
            "response_format",
            &format!("`{t}` (constrained JSON output) is not implemented; only `text`"),
        )),
        _ => Err(ApiError::invalid_param(
            "response_format",
            "`response_format` must be an object with `type` \"text\"",
        )),
    }
}

fn common(
    c: &CommonFields,
    d: &SamplingParams,
    max_tokens: Option<u32>,
    max_param: &'static str,
    logprobs: Option<usize>,
) -> Result<GenOptions, ApiError> {
    match c.n {
        Some(0) => return Err(ApiError::invalid_param("n", "`n` must be at least 1")),
        Some(n) if n > 1 => {
            return Err(ApiError::unsupported(
                "n",
                &format!("only n = 1 is supported (got {n}); send {n} requests instead"),
            ))
        }
        _ => {}
    }
    match &c.logit_bias {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "logit_bias",
                "logit bias is not implemented",
            ))
        }
    }
    if max_tokens == Some(0) {
        return Err(ApiError::invalid_param(
            max_param,
            format!("`{max_param}` must be at least 1"),
        ));
    }
    let seed = match &c.seed {
        None => None,
        Some(n) => Some(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => {
                return Err(ApiError::invalid_param(
                    "seed",
                    format!("`seed` must be an integer, got {n}"),
                ))
            }
        }),
    };
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(d.temperature),
        top_p: c.top_p.unwrap_or(d.top_p),
        top_k: c.top_k.unwrap_or(d.top_k),
        min_p: c.min_p.unwrap_or(d.min_p),
        repeat_penalty: c.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: PENALTY_WINDOW,
        presence_penalty: c.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: c.frequency_penalty.unwrap_or(d.frequency_penalty),
        seed,
    };
    sampling.validate().map_err(|e| match &e {
        SamplerError::InvalidParam { param, .. } => ApiError::invalid_param(*param, e.to_string()),
    })?;
    let stream = c.stream.unwrap_or(false);
    Ok(GenOptions {
        sampling,
        stop: stop_strings(c.stop.as_ref())?,
        max_tokens,
        max_tokens_param: max_param,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        logprobs,
        stream,
        include_usage: stream && c.stream_options.is_some_and(|o| o.include_usage),
    })
}

fn stop_strings(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |msg: &str| ApiError::invalid_param("stop", msg.to_string());
    let stops: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("`stop` must be a string or an array of strings"))?,
        Some(_) => return Err(bad("`stop` must be a string or an array of strings")),
    };
    if stops.iter().any(String::is_empty) {
        return Err(bad("stop strings must not be empty"));
    }
    if stops.len() > MAX_STOP_STRINGS {
        return Err(bad(&format!(
            "at most {MAX_STOP_STRINGS} stop strings are allowed"
        )));
    }
    Ok(stops)
}

/// Checks one message and rewrites it into what chat templates expect: `content` a string
/// (text parts joined), `developer` as `system`, null content of tool-calling turns as "".
/// OpenAI messages as the chat template takes them: text content (parts joined), `developer`
/// as `system`, content "" on an assistant message that only calls tools. `kestrel template`
/// renders through this too, so it shows exactly the server's prompt.
pub fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| normalize_message(i, m))
        .collect()
}

fn normalize_message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let at = |field: &str| format!("messages[{i}]{field}");
    let obj = m.as_object().ok_or_else(|| {
        ApiError::invalid_param(at(""), format!("`messages[{i}]` must be an object"))
    })?;
    let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid_param(
            at(".role"),
            format!("`messages[{i}].role` must be a string"),
        )
    })?;
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        "developer" => "system",
        "function" => {
            return Err(ApiError::unsupported(
                &at(".role"),
                "legacy `function` messages are not accepted; use `tool` messages",
            ))
        }
        other => {
            return Err(ApiError::invalid_param(
                at(".role"),
                format!(
                    "unknown role `{other}` in `messages[{i}]`; expected system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let content = content_text(obj.get("content"), &at(".content"))?;
    let mut out = obj.clone();
    out.insert("role".into(), Value::String(role.into()));
    let has_tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => {
            out.remove("tool_calls");
            false
        }
        Some(Value::Array(calls)) if role == "assistant" => {
            for (j, c) in calls.iter().enumerate() {
                check_tool_call(c, &format!("messages[{i}].tool_calls[{j}]"))?;
            }
            !calls.is_empty()
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                at(".tool_calls"),
                "`tool_calls` must be an array, and only on assistant messages",
            ))
        }
    };
    match content {
        Some(text) => {
            out.insert("content".into(), Value::String(text));
        }
        None if role == "assistant" && has_tool_calls => {
            out.insert("content".into(), Value::String(String::new()));
        }
        None => {
            return Err(ApiError::invalid_param(
                at(".content"),
                format!("`messages[{i}].content` is required for a {role} message"),
            ))
        }
    }
    Ok(Value::Object(out))
}

fn content_text(v: Option<&Value>, param: &str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (k, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text").and_then(Value::as_str) {
                        Some(t) => texts.push(t),
                        None => {
                            return Err(ApiError::invalid_param(
                                format!("{param}[{k}].text"),
                                format!("`{param}[{k}].text` must be a string"),
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::unsupported(
                            &format!("{param}[{k}]"),
                            &format!("content parts of type `{other}` are not accepted; kestrel serves text-only models"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{k}]"),
                            format!("`{param}[{k}]` must be an object with a `type`"),
                        ))
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
        Some(_) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be a string or an array of content parts"),
        )),
    }
}

fn check_tool_call(c: &Value, param: &str) -> Result<(), ApiError> {
    let f = c.get("function");
    let name_ok = f
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .is_some();
    let args_ok = matches!(
        f.and_then(|f| f.get("arguments")),
        None | Some(Value::String(_)) | Some(Value::Object(_))
    );
    if name_ok && args_ok {
        Ok(())
    } else {
        Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be {{\"type\": \"function\", \"function\": {{\"name\": string, \"arguments\": string}}}}"),
        ))
    }
}

fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}

/// Validates `tools` and applies `tool_choice`: "none" hides the tools from the template, a
/// named function keeps only that tool, "auto" / "required" keep them all (kestrel does not
/// constrain decoding, so "required" is a request to the model, not a guarantee).
fn tools_for_template(
    tools: Option<Vec<Value>>,
    choice: Option<&Value>,
) -> Result<Option<Vec<Value>>, ApiError> {
    let tools = tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        if kind != Some("function") || tool_name(t).is_none() {
            return Err(ApiError::invalid_param(
                format!("tools[{i}]"),
                format!("`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{\"name\": string, ...}}}}"),
            ));
        }
    }
    let need_tools = |what: &str| {
        ApiError::invalid_param(
            "tool_choice",
            format!("`tool_choice` {what} requires `tools`"),
        )
    };
    let kept = match choice {
        None | Some(Value::Null) => tools,
        Some(Value::String(s)) => match s.as_str() {
            "none" => vec![],
            "auto" => tools,
            "required" if tools.is_empty() => return Err(need_tools("\"required\"")),
            "required" => tools,
            other => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("unknown `tool_choice` \"{other}\"; expected none, auto, required or a function"),
                ))
            }
        },
        Some(obj @ Value::Object(_)) => {
            let name = tool_name(obj).ok_or_else(|| {
                ApiError::invalid_param(
                    "tool_choice",
                    "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": string}}",
                )
            })?;
            if tools.is_empty() {
                return Err(need_tools("naming a function"));
            }
            let kept: Vec<Value> = tools.into_iter().filter(|t| tool_name(t) == Some(name)).collect();
            if kept.is_empty() {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            kept
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "`tool_choice` must be a string or an object",
            ))
        }
    };
    Ok((!kept.is_empty()).then_some(kept))
}

fn prompt_input(v: &Value) -> Result<PromptInput, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, an array of token ids, or a one-element array of either",
        )
    };
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|x| x.as_u64().and_then(|u| u32::try_from(u).ok()))
            .collect()
    };
    match v {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(a) if a.is_empty() => {
            Err(ApiError::invalid_param("prompt", "`prompt` is empty"))
        }
        Value::Array(a) if a.iter().all(Value::is_number) => {
            ids(a).map(PromptInput::Ids).ok_or_else(|| {
                ApiError::invalid_param(
                    "prompt",
                    "token ids in `prompt` must be integers in [0, 2^32)",
                )
            })
        }
        Value::Array(a) if a.len() > 1 => Err(ApiError::unsupported(
            "prompt",
            "one prompt per request (batched prompts would need n > 1)",
        )),
        Value::Array(a) => match &a[0] {
            Value::String(s) => Ok(PromptInput::Text(s.clone())),
            Value::Array(inner) if !inner.is_empty() => {
                ids(inner).map(PromptInput::Ids).ok_or_else(bad)
            }
            _ => Err(bad()),
        },
        Value::Null => Err(ApiError::invalid_param("prompt", "`prompt` is required")),
        _ => Err(bad()),
    }
}

/// The number of tokens to generate.
///
/// `max_tokens` may be anything up to the model's context length (`model_ctx`, or the serving
/// context if that is larger): agent clients ask for the whole context and expect generation to
/// run until it is full, as llama-server and Ollama do. What the serving context leaves after
/// the prompt caps it; the response then ends with `finish_reason: "length"`. A value above the
/// model's context is the client's error and names the field it came in (`max_param`).
/// `prompt_param` names the field to blame for a prompt that leaves no room.
pub fn token_budget(
    prompt_len: usize,
    max_tokens: Option<u32>,
    max_param: &str,
    ctx_size: usize,
    model_ctx: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    if prompt_len == 0 {
        return Err(ApiError::invalid_param(prompt_param, "the prompt is empty"));
    }
    if prompt_len >= ctx_size {
        return Err(ApiError::invalid_param(
            prompt_param,
            format!(
                "the prompt is {prompt_len} tokens but the context holds {ctx_size} (prompt plus at least one generated token); shorten the prompt"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = ctx_size - prompt_len;
    let limit = model_ctx.max(ctx_size);
    match max_tokens {
        None => Ok(room),
        Some(m) if m as usize <= limit => Ok(room.min(m as usize)),
        Some(m) => Err(ApiError::invalid_param(
            max_param,
            format!(
                "`{max_param}` = {m} exceeds the model's {limit}-token context; with this {prompt_len}-token prompt at most {room} tokens can be generated (up to {limit} is accepted and stops where the context is full)"
            ),
        )
        .with_code("context_length_exceeded")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::parse_json;
    use serde_json::json;

    fn chat_req(v: Value) -> Result<ChatPlan, ApiError> {
        chat(
            parse_json::<ChatRequest>(v.to_string().as_bytes())?,
            &openai_sampling_defaults(),
        )
    }

    fn user() -> Value {
        json!([{"role": "user", "content": "hi"}])
    }

    #[test]
    fn openai_defaults() {
        let p = chat_req(json!({"model": "m", "messages": user()})).unwrap();
        let s = &p.options.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p),
            (1.0, 1.0, 0, 0.0)
        );
        assert_eq!(s.repeat_penalty, 1.0);
        assert_eq!(s.seed, None);
        assert_eq!(p.options.max_tokens, None);
        assert!(!p.options.stream && !p.options.include_usage);
        assert_eq!(p.options.logprobs, None);
        assert!(p.tools.is_none());
    }

    #[test]
    fn fields_map_through() {
        let p = chat_req(json!({
            "messages": user(), "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.1,
            "seed": -1, "stop": "\n\n", "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "max_tokens": 7, "max_completion_tokens": 9, "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3,
            "user": "u", "metadata": {"a": "b"}, "store": false, "parallel_tool_calls": true,
            "service_tier": "auto", "n": 1, "logit_bias": {}, "response_format": {"type": "text"}
        }))
        .unwrap();
        let s = &p.options.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p),
            (0.0, 0.5, 40, 0.1)
        );
        assert_eq!(s.seed, Some(u64::MAX));
        assert_eq!((s.presence_penalty, s.frequency_penalty), (0.5, -0.5));
        assert_eq!(p.options.stop, vec!["\n\n".to_string()]);
        assert_eq!(p.options.max_tokens, Some(9));
        assert!(p.options.stream && p.options.include_usage);
        assert_eq!(p.options.logprobs, Some(3));
    }

    fn rejects(v: Value, param: &str, needle: &str) {
        let e = chat_req(v.clone()).expect_err(&v.to_string());
        assert_eq!(e.status, 400, "{v}");
        assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
        assert!(
            e.message.contains(needle),
            "{v}: {:?} lacks {needle:?}",
            e.message
        );
    }

    #[test]
    fn bad_requests_name_the_field() {
        rejects(json!({"messages": []}), "messages", "at least one");
        rejects(json!({"messages": user(), "n": 2}), "n", "only n = 1");
        rejects(json!({"messages": user(), "n": 0}), "n", "at least 1");
        rejects(
            json!({"messages": user(), "temperature": -1}),
            "temperature",
            "temperature",
        );
        rejects(
            json!({"messages": user(), "temperature": "hot"}),
            "temperature",
            "invalid type",
        );
        rejects(json!({"messages": user(), "top_p": 0}), "top_p", "(0, 1]");
        rejects(json!({"messages": user(), "min_p": 2}), "min_p", "[0, 1]");
        rejects(
            json!({"messages": user(), "presence_penalty": 3}),
            "presence_penalty",
            "[-2, 2]",
        );
        rejects(
            json!({"messages": user(), "max_tokens": 0}),
            "max_tokens",
            "at least 1",
        );
        rejects(
            json!({"messages": user(), "max_tokens": -5}),
            "max_tokens",
            "invalid value",
        );
        rejects(json!({"messages": user(), "seed": 1.5}), "seed", "integer");
        rejects(json!({"messages": user(), "stop": 3}), "stop", "string");
        rejects(json!({"messages": user(), "stop": [""]}), "stop", "empty");
        rejects(
            json!({"messages": user(), "logit_bias": {"1": 5}}),
            "logit_bias",
            "not supported",
        );
        rejects(
            json!({"messages": user(), "response_format": {"type": "json_schema"}}),
            "response_format",
            "json_schema",
        );
        rejects(
            json!({"messages": user(), "top_logprobs": 2}),
            "top_logprobs",
            "logprobs: true",
        );
        rejects(
            json!({"messages": user(), "logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
            "at most 20",
        );
        rejects(
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
            "unknown role",
        );
        rejects(
            json!({"messages": [{"content": "x"}]}),
            "messages[0].role",
            "must be a string",
        );
        rejects(
            json!({"messages": ["hi"]}),
            "messages[0]",
            "must be an object",
        );
        rejects(
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
            "required",
        );
        rejects(
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "string or an array",
        );
        rejects(
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0]",
            "image_url",
        );
        rejects(json!({"messages": "hi"}), "messages", "invalid type");
        rejects(
            json!({"messages": user(), "tools": [{"type": "function"}]}),
            "tools[0]",
            "must be",
        );
        rejects(
            json!({"messages": user(), "tool_choice": "required"}),
            "tool_choice",
            "requires `tools`",
        );
        rejects(
            json!({"messages": user(), "tool_choice": "sometimes"}),
            "tool_choice",
            "unknown",
        );
        rejects(
            json!({"messages": user(), "functions": [{}]}),
            "functions",
            "tools",
        );
        rejects(
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}),
            "messages[0].tool_calls[0]",
            "must be",
        );
    }

    #[test]
    fn messages_are_normalized() {
        let p = chat_req(json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]}))
        .unwrap();
        assert_eq!(p.messages[0], json!({"role": "system", "content": "a\nb"}));
        assert_eq!(p.messages[2]["content"], "");
        assert_eq!(p.messages[2]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(p.messages[3]["role"], "tool");
    }

    #[test]
    fn tool_choice() {
        let tools = json!([
            {"type": "function", "function": {"name": "a", "parameters": {}}},
            {"type": "function", "function": {"name": "b"}}
        ]);
        let p = chat_req(json!({"messages": user(), "tools": tools})).unwrap();
        assert_eq!(p.tools.as_ref().map(Vec::len), Some(2));
        let p =
            chat_req(json!({"messages": user(), "tools": tools, "tool_choice": "none"})).unwrap();
        assert!(p.tools.is_none());
        let p = chat_req(json!({"messages": user(), "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "b"}}}))
        .unwrap();
        assert_eq!(p.tools.unwrap()[0]["function"]["name"], "b");
        rejects(
            json!({"messages": user(), "tools": tools, "tool_choice": {"type": "function", "function": {"name": "zz"}}}),
            "tool_choice",
            "not among",
        );
    }

    #[test]
    fn completion_prompts() {
        let c = |v: Value| {
            completion(
                parse_json::<CompletionRequest>(v.to_string().as_bytes())?,
                &openai_sampling_defaults(),
            )
        };
        assert_eq!(
            c(json!({"prompt": "x"})).unwrap().prompt,
            PromptInput::Text("x".into())
        );
        assert_eq!(
            c(json!({"prompt": ["x"]})).unwrap().prompt,
            PromptInput::Text("x".into())
        );
        assert_eq!(
            c(json!({"prompt": [1, 2]})).unwrap().prompt,
            PromptInput::Ids(vec![1, 2])
        );
        assert_eq!(
            c(json!({"prompt": [[3]]})).unwrap().prompt,
            PromptInput::Ids(vec![3])
        );
        assert_eq!(
            c(json!({"prompt": "x", "logprobs": 2}))
                .unwrap()
                .options
                .logprobs,
            Some(2)
        );
        for (v, param) in [
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": [-1]}), "prompt"),
            (json!({"prompt": {"a": 1}}), "prompt"),
            (json!({"prompt": "x", "echo": true}), "echo"),
            (json!({"prompt": "x", "best_of": 3}), "best_of"),
            (json!({"prompt": "x", "n": 3}), "n"),
            (json!({"prompt": "x", "logprobs": 30}), "logprobs"),
        ] {
            let e = c(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
        }
        let e = c(json!({})).unwrap_err();
        assert!(e.message.contains("prompt"), "{}", e.message);
    }

    #[test]
    fn operator_defaults_fill_what_the_request_leaves_out() {
        let d = SamplingParams {
            temperature: 0.7,
            top_p: 0.8,
            top_k: 20,
            repeat_penalty: 1.05,
            ..openai_sampling_defaults()
        };
        let req = |v: Value| parse_json::<ChatRequest>(v.to_string().as_bytes()).unwrap();
        let p = chat(req(json!({"messages": user()})), &d).unwrap();
        let s = &p.options.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.repeat_penalty),
            (0.7, 0.8, 20, 1.05)
        );
        let p = chat(
            req(json!({"messages": user(), "temperature": 0.0, "top_k": 0})),
            &d,
        )
        .unwrap();
        let s = &p.options.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k), (0.0, 0.8, 0));
    }

    #[test]
    fn budget() {
        let b = |len, max, param| token_budget(len, max, param, 100, 150, "prompt");
        assert_eq!(b(10, None, "max_tokens").unwrap(), 90);
        assert_eq!(b(10, Some(5), "max_tokens").unwrap(), 5);
        // Up to the model's context is accepted and capped at what the serving context leaves.
        assert_eq!(b(10, Some(95), "max_tokens").unwrap(), 90);
        assert_eq!(b(10, Some(150), "max_tokens").unwrap(), 90);
        let e = b(10, Some(151), "max_completion_tokens").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        assert!(e.message.contains("at most 90"), "{}", e.message);
        assert!(e.message.contains("150-token context"), "{}", e.message);
        // A serving context above the model's own is the limit then.
        assert_eq!(
            token_budget(10, Some(100), "max_tokens", 100, 50, "prompt").unwrap(),
            90
        );
        let e = token_budget(100, None, "max_tokens", 100, 150, "messages").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(b(0, None, "max_tokens").is_err());
        assert!(check_model(Some("x"), "y").is_err());
        assert!(check_model(None, "y").is_ok());
        assert!(check_model(Some("y"), "y").is_ok());
    }
}
