//! Token ids equal llama.cpp's `/tokenize` on every case of tokenize_public.json.

use crate::common::{cases, first_diff, fixture, ids, model, MODELS};

#[test]
fn tokenize_matches_llamacpp_on_every_case() {
    let fx = fixture("tokenize_public.json");
    let mut failures = Vec::new();
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        let (mut pass, mut total) = (0, 0);
        for case in cases(&fx).iter().filter(|c| c["model_key"] == key) {
            total += 1;
            let text = case["text"].as_str().expect("text");
            let parse_special = case["parse_special"].as_bool().expect("parse_special");
            let want = ids(&case["ids"]);
            let got = tok.encode(text, false, parse_special).expect("encode");
            if got == want {
                pass += 1;
            } else {
                let at = first_diff(&got, &want);
                failures.push(format!(
                    "{key}/{} (parse_special={parse_special}): differs at {at}: got {:?} want {:?}",
                    case["name"],
                    &got[at..got.len().min(at + 6)],
                    &want[at..want.len().min(at + 6)]
                ));
            }
        }
        eprintln!("{key}: {pass}/{total} tokenize cases equal llama.cpp");
        assert!(total > 0, "no fixture cases for {key}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_round_trips_fixture_texts() {
    let fx = fixture("tokenize_public.json");
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        for case in cases(&fx).iter().filter(|c| c["model_key"] == key) {
            let text = case["text"].as_str().expect("text");
            // llama.cpp's ids decode back to the text, with specials shown or not.
            let want = ids(&case["ids"]);
            assert_eq!(tok.decode(&want, false), text, "{key}/{}", case["name"]);
            let parse_special = case["parse_special"].as_bool().expect("parse_special");
            let ours = tok.encode(text, false, parse_special).expect("encode");
            assert_eq!(tok.decode(&ours, false), text, "{key}/{}", case["name"]);
        }
    }
}

#[test]
fn model_metadata_is_read_like_llamacpp() {
    if let Some(tok) = model("qwen05") {
        assert_eq!(tok.kind(), "gpt2 byte-level BPE (pre: qwen2)");
        assert_eq!(tok.vocab_size(), 151936);
        assert_eq!(tok.bos(), Some(151643));
        assert_eq!(tok.eos(), Some(151645));
        assert!(!tok.add_bos());
        // <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>, <|file_sep|>
        assert_eq!(tok.eog_ids(), &[151643, 151645, 151662, 151663, 151664]);
        assert!(tok.is_special(151644));
        assert!(tok.is_special(151657)); // <tool_call>, user-defined
        assert!(!tok.is_special(785));
        assert_eq!(tok.token_piece(151644).as_deref(), Some("<|im_start|>"));
        assert_eq!(tok.token_piece(220).as_deref(), Some(" "));
        assert!(tok.chat_template().expect("compiles").is_some());
        let names: Vec<_> = tok.special_tokens().iter().map(|s| s.name).collect();
        assert!(names.contains(&"bos") && names.contains(&"eos") && names.contains(&"eot"));
        // User-defined tokens are matched even with parse_special off, as llama.cpp does.
        assert_eq!(
            tok.encode("<tool_call>", false, false).unwrap(),
            vec![151657]
        );
        // skip_special drops control tokens only.
        assert_eq!(tok.decode(&[151644, 9707, 151645], true), "Hello");
    }
    if let Some(tok) = model("smollm2") {
        assert_eq!(tok.kind(), "gpt2 byte-level BPE (pre: smollm)");
        assert_eq!(tok.vocab_size(), 49152);
        assert_eq!(tok.bos(), Some(1));
        assert_eq!(tok.eos(), Some(2));
        assert!(tok.is_eog(0) && tok.is_eog(2));
        assert!(!tok.is_eog(1));
    }
}

/// The qwen35 pre-tokenizer (Qwen3.5 files; combining marks join their letters) equals
/// llama.cpp's: tokenize_qwen35.json holds the ids llama.cpp gave with the Qwen2.5-0.5B file's
/// tokenizer under `tokenizer.ggml.pre = qwen35` (scripts/llamacpp_tokenize_qwen35.py) for
/// accents (precomposed and combining), Vietnamese, Hindi, Tamil, Bengali, Arabic and Hebrew
/// with their marks, code, numbers, emoji and whitespace.
#[test]
fn qwen35_pretokenizer_matches_llamacpp() {
    let fx = fixture("tokenize_qwen35.json");
    let path = crate::common::repo_root()
        .join("models")
        .join(fx["meta"]["model_file"].as_str().expect("model_file"));
    if !path.exists() {
        assert!(
            std::env::var("KESTREL_REQUIRE_MODELS").map_or(true, |v| v != "1"),
            "KESTREL_REQUIRE_MODELS=1 but {} is missing",
            path.display()
        );
        eprintln!("note: skipping: {} not found", path.display());
        return;
    }
    let file = kestrel_gguf::GgufFile::open(&path).expect("model opens");
    let mut header = file.header.clone();
    for (key, value) in header.metadata.iter_mut() {
        if key == "tokenizer.ggml.pre" {
            *value = kestrel_gguf::Value::String("qwen35".into());
        }
    }
    let tok = kestrel_tokenizer::Tokenizer::from_gguf(&header).expect("tokenizer");
    let stock = kestrel_tokenizer::Tokenizer::from_gguf(&file.header).expect("tokenizer");
    let (mut failures, mut differ_from_qwen2) = (Vec::new(), 0);
    for case in cases(&fx) {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false, false).expect("encode");
        if got != want {
            let at = first_diff(&got, &want);
            failures.push(format!(
                "{}: differs at {at}: got {:?} want {:?}",
                case["name"],
                &got[at..got.len().min(at + 6)],
                &want[at..want.len().min(at + 6)]
            ));
        }
        differ_from_qwen2 += (stock.encode(text, false, false).expect("encode") != want) as usize;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // the fixture exercises what sets qwen35 apart (the Arabic and Hebrew marks)
    assert!(differ_from_qwen2 > 0, "no case tells qwen35 from qwen2");
}
