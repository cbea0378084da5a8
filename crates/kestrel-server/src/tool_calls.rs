//! Qwen-style tool calls in model output: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! [`ToolCallParser`] is a streaming parser: text goes in as the engine produces it, in any
//! split, and comes out as [`Segment`]s — plain content, or a complete parsed call. It holds
//! back only text that may still turn out to be a tool call: a suffix that is a prefix of
//! `<tool_call>`, the inside of an open call, and whitespace around calls (so a reply made of
//! calls has no stray `"\n"` content). Nothing the model writes is an error: a call whose JSON
//! does not parse, or that is never closed, comes back verbatim as content.
//!
//! The same parser serves non-streamed responses (push everything, then finish), so both paths
//! give the same result for the same text.
//!
//! Bare calls: Qwen2.5-Coder often answers a tool request with the call's JSON and no tags,
//! plain or in a ```json fence. When a reply *starts* like that, the parser holds it to the end;
//! if the whole reply is one call (or an array of calls) naming offered tools, it becomes
//! tool calls, otherwise it is released as content unchanged.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A parsed call; `arguments` is a JSON object serialized as a string (OpenAI's wire format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of parser output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Content(String),
    ToolCall(ParsedToolCall),
}

#[derive(Debug, Default)]
enum State {
    /// Plain text; `pending` may end with a partial `<tool_call>` or be held whitespace.
    #[default]
    Text,
    /// Inside `<tool_call>`; `pending` holds the call body seen so far.
    InCall,
}

/// Streaming tool-call parser (see the module doc).
#[derive(Debug, Default)]
pub struct ToolCallParser {
    state: State,
    /// Text not yet emitted: trailing whitespace and a partial `<tool_call>` in `Text`, the
    /// call body in `InCall`.
    pending: String,
    /// Whitespace between the content and an open call: dropped if the call parses, given
    /// back if it does not.
    held_ws: String,
    calls_seen: usize,
    /// Names of the offered tools (a bare call must name one of them).
    tool_names: Vec<String>,
    /// Nothing emitted yet and the reply so far could still be a bare call.
    bare_possible: bool,
}

impl ToolCallParser {
    /// A parser for tagged calls only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that also recognises a bare JSON reply naming one of `tool_names`.
    pub fn with_tools(tool_names: Vec<String>) -> Self {
        Self {
            bare_possible: !tool_names.is_empty(),
            tool_names,
            ..Self::default()
        }
    }

    /// Number of well-formed tool calls emitted so far.
    pub fn calls_seen(&self) -> usize {
        self.calls_seen
    }

    /// Feeds more model output; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<Segment> {
        self.pending.push_str(text);
        if self.bare_possible {
            if !self.pending.contains(OPEN) && could_be_bare(&self.pending) {
                return Vec::new();
            }
            self.bare_possible = false;
        }
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Text => match self.pending.find(OPEN) {
                    Some(at) => {
                        let before = &self.pending[..at];
                        let said = before.trim_end();
                        if !said.is_empty() {
                            out.push(Segment::Content(said.to_string()));
                        }
                        self.held_ws = before[said.len()..].to_string();
                        self.pending.drain(..at + OPEN.len());
                        self.state = State::InCall;
                    }
                    None => {
                        // Hold a possible start of `<tool_call>` and trailing whitespace.
                        let keep = partial_suffix_len(&self.pending, OPEN);
                        let ready = &self.pending[..self.pending.len() - keep];
                        let emit_len = ready.trim_end().len();
                        if emit_len > 0 {
                            out.push(Segment::Content(self.pending[..emit_len].to_string()));
                            self.pending.drain(..emit_len);
                        }
                        return out;
                    }
                },
                State::InCall => match self.pending.find(CLOSE) {
                    Some(at) => {
                        let body = self.pending[..at].to_string();
                        self.pending.drain(..at + CLOSE.len());
                        self.state = State::Text;
                        let ws = std::mem::take(&mut self.held_ws);
                        match parse_call(&body) {
                            Some(call) => {
                                self.calls_seen += 1;
                                out.push(Segment::ToolCall(call));
                            }
                            None => out.push(Segment::Content(format!("{ws}{OPEN}{body}{CLOSE}"))),
                        }
                    }
                    None => return out,
                },
            }
        }
    }

    /// Ends the stream: held text is released; an unclosed call comes back verbatim.
    /// Whitespace left after the last well-formed call is dropped.
    pub fn finish(&mut self) -> Vec<Segment> {
        if std::mem::take(&mut self.bare_possible) {
            if let Some(calls) = parse_bare(&self.pending, &self.tool_names) {
                self.pending.clear();
                self.calls_seen += calls.len();
                return calls.into_iter().map(Segment::ToolCall).collect();
            }
        }
        let rest = std::mem::take(&mut self.pending);
        let ws = std::mem::take(&mut self.held_ws);
        match std::mem::take(&mut self.state) {
            State::Text if rest.is_empty() || (self.calls_seen > 0 && rest.trim().is_empty()) => {
                vec![]
            }
            State::Text => vec![Segment::Content(rest)],
            State::InCall => vec![Segment::Content(format!("{ws}{OPEN}{rest}"))],
        }
    }
}

