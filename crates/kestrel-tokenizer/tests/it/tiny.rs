//! The tiny test models: the GGUF vocabulary and tokenizer.json give the same ids.

use kestrel_tokenizer::Tokenizer;

use crate::common::repo_root;

/// Texts on which the GGUF's pre-tokenizer ("qwen2" regex) and tokenizer.json's (plain GPT-2
/// ByteLevel regex) split alike. They differ elsewhere: see `pre_tokenizers_differ_on_digits`.
const TEXTS: &[&str] = &[
    "Hello world! The quick brown fox.",
    "It's a test, isn't it? Yes.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "unicode: café 中文 😀",
    "lines\nand  more   spaces ",
    "",
];

#[test]
fn gguf_and_tokenizer_json_agree() {
    for name in ["llama", "qwen2", "qwen3", "qwen3_5", "qwen3_moe"] {
        let dir = repo_root()
            .join("testdata/tiny")
            .join(format!("tiny-{name}"));
        let gguf = dir.join(format!("{name}-f32.gguf"));
        let from_gguf = Tokenizer::from_gguf_file(&gguf).expect("gguf tokenizer");
        let from_hf = Tokenizer::from_hf_dir(&dir).expect("tokenizer.json tokenizer");
        // The GGUF pads its vocabulary with unused tokens (512 vs 504); the shared ids agree.
        assert!(from_gguf.vocab_size() >= from_hf.vocab_size(), "{name}");
        for id in 0..from_hf.vocab_size() as u32 {
            assert_eq!(
                from_gguf.token_text(id),
                from_hf.token_text(id),
                "{name}: id {id}"
            );
        }
        assert_eq!(from_gguf.eos(), from_hf.eos(), "{name}");
        assert_eq!(from_gguf.eog_ids(), from_hf.eog_ids(), "{name}");
        for text in TEXTS {
            for parse_special in [true, false] {
                let a = from_gguf.encode(text, true, parse_special).unwrap();
                let b = from_hf.encode(text, true, parse_special).unwrap();
                assert_eq!(a, b, "{name}: {text:?} parse_special={parse_special}");
                assert_eq!(from_gguf.decode(&a, false), *text, "{name}");
                assert_eq!(from_hf.decode(&b, false), *text, "{name}");
            }
        }
        // The control tokens are recognised only with parse_special.
        let special = from_gguf.encode("<|im_end|>", false, true).unwrap();
        assert_eq!(special, vec![2], "{name}");
        assert!(from_gguf.encode("<|im_end|>", false, false).unwrap().len() > 1);
        eprintln!("tiny-{name}: {} / {}", from_gguf.kind(), from_hf.kind());
    }
}

/// The tiny models' GGUF says pre "qwen2" (digits one by one, as llama.cpp would split them),
/// while their tokenizer.json uses GPT-2's regex (digit runs): both loaders follow their source.
#[test]
fn pre_tokenizers_differ_on_digits() {
    let dir = repo_root().join("testdata/tiny/tiny-qwen2");
    let from_gguf = Tokenizer::from_gguf_file(dir.join("qwen2-f32.gguf")).unwrap();
    let from_hf = Tokenizer::from_hf_dir(&dir).unwrap();
    let a = from_gguf.encode(" 12", false, false).unwrap();
    let b = from_hf.encode(" 12", false, false).unwrap();
    assert_eq!(a.len(), 3, "qwen2 regex: ' ', '1', '2'");
    assert_ne!(a, b);
    assert_eq!(from_gguf.decode(&a, false), from_hf.decode(&b, false));
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    assert!(Tokenizer::from_hf_dir(repo_root().join("no/such/dir")).is_err());
    assert!(Tokenizer::from_gguf_file(repo_root().join("no/such.gguf")).is_err());
    let dir = repo_root().join("testdata/tiny/tiny-qwen2");
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    // Out-of-range ids decode to nothing rather than panicking.
    assert_eq!(tok.decode(&[u32::MAX, 5_000_000], false), "");
    assert!(tok.token_piece(u32::MAX).is_none());
}
