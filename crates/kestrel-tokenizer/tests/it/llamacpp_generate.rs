//! The generation fixtures exercise the whole text path: chat request → template → prompt ids,
//! and generated ids → text (the stop token is not part of the text).

use crate::common::{cases, fixture, ids, model, MODELS};

#[test]
fn generate_fixture_prompts_and_texts() {
    let fx = fixture("generate_public.json");
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        let template = tok.chat_template().unwrap().unwrap();
        for case in cases(&fx).iter().filter(|c| c["model_key"] == key) {
            let name = &case["name"];
            let prompt_text = case["prompt_text"].as_str().expect("prompt_text");
            if let Some(messages) = case["chat_request"]["messages"].as_array() {
                let rendered = template.apply(messages, None, true).expect("render");
                assert_eq!(rendered, prompt_text, "{key}/{name}");
            }
            let prompt_ids = tok.encode(prompt_text, true, true).expect("encode");
            assert_eq!(prompt_ids, ids(&case["prompt_ids"]), "{key}/{name}");

            let tokens = ids(&case["tokens"]);
            let stopped = case["stopped_eos"].as_bool().expect("stopped_eos");
            let last_is_eog = tokens.last().is_some_and(|&t| tok.is_eog(t));
            assert_eq!(last_is_eog, stopped, "{key}/{name}");
            let body = if stopped {
                &tokens[..tokens.len() - 1]
            } else {
                &tokens[..]
            };
            assert_eq!(tok.decode(body, false), case["text"], "{key}/{name}");
        }
    }
}