/// Parses a whole output at once (non-streamed responses).
pub fn parse_all(text: &str) -> Vec<Segment> {
    parse_all_with(ToolCallParser::new(), text)
}

/// Parses a whole output with a configured parser.
pub fn parse_all_with(mut p: ToolCallParser, text: &str) -> Vec<Segment> {
    let mut out = p.push(text);
    out.extend(p.finish());
    merge_content(out)
}

/// Joins adjacent content segments.
pub fn merge_content(segments: Vec<Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(segments.len());
    for s in segments {
        match (out.last_mut(), s) {
            (Some(Segment::Content(a)), Segment::Content(b)) => a.push_str(&b),
            (_, s) => out.push(s),
        }
    }
    out
}

/// Whether a reply that begins with `text` may still be a bare JSON call.
fn could_be_bare(text: &str) -> bool {
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
fn parse_bare(text: &str, tool_names: &[String]) -> Option<Vec<ParsedToolCall>> {
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
        .all(|c| tool_names.iter().any(|n| n == &c.name))
        .then_some(calls)
}

/// Length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix_len(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// `{"name": "...", "arguments": {...}}` (arguments may also be a JSON string holding an
/// object, or absent); anything else is not a call.
fn parse_call(body: &str) -> Option<ParsedToolCall> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Segment {
        Segment::ToolCall(ParsedToolCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

    fn content(s: &str) -> Segment {
        Segment::Content(s.into())
    }

    /// Feeds `text` split at every pair of char boundaries (also one char at a time) and checks
    /// each split gives the same merged segments as the one-shot parse.
    fn check_all_splits(text: &str, expected: &[Segment]) {
        assert_eq!(parse_all(text), expected, "one shot: {text:?}");
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            for &j in bounds.iter().filter(|&&j| j >= i) {
                let mut p = ToolCallParser::new();
                let mut out = p.push(&text[..i]);
                out.extend(p.push(&text[i..j]));
                out.extend(p.push(&text[j..]));
                out.extend(p.finish());
                assert_eq!(merge_content(out), expected, "split at {i},{j}: {text:?}");
            }
        }
        let mut p = ToolCallParser::new();
        let mut out = Vec::new();
        for ch in text.chars() {
            out.extend(p.push(ch.encode_utf8(&mut [0; 4])));
        }
        out.extend(p.finish());
        assert_eq!(merge_content(out), expected, "char by char: {text:?}");
    }

    #[test]
    fn bare_json_calls_naming_offered_tools_are_calls() {
        let tools = || ToolCallParser::with_tools(vec!["get_weather".into()]);
        let want = vec![call("get_weather", r#"{"city":"Paris"}"#)];
        for text in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```",
            r#"  [{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
        ] {
            assert_eq!(parse_all_with(tools(), text), want, "{text}");
            // Streamed byte by byte gives the same.
            let mut p = tools();
            let mut out = Vec::new();
            for (i, _) in text.char_indices() {
                let end = text[i..].chars().next().map_or(i, |c| i + c.len_utf8());
                out.extend(p.push(&text[i..end]));
            }
            out.extend(p.finish());
            assert_eq!(merge_content(out), want, "streamed {text}");
        }
        // Unknown tool names, other JSON, other fences and prose stay content.
        for text in [
            r#"{"name": "rm_rf", "arguments": {}}"#,
            r#"{"answer": 42}"#,
            "```python\nprint(1)\n```",
            "Sure! {\"name\": \"get_weather\"}",
        ] {
            assert_eq!(parse_all_with(tools(), text), vec![content(text)], "{text}");
        }
    }

    #[test]
    fn plain_text_passes_through() {
        check_all_splits(
            "Hello, world! a < b and <tool> is fine",
            &[content("Hello, world! a < b and <tool> is fine")],
        );
        check_all_splits("ends with <tool_ca", &[content("ends with <tool_ca")]);
        check_all_splits("héllo ✓ <", &[content("héllo ✓ <")]);
        check_all_splits("\n", &[content("\n")]);
        check_all_splits("", &[]);
    }

    #[test]
    fn single_call() {
        check_all_splits(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &[call("get_weather", r#"{"city":"Paris"}"#)],
        );
    }

    #[test]
    fn content_then_calls() {
        check_all_splits(
            "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n",
            &[content("Let me check."), call("a", "{}"), call("b", r#"{"x":[1,2]}"#)],
        );
    }

    #[test]
    fn text_after_call_is_content() {
        check_all_splits(
            "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"ü\"}}</tool_call> done",
            &[call("a", r#"{"k":"ü"}"#), content(" done")],
        );
    }

    #[test]
    fn malformed_call_stays_content() {
        let bad = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>";
        check_all_splits(bad, &[content(bad)]);
        let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
        check_all_splits(no_name, &[content(no_name)]);
        let not_object = "<tool_call>[1, 2]</tool_call>";
        check_all_splits(not_object, &[content(not_object)]);
        let bad_args = "<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>";
        check_all_splits(bad_args, &[content(bad_args)]);
    }

    #[test]
    fn unclosed_call_stays_content() {
        let text = "Sure <tool_call>\n{\"name\": \"a\", \"arguments\": {}}";
        check_all_splits(text, &[content(text)]);
        check_all_splits("<tool_call>", &[content("<tool_call>")]);
    }

    #[test]
    fn malformed_then_good() {
        check_all_splits(
            "<tool_call>oops</tool_call><tool_call>{\"name\":\"f\"}</tool_call>",
            &[content("<tool_call>oops</tool_call>"), call("f", "{}")],
        );
    }

    #[test]
    fn string_arguments_are_accepted_when_they_hold_an_object() {
        check_all_splits(
            r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#,
            &[call("f", r#"{"a":1}"#)],
        );
        let bad = r#"<tool_call>{"name": "f", "arguments": "nope"}</tool_call>"#;
        check_all_splits(bad, &[content(bad)]);
    }

    #[test]
    fn partial_marker_is_held_then_released() {
        let mut p = ToolCallParser::new();
        assert_eq!(p.push("hi <tool"), vec![content("hi")]);
        assert_eq!(p.push("box>"), vec![content(" <toolbox>")]);
        assert_eq!(p.finish(), vec![]);
    }

    #[test]
    fn whitespace_around_malformed_calls_is_kept() {
        let text = "a \n<tool_call>bad</tool_call> b <tool_call>{\"name\":\"y\"";
        check_all_splits(text, &[content(text)]);
    }

    #[test]
    fn whitespace_is_held_not_lost() {
        let mut p = ToolCallParser::new();
        assert_eq!(p.push("\n\n"), vec![]);
        assert_eq!(p.push("Hi"), vec![content("\n\nHi")]);
        assert_eq!(p.calls_seen(), 0);
    }

    #[test]
    fn random_splits_of_a_long_mixed_text() {
        let text = "A <b> c\n<tool_call>\n{\"name\": \"x\", \"arguments\": {\"q\": \"</tool\"}}\n</tool_call>\nmid <tool_call>bad</tool_call> end <tool_call>{\"name\":\"y\",\"arguments\":{}}";
        let expected = parse_all(text);
        assert_eq!(expected[0], content("A <b> c"));
        assert_eq!(expected[1], call("x", r#"{"q":"</tool"}"#));
        check_all_splits(text, &expected);
    }
}
