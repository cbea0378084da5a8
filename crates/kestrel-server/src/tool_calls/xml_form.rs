//! Qwen3-Coder's XML call form, which Qwen3-Coder and Qwen3.5 write natively and which agent
//! clients (Qwen Code) teach in their system prompts:
//!
//! ```text
//! <function=edit>
//! <parameter=file_path>
//! /src/calc.py
//! </parameter>
//! <parameter=count>
//! 2
//! </parameter>
//! </function>
//! ```
//!
//! Values are raw text (one newline after the opening tag and one before the closing tag are
//! layout, not value), typed by the tool's JSON schema: a string stays the string verbatim;
//! integers, numbers, booleans, arrays and objects are parsed. Slips whose intent is plain are
//! repaired: `<parameter>NAME>` for `<parameter=NAME>`, a parameter name that differs from a
//! declared one only in ASCII case (when exactly one matches), a missing `</parameter>` before
//! the next parameter or `</function>`, a missing `</function>` at the end of the body. Anything
//! else (text between parameters, a name that is not an identifier) is not a call.

use serde_json::{Map, Number, Value};

use super::{ParsedToolCall, ToolSpec};

pub(super) const FUNCTION_OPEN: &str = "<function=";
pub(super) const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter";
const PARAM_CLOSE: &str = "</parameter>";

/// Parses one or more `<function=...>` blocks making up all of `body` (whitespace aside).
/// `offered_only`: the function must name one of `tools` (untagged calls, where plain prose
/// must not be mistaken for a call).
pub(super) fn parse_functions(
    body: &str,
    tools: &[ToolSpec],
    offered_only: bool,
) -> Option<Vec<ParsedToolCall>> {
    let mut rest = body.trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let (call, after) = parse_function(rest, tools, offered_only)?;
        calls.push(call);
        rest = after.trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// One function block at the start of `text`; returns the call and the text after it.
fn parse_function<'a>(
    text: &'a str,
    tools: &[ToolSpec],
    offered_only: bool,
) -> Option<(ParsedToolCall, &'a str)> {
    let after_open = text.strip_prefix(FUNCTION_OPEN)?;
    let (name, mut rest) = after_open.split_once('>')?;
    let name = name.trim();
    if !is_identifier(name) {
        return None;
    }
    let spec = tools.iter().find(|t| t.name == name);
    if offered_only && spec.is_none() {
        return None;
    }
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(FUNCTION_CLOSE) {
            rest = after;
            break;
        }
        if rest.is_empty() {
            break; // `</function>` missing at the end of the body
        }
        let (key, raw, after) = parse_parameter(rest, spec)?;
        // a declared name in another case is the declared one; an undeclared name stays
        let key = spec.and_then(|s| s.resolve_param(key)).unwrap_or(key);
        args.insert(
            key.to_string(),
            typed_value(raw, spec.and_then(|s| s.param_type(key))),
        );
        rest = after;
    }
    let arguments = serde_json::to_string(&args).ok()?;
    Some((
        ParsedToolCall {
            name: name.to_string(),
            arguments,
        },
        rest,
    ))
}

/// `<parameter=KEY>VALUE</parameter>` at the start of `text`: (key, raw value, rest).
fn parse_parameter<'a>(
    text: &'a str,
    spec: Option<&ToolSpec>,
) -> Option<(&'a str, &'a str, &'a str)> {
    let after = text.strip_prefix(PARAM_OPEN)?;
    let (key, body) = if let Some(a) = after.strip_prefix('=') {
        a.split_once('>')?
    } else if let Some(a) = after.strip_prefix('>') {
        // The slip `<parameter>KEY>`: taken only when KEY is one of the tool's parameters, or
        // an identifier when the tool's schema is unknown.
        let (key, body) = a.split_once('>')?;
        let known = spec.is_none_or(|s| s.resolve_param(key.trim()).is_some());
        if !known {
            return None;
        }
        (key, body)
    } else {
        return None;
    };
    let key = key.trim();
    if !is_identifier(key) {
        return None;
    }
    // The value ends at `</parameter>`, or (that tag missing) at the next parameter or the end
    // of the function, whichever comes first.
    let ends = [PARAM_CLOSE, PARAM_OPEN, FUNCTION_CLOSE];
    let (end, marker) = ends
        .iter()
        .filter_map(|m| body.find(m).map(|at| (at, *m)))
        .min_by_key(|&(at, _)| at)
        .unwrap_or((body.len(), ""));
    let raw = &body[..end];
    let rest = if marker == PARAM_CLOSE {
        &body[end + PARAM_CLOSE.len()..]
    } else {
        &body[end..]
    };
    Some((key, strip_layout_newlines(raw), rest))
}

