//! Chat templates: HF Jinja templates rendered with minijinja, configured like HF's
//! `apply_chat_template` (trim_blocks, lstrip_blocks, no autoescape, Python string methods, a
//! `tojson` that prints like `json.dumps`) and called like llama.cpp's server does.

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde_json::Value;

use crate::TemplateError;

const TEMPLATE_NAME: &str = "chat";
/// Marks errors that come from the template's own `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The template prints tool-call arguments as JSON objects (`arguments | tojson`), so string
    /// arguments (OpenAI wire format) must be parsed first (llama.cpp's minja does the same).
    requires_object_arguments: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("requires_object_arguments", &self.requires_object_arguments)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; `bos_token` / `eos_token` are the texts the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // HF renders with trim_blocks and lstrip_blocks on; so do llama.cpp's engines.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let mut template = Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            requires_object_arguments: false,
        };
        template.requires_object_arguments = template.probe_object_arguments();
        Ok(template)
    }

    /// Render a conversation as llama.cpp's server does: when the last message is the
    /// assistant's (and calls no tools), it is left open for the model to continue: rendered
    /// with a generation prompt, its content appended, no end-of-turn.
    pub fn apply(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let prefill = messages.last().filter(|m| {
            m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("tool_calls")
                    .and_then(Value::as_array)
                    .is_none_or(|c| c.is_empty())
        });
        match prefill {
            Some(last) => {
                let mut out = self.render(&messages[..messages.len() - 1], tools, true)?;
                out.push_str(&content_text(last.get("content")));
                Ok(out)
            }
            None => self.render(messages, tools, add_generation_prompt),
        }
    }

    /// Render the template as is (HF `apply_chat_template` semantics).
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let messages: Vec<Value> = if self.requires_object_arguments {
            messages.iter().map(parse_string_arguments).collect()
        } else {
            messages.to_vec()
        };
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => JValue::from_serialize(&messages),
            tools => tools.map(JValue::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template.render(ctx).map_err(|e| {
            let detail = e.detail().unwrap_or_default();
            match detail.strip_prefix(RAISED) {
                Some(msg) if e.kind() == ErrorKind::InvalidOperation => {
                    TemplateError::Raised(msg.to_string())
                }
                _ => TemplateError::Render(describe(&e)),
            }
        })
    }

    /// Whether the template prints tool-call arguments only when given as objects (minja's
    /// `requires_object_arguments` probe).
    fn probe_object_arguments(&self) -> bool {
        let render_with = |arguments: Value| {
            let messages = [
                serde_json::json!({"role": "user", "content": "Hey"}),
                serde_json::json!({"role": "assistant", "content": "", "tool_calls": [{
                    "id": "call_1___", "type": "function",
                    "function": {"name": "ipython", "arguments": arguments}
                }]}),
            ];
            let out = self
                .env
                .get_template(TEMPLATE_NAME)
                .and_then(|t| {
                    t.render(minijinja::context! {
                        messages => JValue::from_serialize(&messages),
                        add_generation_prompt => false,
                        bos_token => self.bos_token.as_str(),
                        eos_token => self.eos_token.as_str(),
                    })
                })
                .unwrap_or_default();
            out.contains("\"argument_needle\":") || out.contains("'argument_needle':")
        };
        let args = serde_json::json!({"argument_needle": "print('Hello, World!')"});
        let renders_str = render_with(Value::String(args.to_string()));
        let renders_obj = render_with(args);
        !renders_str && renders_obj
    }
}

fn describe(e: &Error) -> String {
    match (e.detail(), e.line()) {
        (Some(d), Some(line)) => format!("{} (line {line}): {d}", e.kind()),
        (Some(d), None) => format!("{}: {d}", e.kind()),
        _ => e.to_string(),
    }
}

/// Text of a message's content: a string, or the concatenated text parts.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Replace JSON-string tool-call arguments by the parsed value, where they parse.
fn parse_string_arguments(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            let target = match call.get_mut("function") {
                Some(f) if f.is_object() => f,
                _ => call,
            };
            if let Some(Value::String(s)) = target.get("arguments") {
                if let Ok(parsed) = serde_json::from_str::<Value>(s) {
                    target["arguments"] = parsed;
                }
            }
        }
    }
    message
}

fn raise_exception(message: String) -> Result<JValue, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// `tojson` as HF defines it for templates: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=None, sort_keys=sort_keys)`. minijinja's own filter prints compact JSON and escapes
/// HTML characters, which would change the prompt.
fn tojson(value: JValue, kwargs: Kwargs) -> Result<JValue, Error> {
    let indent: Option<JValue> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int")
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        }
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    let opts = DumpOptions {
        indent,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    dump(&json, &opts, 0, &mut out);
    Ok(JValue::from(out))
}

struct DumpOptions {
    indent: Option<String>,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// Python `json.dumps` formatting: `", "` / `": "` separators, or `","` plus newlines when
/// indenting.
fn dump(v: &Value, opts: &DumpOptions, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    let item_sep = if opts.indent.is_some() { "," } else { ", " };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => dump_str(s, opts.ensure_ascii, out),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dump(item, opts, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dump_str(k, opts.ensure_ascii, out);
                out.push_str(": ");
                dump(item, opts, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn dump_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `strftime_now(fmt)`: the current UTC time, for templates that print today's date. Supports
/// the directives templates use (%Y %m %d %H %M %S %B %b %A %a %y %e %j %%).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(secs, &format)
}

fn strftime(unix_secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let rem = unix_secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tojson_matches_python_json_dumps() {
        let v = json!({"b": [1, 2.5, "x\"y\n"], "a": {}, "c": null, "é": true});
        let mut out = String::new();
        let opts = DumpOptions {
            indent: None,
            ensure_ascii: false,
            sort_keys: false,
        };
        dump(&v, &opts, 0, &mut out);
        assert_eq!(
            out,
            r#"{"b": [1, 2.5, "x\"y\n"], "a": {}, "c": null, "é": true}"#
        );
        let mut out = String::new();
        let opts = DumpOptions {
            indent: Some("  ".into()),
            ensure_ascii: true,
            sort_keys: false,
        };
        dump(&json!({"k": [1], "é": "😀"}), &opts, 0, &mut out);
        assert_eq!(
            out,
            "{\n  \"k\": [\n    1\n  ],\n  \"\\u00e9\": \"\\ud83d\\ude00\"\n}"
        );
    }

    #[test]
    fn strftime_formats_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            strftime(1_709_211_909, "%Y-%m-%d %H:%M:%S %a %b %d %B %j"),
            "2024-02-29 13:05:09 Thu Feb 29 February 060"
        );
    }

    #[test]
    fn raise_exception_is_a_typed_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        match t.render(&[], None, false) {
            Err(TemplateError::Raised(msg)) => assert_eq!(msg, "no system role"),
            other => panic!("expected Raised, got {other:?}"),
        }
        assert!(matches!(
            ChatTemplate::new("{% if %}", "", ""),
            Err(TemplateError::Syntax(_))
        ));
    }

    #[test]
    fn python_string_methods_and_prefill() {
        let src = "{% for m in messages %}{{ m.role.upper() }}:{{ m.content.strip() }}{% if not loop.last or add_generation_prompt %};{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [
            json!({"role": "user", "content": "  hi  "}),
            json!({"role": "assistant", "content": "Sure"}),
        ];
        assert_eq!(
            t.render(&msgs, None, false).unwrap(),
            "USER:hi;ASSISTANT:Sure"
        );
        assert_eq!(t.apply(&msgs, None, false).unwrap(), "USER:hi;A:Sure");
    }
}
