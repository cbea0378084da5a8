//! Router tests: the real server on 127.0.0.1:0, a scripted fake engine, a raw HTTP/1.1
//! client (so what is checked is exactly what goes over the wire), and the tiny Qwen2
//! tokenizer from testdata with a Qwen-style chat template.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedSender;

use kestrel_server::{
    AppState, Backend, BackendStats, Event, FinishReason, GenerateRequest, Generation,
    ServerConfig, SubmitError, TokenLogprob, Usage,
};
use kestrel_tokenizer::{ChatTemplate, Tokenizer};

const QWEN_LIKE_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
# Tools

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call tools inside <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// Drop guard that counts cancellations.
struct CancelFlag(Arc<AtomicUsize>);

impl Drop for CancelFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A scripted engine: replies with `reply` pieces (one token each), or never finishes when
/// `hang` is set. Records every request and counts dropped generations.
#[derive(Default)]
struct Fake {
    reply: Mutex<Vec<String>>,
    hang: std::sync::atomic::AtomicBool,
    requests: Mutex<Vec<GenerateRequest>>,
    dropped: Arc<AtomicUsize>,
    open: Mutex<Vec<UnboundedSender<Event>>>,
}

/// Largest max_tokens the fake's "pool" takes.
const FAKE_POOL_TOKENS: usize = 5000;

impl Backend for Fake {
    fn submit(&self, req: GenerateRequest) -> Result<Generation, SubmitError> {
        if req.prompt.len() + req.max_tokens > FAKE_POOL_TOKENS {
            return Err(SubmitError::PoolTooSmall {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                needed_blocks: 0,
                block_size: 16,
                pool_blocks: 0,
                pool_tokens: FAKE_POOL_TOKENS,
                hint: "lower max_tokens".into(),
            });
        }
        self.requests.lock().unwrap().push(req.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let guard = Box::new(CancelFlag(self.dropped.clone()));
        if self.hang.load(Ordering::SeqCst) {
            self.open.lock().unwrap().push(tx);
            return Ok(Generation::new(rx, guard));
        }
        let reply = self.reply.lock().unwrap().clone();
        let n = reply.len().min(req.max_tokens);
        for (i, text) in reply.iter().take(n).enumerate() {
            let logprob = req.logprobs.map(|k| TokenLogprob {
                id: 40 + i as u32,
                logprob: -0.5,
                top: (0..k as u32).map(|j| (40 + j, -0.5 - j as f32)).collect(),
            });
            let _ = tx.send(Event::Token {
                id: 40 + i as u32,
                text: text.clone(),
                logprob,
            });
        }
        let finish = if n < reply.len() {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let _ = tx.send(Event::Done {
            finish,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                cached_tokens: req.prompt.len() / 2,
                completion_tokens: n,
                ttft_ms: 12.0,
                decode_ms: 40.0,
                ..Default::default()
            },
        });
        Ok(Generation::new(rx, guard))
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            kv_blocks_used: 3,
            kv_blocks_cached: 5,
            kv_blocks_free: 92,
            queue_depth: 1,
            running: 2,
            spec_proposed: 0,
            spec_accepted: 0,
            ..Default::default()
        }
    }
}

struct Server {
    addr: SocketAddr,
    fake: Arc<Fake>,
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
}

fn tokenizer() -> Arc<Tokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny/tiny-qwen2");
    Arc::new(Tokenizer::from_hf_dir(dir).expect("tiny qwen2 tokenizer"))
}