/// Drops the one newline after the opening tag and the one before the closing tag.
fn strip_layout_newlines(raw: &str) -> &str {
    let v = raw
        .strip_prefix("\r\n")
        .or_else(|| raw.strip_prefix('\n'))
        .unwrap_or(raw);
    v.strip_suffix("\r\n")
        .or_else(|| v.strip_suffix('\n'))
        .unwrap_or(v)
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// The JSON value of a raw parameter, by the schema's type (`None`: parameter not declared).
fn typed_value(raw: &str, ty: Option<&str>) -> Value {
    let string = || Value::String(raw.to_string());
    let t = raw.trim();
    match ty {
        None | Some("string") => string(),
        Some("integer") => t
            .parse::<i64>()
            .map(Value::from)
            .or_else(|_| t.parse::<u64>().map(Value::from))
            .unwrap_or_else(|_| string()),
        Some("number") => serde_json::from_str::<Number>(t)
            .map(Value::Number)
            .unwrap_or_else(|_| string()),
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => string(),
        },
        Some("null") if t == "null" => Value::Null,
        Some("object") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Object(_)) => v,
            _ => string(),
        },
        Some("array") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Array(_)) => v,
            _ => string(),
        },
        // Declared without a usable type (anyOf, enum only, ...): JSON if it is JSON.
        Some(_) => serde_json::from_str::<Value>(t).unwrap_or_else(|_| string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<ToolSpec> {
        ToolSpec::from_tools(&[json!({"type": "function", "function": {
            "name": "edit",
            "parameters": {"type": "object", "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
                "expected_replacements": {"type": "number"},
                "limit": {"type": ["integer", "null"]},
                "paths": {"type": "array", "items": {"type": "string"}},
                "opts": {"type": "object"},
                "mode": {"enum": ["a", "b"]}
            }}
        }})])
    }

    fn args(body: &str) -> Value {
        let calls = parse_functions(body, &tools(), true).expect(body);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "edit");
        serde_json::from_str(&calls[0].arguments).unwrap()
    }

    #[test]
    fn values_are_typed_by_the_schema() {
        let a = args(
            "<function=edit>\n<parameter=file_path>\n/a b/calc.py\n</parameter>\n\
             <parameter=old_string>\n  return a - b\n\n</parameter>\n\
             <parameter=replace_all>\nTrue\n</parameter>\n\
             <parameter=expected_replacements>\n1.5\n</parameter>\n\
             <parameter=limit>\n12\n</parameter>\n\
             <parameter=paths>\n[\"x\", \"y\"]\n</parameter>\n\
             <parameter=opts>\n{\"k\": 1}\n</parameter>\n\
             <parameter=mode>\n\"a\"\n</parameter>\n</function>",
        );
        assert_eq!(
            a,
            json!({"file_path": "/a b/calc.py", "old_string": "  return a - b\n",
                   "replace_all": true, "expected_replacements": 1.5, "limit": 12,
                   "paths": ["x", "y"], "opts": {"k": 1}, "mode": "a"})
        );
    }

    #[test]
    fn strings_stay_verbatim_even_when_they_look_like_json() {
        let a = args("<function=edit><parameter=new_string>42</parameter><parameter=old_string>{\"a\": 1}</parameter></function>");
        assert_eq!(a, json!({"new_string": "42", "old_string": "{\"a\": 1}"}));
    }

    #[test]
    fn ill_typed_values_stay_strings() {
        let a = args("<function=edit><parameter=limit>ten</parameter><parameter=paths>x</parameter></function>");
        assert_eq!(a, json!({"limit": "ten", "paths": "x"}));
    }

    #[test]
    fn slips_with_plain_intent_are_repaired() {
        // `<parameter>KEY>` for `<parameter=KEY>`.
        let a = args("<function=edit>\n<parameter=file_path>\nc.py\n</parameter>\n<parameter>old_string>\na - b\n</parameter>\n</function>");
        assert_eq!(a, json!({"file_path": "c.py", "old_string": "a - b"}));
        // Missing `</parameter>` before the next parameter and before `</function>`.
        let a = args("<function=edit>\n<parameter=file_path>\nc.py\n<parameter=new_string>\na + b\n</function>");
        assert_eq!(a, json!({"file_path": "c.py", "new_string": "a + b"}));
        // Missing `</function>` at the end.
        let a = args("<function=edit>\n<parameter=file_path>\nc.py\n</parameter>\n");
        assert_eq!(a, json!({"file_path": "c.py"}));
        // A declared name in another case (with and without the `>` slip), typed as declared.
        let a = args("<function=edit>\n<parameter>New_string>\na + b\n</parameter>\n<parameter=Replace_All>\ntrue\n</parameter>\n</function>");
        assert_eq!(a, json!({"new_string": "a + b", "replace_all": true}));
    }

    #[test]
    fn a_case_insensitive_name_must_match_one_declared_parameter() {
        let t = ToolSpec::from_tools(&[json!({"type": "function", "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string"}, "Path": {"type": "string"}, "n": {"type": "integer"}
            }}
        }})]);
        // `PATH` could be `path` or `Path`: kept as written, and the `>` slip is not taken
        let calls = parse_functions(
            "<function=f><parameter=PATH>x</parameter></function>",
            &t,
            true,
        )
        .unwrap();
        assert_eq!(calls[0].arguments, r#"{"PATH":"x"}"#);
        assert!(parse_functions(
            "<function=f><parameter>PATH>x</parameter></function>",
            &t,
            true
        )
        .is_none());
        let calls = parse_functions(
            "<function=f><parameter=N>3</parameter></function>",
            &t,
            true,
        )
        .unwrap();
        assert_eq!(calls[0].arguments, r#"{"n":3}"#);
    }

    #[test]
    fn ambiguous_forms_are_not_calls() {
        let t = tools();
        for body in [
            "<function=edit>\nsome prose\n</function>",
            "<function=not an id>\n</function>",
            "<function=edit>\n<parameter>unknown_key>\nx\n</parameter>\n</function>",
            "<function=edit><parameter=a b>x</parameter></function>",
            "<function=edit",
            "",
        ] {
            assert_eq!(parse_functions(body, &t, true), None, "{body:?}");
        }
        // Untagged calls must name an offered tool; tagged ones need not.
        let other = "<function=shell><parameter=cmd>ls</parameter></function>";
        assert_eq!(parse_functions(other, &t, true), None);
        let calls = parse_functions(other, &t, false).unwrap();
        assert_eq!(calls[0].arguments, r#"{"cmd":"ls"}"#);
    }

    #[test]
    fn several_functions_in_one_body() {
        let calls = parse_functions(
            "<function=edit><parameter=file_path>a</parameter></function>\n<function=edit><parameter=file_path>b</parameter></function>",
            &tools(),
            true,
        )
        .unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"file_path":"b"}"#);
    }
}
