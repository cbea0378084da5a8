//! Tool calls in model output, in every form Qwen-family models write them:
//!
//! - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3; [`json_form`]);
//! - `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>…</function></tool_call>`
//!   (Qwen3-Coder, Qwen3.5, and what agent clients such as Qwen Code teach; [`xml_form`]), also
//!   without the `<tool_call>` tags;
//! - a bare JSON reply naming an offered tool (Qwen2.5-Coder's habit).
//!
//! [`ToolCallParser`] is a streaming parser: text goes in as the engine produces it, in any
//! split, and comes out as [`Segment`]s — plain content, or a complete parsed call. It holds
//! back only text that may still turn out to be a call: a suffix that is a prefix of an opening
//! marker, the inside of an open call, and whitespace around calls (so a reply made of calls
//! has no stray `"\n"` content). Nothing the model writes is an error: a call that does not
//! parse comes back verbatim as content. A closing tag missing at the very end of a reply that
//! ended by itself is forgiven; a reply cut short by the token limit is not (its last value may
//! be truncated).
//!
//! The same parser serves non-streamed responses (push everything, then finish), so both paths
//! give the same result for the same text.

mod json_form;
mod xml_form;

use serde_json::Value;
use xml_form::{FUNCTION_CLOSE, FUNCTION_OPEN};

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

/// An offered tool: its name and its parameters' JSON-schema types (which type XML values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: String,
    /// (parameter, its `type`; `"any"` when the schema gives none or several non-null ones).
    params: Vec<(String, String)>,
}

impl ToolSpec {
    /// The specs of OpenAI `tools` entries (`{"type": "function", "function": {...}}`); entries
    /// without a name are skipped.
    pub fn from_tools(tools: &[Value]) -> Vec<ToolSpec> {
        tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let params = f
                    .pointer("/parameters/properties")
                    .and_then(Value::as_object)
                    .map(|props| {
                        props
                            .iter()
                            .map(|(k, schema)| (k.clone(), schema_type(schema)))
                            .collect()
                    })
                    .unwrap_or_default();
                Some(ToolSpec { name, params })
            })
            .collect()
    }

    /// The declared type of parameter `key`, `None` if the tool does not declare it.
    pub fn param_type(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t.as_str())
    }

    /// The declared parameter `key` names: itself when declared, else the one declared
    /// parameter that equals it ignoring ASCII case (`New_string` for `new_string`, a slip
    /// seen in real replies); `None` when there is none or more than one.
    pub fn resolve_param<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        if self.param_type(key).is_some() {
            return Some(key);
        }
        let mut found = self
            .params
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(key));
        match (found.next(), found.next()) {
            (Some((k, _)), None) => Some(k.as_str()),
            _ => None,
        }
    }
}

/// `"type": "string"`, or the one non-null type of `"type": ["integer", "null"]`; else "any".
fn schema_type(schema: &Value) -> String {
    match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => {
            let non_null: Vec<&str> = ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect();
            match non_null.as_slice() {
                [one] => one.to_string(),
                _ => "any".into(),
            }
        }
        _ => "any".into(),
    }
}

/// How the reply ended: by itself (a missing closing tag at the end is forgiven), or cut by
/// the token limit (an open call stays content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Stopped,
    Cut,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Plain text; `pending` may end with a partial opening marker or be held whitespace.
    #[default]
    Text,
    /// Inside `<tool_call>`; `pending` holds the body seen so far.
    Tagged,
    /// Inside an untagged `<function=`; `pending` holds the block from its opening marker.
    Function,
}

/// Streaming tool-call parser (see the module doc).
#[derive(Debug, Default)]
pub struct ToolCallParser {
    state: State,
    /// Text not yet emitted: trailing whitespace and a partial marker in `Text`, the call
    /// body in the other states.
    pending: String,
    /// Whitespace between the content and an open call: dropped if the call parses, given
    /// back if it does not.
    held_ws: String,
    calls_seen: usize,
    /// The offered tools (untagged calls must name one of them; XML values are typed by them).
    tools: Vec<ToolSpec>,
    /// Nothing emitted yet and the reply so far could still be a bare JSON call.
    bare_possible: bool,
    /// An untagged function call just ended: a `</tool_call>` right after it (whitespace
    /// aside) closes a tag the model never opened, and is dropped.
    stray_close_possible: bool,
}