async fn start(configure: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut config = ServerConfig::new("kestrel-test", 4096);
    configure(&mut config);
    let fake = Arc::new(Fake::default());
    *fake.reply.lock().unwrap() = vec!["Hello".into(), " wor".into(), "ld".into()];
    let tokenizer = tokenizer();
    let template = Arc::new(ChatTemplate::new(QWEN_LIKE_TEMPLATE, "", "<|im_end|>").unwrap());
    let state = AppState::with_template(
        config,
        fake.clone() as Arc<dyn Backend>,
        tokenizer.clone(),
        Some(template.clone()),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kestrel_server::serve(state, listener));
    Server {
        addr,
        fake,
        tokenizer,
        template,
    }
}

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an SSE body.
    fn sse(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("bad event {e:?}"))
                    .to_string()
            })
            .collect()
    }

    fn error(&self) -> Value {
        let v = self.json();
        assert!(v["error"]["type"].is_string(), "{v}");
        v["error"].clone()
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    ));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes(method, path, headers, body.as_bytes()))
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Reply {
        status,
        headers: head.to_string(),
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    http(addr, "POST", path, &[], &body.to_string()).await
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test]
async fn chat_non_streamed() {
    let srv = start(|_| {}).await;
    let r = post(srv.addr, "/v1/chat/completions", json!({
        "model": "kestrel-test", "messages": user("Say hello"), "user": "me",
        "metadata": {"k": "v"}, "store": false, "service_tier": "auto", "parallel_tool_calls": false
    }))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .headers
        .to_ascii_lowercase()
        .contains("content-type: application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "kestrel-test");
    let choice = &v["choices"][0];
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "Hello world", "refusal": null})
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    let req = srv.fake.requests.lock().unwrap()[0].clone();
    let expected = srv
        .tokenizer
        .encode(
            &srv.template
                .apply(
                    &[json!({"role": "user", "content": "Say hello"})],
                    None,
                    true,
                )
                .unwrap(),
            true,
            true,
        )
        .unwrap();
    assert_eq!(req.prompt, expected);
    assert_eq!(req.max_tokens, 4096 - expected.len());
    assert_eq!(
        (
            req.sampling.temperature,
            req.sampling.top_p,
            req.sampling.top_k,
            req.sampling.min_p
        ),
        (1.0, 1.0, 0, 0.0)
    );
    let n = expected.len();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": n, "completion_tokens": 3, "total_tokens": n + 3,
        "prompt_tokens_details": {"cached_tokens": n / 2}})
    );
}

