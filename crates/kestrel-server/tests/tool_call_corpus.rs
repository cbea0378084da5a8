//! The tool-call parser against a corpus of real model outputs (tests/data/tool-call-corpus.json:
//! what Qwen2.5-Coder wrote through kestrel for Qwen Code's requests, and the forms the issue
//! and Qwen3-Coder's chat template show), each parsed whole and streamed in many splits.
//!
//! An entry: `{"id", "source", "tools": "qwen-code" | [OpenAI tools], "end": "stop" | "length",
//! "text", "expect": [{"content": "..."} | {"call": {"name", "arguments": {...}}}]}`.
//! "qwen-code" stands for the 14 tools of the captured Qwen Code request (data/qwen-code).

use std::path::Path;

use serde_json::Value;

use kestrel_server::tool_calls::{
    merge_content, parse_all_with, End, Segment, ToolCallParser, ToolSpec,
};

fn data(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn tools_of(entry: &Value, qwen_code: &[Value]) -> Vec<Value> {
    match &entry["tools"] {
        Value::String(s) if s == "qwen-code" => qwen_code.to_vec(),
        Value::Array(a) => a.clone(),
        other => panic!("entry {}: bad tools {other}", entry["id"]),
    }
}

/// Segments as comparable JSON (arguments parsed, so key order and spacing do not matter).
fn as_json(segments: &[Segment]) -> Vec<Value> {
    segments
        .iter()
        .map(|s| match s {
            Segment::Content(c) => serde_json::json!({ "content": c }),
            Segment::ToolCall(c) => serde_json::json!({ "call": {
                "name": c.name,
                "arguments": serde_json::from_str::<Value>(&c.arguments)
                    .expect("arguments are a JSON object"),
            }}),
        })
        .collect()
}

#[test]
fn corpus_parses_whole_and_streamed() {
    let turn1 = data("qwen-code/turn1.json");
    let qwen_code = turn1["tools"].as_array().expect("turn1 has tools").clone();
    assert!(
        qwen_code.len() >= 10,
        "the captured request offers many tools"
    );
    let corpus = data("tool-call-corpus.json");
    let entries = corpus.as_array().expect("the corpus is an array");
    assert!(entries.len() >= 10);
    for entry in entries {
        let id = entry["id"].as_str().expect("id");
        let text = entry["text"].as_str().expect("text");
        let end = match entry["end"].as_str() {
            Some("length") => End::Cut,
            _ => End::Stopped,
        };
        let specs = ToolSpec::from_tools(&tools_of(entry, &qwen_code));
        let expect = entry["expect"].as_array().expect("expect").clone();
        let parser = || ToolCallParser::with_tools(specs.clone());
        let whole = as_json(&parse_all_with(parser(), text, end));
        assert_eq!(whole, expect, "{id}: whole");
        // Streamed as the engine would: in pieces of 1, 2, 3, 5 and 8 bytes (on char bounds).
        for step in [1, 2, 3, 5, 8] {
            let mut p = parser();
            let mut out = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let mut end_at = (at + step).min(text.len());
                while !text.is_char_boundary(end_at) {
                    end_at += 1;
                }
                out.extend(p.push(&text[at..end_at]));
                at = end_at;
            }
            out.extend(p.finish(end));
            assert_eq!(
                as_json(&merge_content(out)),
                expect,
                "{id}: streamed by {step}"
            );
        }
    }
}
