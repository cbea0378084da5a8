//! OpenAI wire types: request bodies (deserialized leniently: unknown fields are ignored) and
//! response bodies / stream chunks (serialized exactly as the official SDKs expect).

use serde::{Deserialize, Serialize};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// Declares a request struct with the fields shared by chat and text completions appended,
/// and `common()` to copy them out. (Not `#[serde(flatten)]`: flattening loses the field path
/// that error messages name.)
macro_rules! with_common_fields {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($body)*
            pub stream: Option<bool>,
            pub stream_options: Option<StreamOptions>,
            pub max_tokens: Option<u32>,
            pub temperature: Option<f32>,
            pub top_p: Option<f32>,
            /// Extension (llama.cpp): 0 = off.
            pub top_k: Option<u32>,
            /// Extension (llama.cpp): 0 = off.
            pub min_p: Option<f32>,
            /// Extension (llama.cpp): 1 = off.
            pub repeat_penalty: Option<f32>,
            pub presence_penalty: Option<f32>,
            pub frequency_penalty: Option<f32>,
            /// Any JSON integer (negative seeds are taken modulo 2^64).
            pub seed: Option<serde_json::Number>,
            /// A string or an array of strings.
            pub stop: Option<Value>,
            pub n: Option<u32>,
            pub logit_bias: Option<Value>,
            /// Extension (llama.cpp): keep generating past end-of-generation tokens.
            pub ignore_eos: Option<bool>,
        }

        impl $name {
            /// The shared fields.
            #[allow(clippy::clone_on_copy)]
            pub fn common(&self) -> CommonFields {
                CommonFields {
                    stream: self.stream.clone(),
                    stream_options: self.stream_options.clone(),
                    max_tokens: self.max_tokens.clone(),
                    temperature: self.temperature.clone(),
                    top_p: self.top_p.clone(),
                    top_k: self.top_k.clone(),
                    min_p: self.min_p.clone(),
                    repeat_penalty: self.repeat_penalty.clone(),
                    presence_penalty: self.presence_penalty.clone(),
                    frequency_penalty: self.frequency_penalty.clone(),
                    seed: self.seed.clone(),
                    stop: self.stop.clone(),
                    n: self.n.clone(),
                    logit_bias: self.logit_bias.clone(),
                    ignore_eos: self.ignore_eos.clone(),
                }
            }
        }
    };
}

with_common_fields! {
    /// `POST /v1/chat/completions`. Fields kestrel does not know are ignored (`user`, `metadata`,
    /// `store`, `parallel_tool_calls`, `service_tier`, ...); fields it knows but cannot honour are
    /// captured so validation can reject them by name.
    #[derive(Debug, Clone, Default, Deserialize)]
    pub struct ChatRequest {
        pub model: Option<String>,
        /// Checked message by message in validation (roles, content shapes, tool calls).
        pub messages: Vec<Value>,
        pub tools: Option<Vec<Value>>,
        pub tool_choice: Option<Value>,
        pub max_completion_tokens: Option<u32>,
        pub logprobs: Option<bool>,
        pub top_logprobs: Option<u32>,
        pub response_format: Option<Value>,
        pub functions: Option<Value>,
        pub function_call: Option<Value>,
        pub audio: Option<Value>,
        pub modalities: Option<Value>,
        pub prediction: Option<Value>,
    }
}

with_common_fields! {
    /// `POST /v1/completions` (legacy text completions).
    #[derive(Debug, Clone, Default, Deserialize)]
    pub struct CompletionRequest {
        pub model: Option<String>,
        /// Text, `[text]`, token ids, or `[token ids]` (one prompt only).
        pub prompt: Value,
        /// Legacy logprobs: the number of alternatives per token (0..=20).
        pub logprobs: Option<u32>,
        pub echo: Option<bool>,
        pub best_of: Option<u32>,
        pub suffix: Option<String>,
    }
}

/// Fields shared by chat and text completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extension (llama.cpp): 0 = off.
    pub top_k: Option<u32>,
    /// Extension (llama.cpp): 0 = off.
    pub min_p: Option<f32>,
    /// Extension (llama.cpp): 1 = off.
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Any JSON integer (negative seeds are taken modulo 2^64).
    pub seed: Option<serde_json::Number>,
    /// A string or an array of strings.
    pub stop: Option<Value>,
    pub n: Option<u32>,
    pub logit_bias: Option<Value>,
    /// Extension (llama.cpp): keep generating past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    /// Add BOS/EOS where the model asks for them (default false, as llama.cpp).
    #[serde(default)]
    pub add_special: bool,
    /// Let control-token texts become their ids (default true, as llama.cpp).
    #[serde(default = "yes")]
    pub parse_special: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub content: String,
}

// ---------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UsageBody {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl From<crate::backend::Usage> for UsageBody {
    fn from(u: crate::backend::Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// A parsed tool call in OpenAI's shape (`arguments` is a JSON string).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallBody {
    /// Position among the message's tool calls (stream deltas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionBody,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionBody {
    pub name: String,
    pub arguments: String,
}

/// One alternative in chat `logprobs.content[i].top_logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token in chat `logprobs.content`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprob>,
    pub refusal: Option<Vec<ChatLogprob>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessageBody {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
    pub refusal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageBody,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageBody,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// Legacy completions logprobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A text completion, and (object `text_completion` too) each of its stream chunks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// Marks responses as coming from this server build.
pub const SYSTEM_FINGERPRINT: &str = concat!("kestrel-", env!("CARGO_PKG_VERSION"));