#[tokio::test]
async fn chat_streamed_with_usage_and_logprobs() {
    let srv = start(|_| {}).await;
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        json!({
            "messages": user("hi"), "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": 2, "logprobs": true, "top_logprobs": 2, "stop": ["\n"], "seed": 7
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .headers
        .to_ascii_lowercase()
        .contains("content-type: text/event-stream"));
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello wor");
    let lp = &chunks[1]["choices"][0]["logprobs"]["content"][0];
    assert_eq!(lp["logprob"], -0.5);
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2);
    assert!(lp["bytes"].is_array() && lp["token"].is_string());
    let last = &chunks[chunks.len() - 2];
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
    let req = srv.fake.requests.lock().unwrap()[0].clone();
    assert_eq!(
        (req.max_tokens, req.logprobs, req.sampling.seed),
        (2, Some(2), Some(7))
    );
    assert_eq!(req.stop, vec!["\n".to_string()]);
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

#[tokio::test]
async fn tool_call_round_trip() {
    let srv = start(|_| {}).await;
    *srv.fake.reply.lock().unwrap() = vec![
        "<tool".into(),
        "_call>\n{\"name\": \"get_weather\", ".into(),
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>".into(),
    ];
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        json!({
            "messages": user("Weather in Paris?"), "tools": weather_tools(), "tool_choice": "auto"
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(msg["content"], Value::Null);
    let call = &msg["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    let prompt = srv
        .tokenizer
        .decode(&srv.fake.requests.lock().unwrap()[0].prompt, false);
    assert!(prompt.contains("\"name\": \"get_weather\""), "{prompt}");

    // Streamed: the call arrives as a delta.
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        json!({
            "messages": user("Weather in Paris?"), "tools": weather_tools(), "stream": true
        }),
    )
    .await;
    let events = r.sse();
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .collect();
    assert_eq!(deltas.len(), 1);
    assert_eq!(
        deltas[0]["choices"][0]["delta"]["tool_calls"][0]["index"],
        0
    );
    assert_eq!(
        deltas[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // The result goes back as a tool message.
    *srv.fake.reply.lock().unwrap() = vec!["It is sunny.".into()];
    let id = call["id"].as_str().unwrap();
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        json!({
            "tools": weather_tools(),
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": id, "content": "{\"sky\": \"sunny\"}"}
            ]
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "It is sunny.");
    let prompt = srv
        .tokenizer
        .decode(&srv.fake.requests.lock().unwrap()[2].prompt, false);
    assert!(
        prompt.contains("<tool_response>\n{\"sky\": \"sunny\"}\n</tool_response>"),
        "{prompt}"
    );
    assert!(
        prompt.contains("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
        "{prompt}"
    );
}

#[tokio::test]
async fn malformed_tool_call_stays_content() {
    let srv = start(|_| {}).await;
    let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }";
    *srv.fake.reply.lock().unwrap() = vec![bad.into()];
    for stream in [false, true] {
        let r = post(
            srv.addr,
            "/v1/chat/completions",
            json!({
                "messages": user("x"), "tools": weather_tools(), "stream": stream
            }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let content = if stream {
            let events = r.sse();
            events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str::<Value>(e).unwrap())
                .filter_map(|c| {
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_string)
                })
                .collect::<String>()
        } else {
            let v = r.json();
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(content, bad);
    }
}

#[tokio::test]
async fn text_completions() {
    let srv = start(|_| {}).await;
    let r = post(
        srv.addr,
        "/v1/completions",
        json!({"prompt": "def f():", "max_tokens": 8, "logprobs": 1}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "Hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(lp["text_offset"][0], 0);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 1);
    assert_eq!(
        srv.fake.requests.lock().unwrap()[0].prompt,
        srv.tokenizer.encode("def f():", true, true).unwrap()
    );

    let r = post(
        srv.addr,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "stream": true,
        "stream_options": {"include_usage": true}}),
    )
    .await;
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello world");
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(chunks[chunks.len() - 1]["usage"]["prompt_tokens"], 3);
    assert_eq!(srv.fake.requests.lock().unwrap()[1].prompt, vec![1, 2, 3]);
}

/// Every bad input gets a 4xx with an OpenAI error object naming what was wrong.
#[tokio::test]
async fn bad_inputs_are_4xx_with_openai_errors() {
    let srv = start(|c| c.ctx_size = 256).await;
    let chat = "/v1/chat/completions";
    let cases: Vec<(&str, String, u16, Option<&str>, &str)> = vec![
        (chat, "{not json".into(), 400, None, "not valid JSON"),
        (chat, "".into(), 400, None, "empty"),
        (chat, json!({"messages": user("x"), "temperature": "hot"}).to_string(), 400, Some("temperature"), "invalid type"),
        (chat, json!({"messages": user("x"), "model": "gpt-4o"}).to_string(), 404, Some("model"), "gpt-4o"),
        (chat, json!({"messages": []}).to_string(), 400, Some("messages"), "at least one"),
        (chat, json!({"messages": user(&"long ".repeat(300))}).to_string(), 400, Some("messages"), "context holds 256"),
        (chat, json!({"messages": user("x"), "max_tokens": 100000}).to_string(), 400, Some("max_tokens"), "at most"),
        (chat, json!({"messages": user("x"), "temperature": -1}).to_string(), 400, Some("temperature"), "temperature"),
        (chat, json!({"messages": user("x"), "top_p": 1.5}).to_string(), 400, Some("top_p"), "top_p"),
        (chat, json!({"messages": user("x"), "n": 3}).to_string(), 400, Some("n"), "n = 1"),
        (chat, json!({"messages": user("x"), "logit_bias": {"5": 1}}).to_string(), 400, Some("logit_bias"), "not supported"),
        (chat, json!({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {}}}).to_string(), 400, Some("response_format"), "json_schema"),
        (chat, json!([1, 2]).to_string(), 400, None, "must be a JSON object"),
        ("/v1/completions", json!({"prompt": [999999]}).to_string(), 400, Some("prompt"), "outside the vocabulary"),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": 0}).to_string(), 400, Some("max_tokens"), "at least 1"),
        ("/detokenize", json!({"tokens": [999999]}).to_string(), 400, Some("tokens"), "outside"),
        ("/tokenize", json!({"content": 5}).to_string(), 400, Some("content"), "invalid type"),
    ];
    for (path, body, status, param, needle) in cases {
        let r = http(srv.addr, "POST", path, &[], &body).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"].as_str(), param, "{body}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e} lacks {needle:?}"
        );
    }

    // The engine's own refusal (its pool is smaller than the context here).
    let srv = start(|c| c.ctx_size = 100_000).await;
    let r = post(
        srv.addr,
        chat,
        json!({"messages": user("x"), "max_tokens": 6000}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["code"], "context_length_exceeded");
    assert!(r.error()["message"]
        .as_str()
        .unwrap()
        .contains("lower max_tokens"));

    // Bodies over the limit.
    let srv = start(|c| c.max_body_bytes = 1024).await;
    let r = post(srv.addr, chat, json!({"messages": user(&"x".repeat(2000))})).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.error()["message"].as_str().unwrap().contains("1024"));

    // Unknown routes and methods.
    let r = http(srv.addr, "GET", "/v1/nope", &[], "").await;
    assert_eq!(r.status, 404);
    assert!(r.error()["message"].as_str().unwrap().contains("/v1/nope"));
    let r = http(srv.addr, "GET", chat, &[], "").await;
    assert_eq!(r.status, 405);
    r.error();
}

#[tokio::test]
async fn api_key_guards_everything_but_health() {
    let srv = start(|c| c.api_key = Some("sekret".into())).await;
    let r = http(srv.addr, "GET", "/health", &[], "").await;
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("GET", "/metrics"),
    ] {
        let r = http(srv.addr, method, path, &[], "{}").await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.error()["code"], "invalid_api_key");
        let r = http(
            srv.addr,
            method,
            path,
            &[("Authorization", "Bearer wrong")],
            "{}",
        )
        .await;
        assert_eq!(r.status, 401, "{path}");
    }
    let r = http(
        srv.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekret")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "kestrel-test");
    let r = http(
        srv.addr,
        "GET",
        "/v1/models/kestrel-test",
        &[("Authorization", "Bearer sekret")],
        "",
    )
    .await;
    assert_eq!(r.json()["object"], "model");
}

#[tokio::test]
async fn tokenize_detokenize_metrics() {
    let srv = start(|_| {}).await;
    let r = post(srv.addr, "/tokenize", json!({"content": "<|im_start|>hi"})).await;
    let tokens = r.json()["tokens"].clone();
    let ids: Vec<u32> = serde_json::from_value(tokens.clone()).unwrap();
    assert_eq!(
        ids,
        srv.tokenizer.encode("<|im_start|>hi", false, true).unwrap()
    );
    let r = post(srv.addr, "/detokenize", json!({"tokens": tokens})).await;
    assert_eq!(r.json()["content"], "<|im_start|>hi");

    post(
        srv.addr,
        "/v1/chat/completions",
        json!({"messages": user("x")}),
    )
    .await;
    post(srv.addr, "/v1/chat/completions", json!({"messages": []})).await;
    let r = http(srv.addr, "GET", "/metrics", &[], "").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.contains("text/plain"));
    for line in [
        "kestrel_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "kestrel_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1",
        "kestrel_generated_tokens_total 3",
        "kestrel_time_to_first_token_seconds_count 1",
        "kestrel_decode_seconds_count 1",
        "kestrel_kv_blocks_used 3",
        "kestrel_kv_blocks_cached 5",
        "kestrel_kv_blocks_free 92",
        "kestrel_queue_depth 1",
        "kestrel_running_sequences 2",
    ] {
        assert!(
            r.body.lines().any(|l| l == line),
            "missing {line:?}:\n{}",
            r.body
        );
    }
    assert!(r.body.contains("kestrel_prompt_cached_tokens_total"));
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A client that goes away cancels its request, streamed or not.
#[tokio::test]
async fn disconnect_cancels() {
    let srv = start(|_| {}).await;
    srv.fake.hang.store(true, Ordering::SeqCst);
    for stream in [true, false] {
        let before = srv.fake.dropped.load(Ordering::SeqCst);
        let submitted = srv.fake.requests.lock().unwrap().len();
        let body = json!({"messages": user("x"), "stream": stream}).to_string();
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(&request_bytes(
            "POST",
            "/v1/chat/completions",
            &[],
            body.as_bytes(),
        ))
        .await
        .unwrap();
        if stream {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
        }
        let fake = srv.fake.clone();
        wait_for("submit", || fake.requests.lock().unwrap().len() > submitted).await;
        assert_eq!(
            srv.fake.dropped.load(Ordering::SeqCst),
            before,
            "cancelled too early"
        );
        drop(s);
        let fake = srv.fake.clone();
        wait_for("cancellation", || {
            fake.dropped.load(Ordering::SeqCst) > before
        })
        .await;
    }
    let r = http(srv.addr, "GET", "/metrics", &[], "").await;
    assert!(
        r.body
            .lines()
            .any(|l| l == "kestrel_requests_cancelled_total 2"),
        "{}",
        r.body
    );
}

/// While the engine is silent (a long prefill), a stream gets keep-alive chunks that add
/// nothing: agent clients drop streams that send no data for minutes.
#[tokio::test]
async fn silent_streams_get_keepalive_chunks() {
    let srv = start(|c| c.keepalive = Duration::from_millis(50)).await;
    srv.fake.hang.store(true, Ordering::SeqCst);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "stream": true}),
        ),
        ("/v1/completions", json!({"prompt": "x", "stream": true})),
    ] {
        let body = body.to_string();
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(&request_bytes("POST", path, &[], body.as_bytes()))
            .await
            .unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while seen.matches("data: ").count() < 4 && tokio::time::Instant::now() < deadline {
            let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let chunks: Vec<Value> = seen
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(chunks.len() >= 3, "{path}: {seen}");
        for c in &chunks[1..] {
            let choice = &c["choices"][0];
            assert_eq!(choice["finish_reason"], Value::Null, "{path}: {c}");
            if path == "/v1/chat/completions" {
                assert_eq!(choice["delta"], json!({}), "{c}");
            } else {
                assert_eq!(choice["text"], "", "{c}");
            }
        }
    }
}