impl ToolCallParser {
    /// A parser for tagged calls only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that also recognises untagged calls naming one of `tools`.
    pub fn with_tools(tools: Vec<ToolSpec>) -> Self {
        Self {
            bare_possible: !tools.is_empty(),
            tools,
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
            let tagged = self.pending.contains(OPEN) || self.pending.contains(FUNCTION_OPEN);
            if !tagged && json_form::could_be_bare(&self.pending) {
                return Vec::new();
            }
            self.bare_possible = false;
        }
        let mut out = Vec::new();
        loop {
            let progressed = match self.state {
                State::Text => self.step_text(&mut out),
                State::Tagged => self.step_call(CLOSE, &mut out),
                State::Function => self.step_call(FUNCTION_CLOSE, &mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// Plain text: emits what cannot start a call; enters a call at its opening marker.
    fn step_text(&mut self, out: &mut Vec<Segment>) -> bool {
        if self.stray_close_possible {
            let t = self.pending.trim_start();
            if let Some(after) = t.strip_prefix(CLOSE) {
                self.pending = after.to_string();
                self.stray_close_possible = false;
                return true;
            }
            if CLOSE.starts_with(t) {
                return false; // wait: it may still become `</tool_call>`
            }
            self.stray_close_possible = false;
        }
        let opening = [OPEN, FUNCTION_OPEN]
            .iter()
            .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
            .min_by_key(|&(at, _)| at);
        match opening {
            Some((at, marker)) => {
                let before = &self.pending[..at];
                let said = before.trim_end();
                if !said.is_empty() {
                    out.push(Segment::Content(said.to_string()));
                }
                self.held_ws = before[said.len()..].to_string();
                if marker == OPEN {
                    self.pending.drain(..at + OPEN.len());
                    self.state = State::Tagged;
                } else {
                    self.pending.drain(..at);
                    self.state = State::Function;
                }
                true
            }
            None => {
                // Hold a possible start of a marker and trailing whitespace.
                let keep = partial_suffix_len(&self.pending, OPEN)
                    .max(partial_suffix_len(&self.pending, FUNCTION_OPEN));
                let ready = &self.pending[..self.pending.len() - keep];
                let emit_len = ready.trim_end().len();
                if emit_len > 0 {
                    out.push(Segment::Content(self.pending[..emit_len].to_string()));
                    self.pending.drain(..emit_len);
                }
                false
            }
        }
    }

    /// Inside a call: once `close` arrives, parses the call or gives it back as content.
    fn step_call(&mut self, close: &str, out: &mut Vec<Segment>) -> bool {
        let Some(at) = self.pending.find(close) else {
            return false;
        };
        let state = std::mem::take(&mut self.state);
        let (body, verbatim) = if state == State::Tagged {
            let body = self.pending[..at].to_string();
            let verbatim = format!("{OPEN}{body}{CLOSE}");
            (body, verbatim)
        } else {
            let block = self.pending[..at + close.len()].to_string();
            (block.clone(), block)
        };
        self.pending.drain(..at + close.len());
        self.emit_call(state, &body, verbatim, out);
        true
    }

    /// Parses a finished call body; content (with its held whitespace) if it is not a call.
    fn emit_call(&mut self, state: State, body: &str, verbatim: String, out: &mut Vec<Segment>) {
        let ws = std::mem::take(&mut self.held_ws);
        let calls = match state {
            State::Tagged => self.parse_tagged(body),
            _ => xml_form::parse_functions(body, &self.tools, true),
        };
        match calls {
            Some(calls) => {
                self.calls_seen += calls.len();
                self.stray_close_possible = state == State::Function;
                out.extend(calls.into_iter().map(Segment::ToolCall));
            }
            None => out.push(Segment::Content(format!("{ws}{verbatim}"))),
        }
    }

    /// A `<tool_call>` body: JSON, or one or more XML functions (any name: the tag says it is
    /// meant as a call).
    fn parse_tagged(&self, body: &str) -> Option<Vec<ParsedToolCall>> {
        let t = body.trim();
        if t.starts_with('{') {
            json_form::parse_call(t).map(|c| vec![c])
        } else {
            xml_form::parse_functions(t, &self.tools, false)
        }
    }

    /// Ends the stream: held text is released. An unclosed call is parsed as it stands if the
    /// reply ended by itself, else it comes back verbatim. Whitespace left after the last
    /// well-formed call is dropped.
    pub fn finish(&mut self, end: End) -> Vec<Segment> {
        if std::mem::take(&mut self.bare_possible) {
            if let Some(calls) = json_form::parse_bare(&self.pending, &self.tools) {
                self.pending.clear();
                self.calls_seen += calls.len();
                return calls.into_iter().map(Segment::ToolCall).collect();
            }
        }
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Text if rest.is_empty() || (self.calls_seen > 0 && rest.trim().is_empty()) => {}
            State::Text => out.push(Segment::Content(rest)),
            State::Tagged | State::Function => {
                let state = self.state;
                let verbatim = if state == State::Tagged {
                    format!("{OPEN}{rest}")
                } else {
                    rest.clone()
                };
                if end == End::Stopped {
                    self.emit_call(state, &rest, verbatim, &mut out);
                } else {
                    let ws = std::mem::take(&mut self.held_ws);
                    out.push(Segment::Content(format!("{ws}{verbatim}")));
                }
            }
        }
        self.state = State::Text;
        out
    }
}

/// Parses a whole reply that ended by itself (non-streamed responses, tests).
pub fn parse_all(text: &str) -> Vec<Segment> {
    parse_all_with(ToolCallParser::new(), text, End::Stopped)
}

/// Parses a whole reply with a configured parser.
pub fn parse_all_with(mut p: ToolCallParser, text: &str, end: End) -> Vec<Segment> {
    let mut out = p.push(text);
    out.extend(p.finish(end));
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

#[cfg(test)]
mod tests;
