//! Shared helpers: repo paths, fixtures, cached real-model tokenizers.

use std::path::PathBuf;
use std::sync::OnceLock;

use kestrel_tokenizer::Tokenizer;
use serde_json::Value;

/// The workspace root, two levels above this crate.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> Value {
    let path = repo_root().join("testdata/llamacpp").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

pub fn cases(fixture: &Value) -> &[Value] {
    fixture["cases"].as_array().expect("fixture has cases[]")
}

/// The three real models of the llama.cpp fixtures, by `model_key`.
pub const MODELS: [(&str, &str); 3] = [
    ("smollm2", "smollm2-135m-instruct-q4_1.gguf"),
    ("qwen05", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("qwen15", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
];

fn require_models() -> bool {
    std::env::var("KESTREL_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

/// The tokenizer of a real model, built once per test binary; `None` (with a note) when the
/// file is missing and models are not required.
pub fn model(key: &str) -> Option<&'static Tokenizer> {
    static CACHE: [OnceLock<Option<Tokenizer>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let idx = MODELS.iter().position(|(k, _)| *k == key)?;
    CACHE[idx]
        .get_or_init(|| {
            let path = repo_root().join("models").join(MODELS[idx].1);
            if !path.exists() {
                if require_models() {
                    panic!("KESTREL_REQUIRE_MODELS=1 but {} is missing", path.display());
                }
                eprintln!(
                    "note: skipping {key}: {} not found (run scripts to fetch models)",
                    path.display()
                );
                return None;
            }
            let file = kestrel_gguf::GgufFile::open(&path)
                .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
            Some(
                Tokenizer::from_gguf(&file.header)
                    .unwrap_or_else(|e| panic!("tokenizer of {}: {e}", path.display())),
            )
        })
        .as_ref()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Index of the first difference, for readable failures.
pub fn first_diff(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
