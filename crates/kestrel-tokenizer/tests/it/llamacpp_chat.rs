//! Chat templates render exactly as llama.cpp's `/apply-template`, and the prompt tokenizes to
//! its ids, on every case of chat_template_public.json.

use serde_json::Value;

use crate::common::{cases, first_diff, fixture, ids, model, MODELS};

#[test]
fn chat_templates_match_llamacpp_on_every_case() {
    let fx = fixture("chat_template_public.json");
    let mut failures = Vec::new();
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        let template = tok
            .chat_template()
            .expect("template compiles")
            .expect("model has a template");
        let (mut pass, mut total) = (0, 0);
        for case in cases(&fx).iter().filter(|c| c["model_key"] == key) {
            total += 1;
            let name = &case["name"];
            let messages = case["messages"].as_array().expect("messages");
            let tools = case["tools"].as_array().map(Vec::as_slice);
            let add_gen = case["add_generation_prompt"].as_bool().expect("flag");
            let want = case["prompt"].as_str().expect("prompt");
            let got = match template.apply(messages, tools, add_gen) {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{key}/{name}: render error {e}"));
                    continue;
                }
            };
            if got != want {
                failures.push(format!(
                    "{key}/{name}: prompt differs\n got: {got:?}\nwant: {want:?}"
                ));
                continue;
            }
            let want_ids = ids(&case["prompt_ids"]);
            let got_ids = tok.encode(want, true, true).expect("encode");
            if got_ids != want_ids {
                let at = first_diff(&got_ids, &want_ids);
                failures.push(format!("{key}/{name}: prompt ids differ at {at}"));
                continue;
            }
            pass += 1;
        }
        eprintln!("{key}: {pass}/{total} chat template cases equal llama.cpp");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Tool calls and tool results render through the Qwen template (Hermes format); string
/// arguments are parsed so `tojson` prints an object, as llama.cpp does.
#[test]
fn qwen_template_renders_tool_calls_and_results() {
    let Some(tok) = model("qwen05") else { return };
    let template = tok.chat_template().unwrap().unwrap();
    let messages: Vec<Value> = serde_json::from_str(
        r#"[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "18C, sunny"},
        {"role": "tool", "content": "wind 5 km/h"}
    ]"#,
    )
    .unwrap();
    let got = template.apply(&messages, None, true).unwrap();
    let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
<|im_start|>user\nWeather in Paris?<|im_end|>\n\
<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response>\n<tool_response>\nwind 5 km/h\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n";
    assert_eq!(got, want);
}

#[test]
fn template_errors_are_typed() {
    let Some(tok) = model("qwen05") else { return };
    let template = tok.chat_template().unwrap().unwrap();
    // No messages: the template reads messages[0]['role'], an error in Jinja too.
    assert!(matches!(
        template.apply(&[], None, true),
        Err(kestrel_tokenizer::TemplateError::Render(_))
    ));
    // A message whose content is an object cannot be concatenated to a string.
    let bad = [serde_json::json!({"role": "user", "content": {"x": 1}})];
    assert!(matches!(
        template.apply(&bad, None, true),
        Err(kestrel_tokenizer::TemplateError::Render(_))
    ));
}
