use super::*;
use serde_json::json;

fn weather_tool() -> Vec<ToolSpec> {
    ToolSpec::from_tools(&[
        json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
    ])
}

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
            out.extend(p.finish(End::Stopped));
            assert_eq!(merge_content(out), expected, "split at {i},{j}: {text:?}");
        }
    }
    let mut p = ToolCallParser::new();
    let mut out = Vec::new();
    for ch in text.chars() {
        out.extend(p.push(ch.encode_utf8(&mut [0; 4])));
    }
    out.extend(p.finish(End::Stopped));
    assert_eq!(merge_content(out), expected, "char by char: {text:?}");
}

#[test]
fn bare_json_calls_naming_offered_tools_are_calls() {
    let tools = || ToolCallParser::with_tools(weather_tool());
    let want = vec![call("get_weather", r#"{"city":"Paris"}"#)];
    for text in [
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```",
        r#"  [{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
    ] {
        assert_eq!(parse_all_with(tools(), text, End::Stopped), want, "{text}");
        // Streamed byte by byte gives the same.
        let mut p = tools();
        let mut out = Vec::new();
        for (i, _) in text.char_indices() {
            let end = text[i..].chars().next().map_or(i, |c| i + c.len_utf8());
            out.extend(p.push(&text[i..end]));
        }
        out.extend(p.finish(End::Stopped));
        assert_eq!(merge_content(out), want, "streamed {text}");
    }
    // Unknown tool names, other JSON, other fences and prose stay content.
    for text in [
        r#"{"name": "rm_rf", "arguments": {}}"#,
        r#"{"answer": 42}"#,
        "```python\nprint(1)\n```",
        "Sure! {\"name\": \"get_weather\"}",
    ] {
        assert_eq!(
            parse_all_with(tools(), text, End::Stopped),
            vec![content(text)],
            "{text}"
        );
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
fn unclosed_call_at_the_end_is_forgiven_unless_cut() {
    let text = "Sure <tool_call>\n{\"name\": \"a\", \"arguments\": {}}";
    check_all_splits(text, &[content("Sure"), call("a", "{}")]);
    let cut = parse_all_with(ToolCallParser::new(), text, End::Cut);
    assert_eq!(cut, vec![content(text)]);
    check_all_splits("<tool_call>", &[content("<tool_call>")]);
    let truncated = "Sure <tool_call>\n{\"name\": \"a\", \"argum";
    check_all_splits(truncated, &[content(truncated)]);
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
    assert_eq!(p.finish(End::Stopped), vec![]);
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

/// Like [`check_all_splits`], with the weather tool offered.
fn check_all_splits_with_tools(text: &str, expected: &[Segment]) {
    let parser = || ToolCallParser::with_tools(weather_tool());
    assert_eq!(
        parse_all_with(parser(), text, End::Stopped),
        expected,
        "one shot: {text:?}"
    );
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &bounds {
        for &j in bounds.iter().filter(|&&j| j >= i).step_by(3) {
            let mut p = parser();
            let mut out = p.push(&text[..i]);
            out.extend(p.push(&text[i..j]));
            out.extend(p.push(&text[j..]));
            out.extend(p.finish(End::Stopped));
            assert_eq!(merge_content(out), expected, "split at {i},{j}: {text:?}");
        }
    }
}

#[test]
fn xml_calls_tagged_and_untagged() {
    let want = call("get_weather", r#"{"city":"Paris","days":3}"#);
    let body = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>";
    check_all_splits_with_tools(
        &format!("<tool_call>\n{body}\n</tool_call>"),
        std::slice::from_ref(&want),
    );
    check_all_splits_with_tools(body, std::slice::from_ref(&want));
    // The closing tag of a tag never opened is dropped.
    check_all_splits_with_tools(
        &format!("{body}\n</tool_call>"),
        std::slice::from_ref(&want),
    );
    check_all_splits_with_tools(
        &format!("I'll check.\n\n{body}\n{body}\nDone."),
        &[
            content("I'll check."),
            want.clone(),
            want.clone(),
            content("\nDone."),
        ],
    );
    // Missing `</function>` and `</tool_call>` at the end of a reply that stopped by itself.
    check_all_splits_with_tools(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n",
        std::slice::from_ref(&want),
    );
}

#[test]
fn untagged_xml_naming_an_unknown_tool_is_content() {
    let text = "Use <function=rm_rf><parameter=path>/</parameter></function> carefully";
    check_all_splits_with_tools(text, &[content(text)]);
    let prose = "In XML, write <function=NAME> to call a function.";
    check_all_splits_with_tools(prose, &[content(prose)]);
}

#[test]
fn xml_cut_by_the_token_limit_stays_content() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
    let out = parse_all_with(ToolCallParser::with_tools(weather_tool()), text, End::Cut);
    assert_eq!(out, vec![content(text)]);
}
