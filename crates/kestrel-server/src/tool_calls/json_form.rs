//! The JSON call form: `{"name": ..., "arguments": {...}}`, inside `<tool_call>` tags (Qwen2.5,
//! Qwen3) or bare as a whole reply (Qwen2.5-Coder often answers a tool request with the call's
//! JSON and no tags, plain or in a ```json fence).

use serde_json::Value;

use super::{ParsedToolCall, ToolSpec};

/// Whether a reply that begins with `text` may still be a bare JSON call.
pub(super) fn could_be_bare(text: &str) -> bool {
    let t = text.trim_start();
    if t.is_empty() || t.starts_with('{') || t.starts_with('[') || "```".starts_with(t) {
        return true;
    }
    let Some(after) = t.strip_prefix("```") else {
        return false;
    };
    match after.split_once('\n') {
        None => "json".starts_with(after.trim_end()),
        Some((lang, rest)) => {
            matches!(lang.trim(), "" | "json") && {
                let r = rest.trim_start();
                r.is_empty() || r.starts_with('{') || r.starts_with('[')
            }
        }
    }
}

/// A whole reply that is one call, or an array of calls, naming offered tools (optionally in
/// a ```json fence).
pub(super) fn parse_bare(text: &str, tools: &[ToolSpec]) -> Option<Vec<ParsedToolCall>> {
    let mut t = text.trim();
    if let Some(after) = t.strip_prefix("```") {
        let (_, body) = after.split_once('\n')?;
        t = body.trim_end().strip_suffix("```")?.trim();
    }
    let bodies: Vec<String> = match serde_json::from_str::<Value>(t).ok()? {
        Value::Array(items) if !items.is_empty() => items.iter().map(|v| v.to_string()).collect(),
        v @ Value::Object(_) => vec![v.to_string()],
        _ => return None,
    };
    let calls: Vec<ParsedToolCall> = bodies
        .iter()
        .map(|b| parse_call(b))
        .collect::<Option<_>>()?;
    calls
        .iter()
        .all(|c| tools.iter().any(|t| t.name == c.name))
        .then_some(calls)
}

/// `{"name": "...", "arguments": {...}}` (arguments may also be a JSON string holding an
/// object, or absent); anything else is not a call.
pub(super) fn parse_call(body: &str) -> Option<ParsedToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::Object(m)) => serde_json::to_string(m).ok()?,
        Some(Value::String(s)) => {
            // Some models double-encode; accept a string only if it holds a JSON object.
            match serde_json::from_str::<Value>(s).ok()? {
                Value::Object(m) => serde_json::to_string(&m).ok()?,
                _ => return None,
            }
        }
        Some(_) => return None,
    };
    Some(ParsedToolCall {
        name: name.to_string(),
        arguments,
    })
}
