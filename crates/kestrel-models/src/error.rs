use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] kestrel_gguf::GgufError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, qwen3, qwen3moe, qwen35)")]
    UnsupportedArch(String),
    #[error("missing hyper-parameter '{0}'")]
    MissingParam(String),
    #[error("invalid hyper-parameter '{key}': {reason}")]
    BadParam { key: String, reason: String },
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}': expected shape {expected:?}, found {found:?}")]
    BadShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor '{name}' has type {ty}, which the CPU backend cannot use for this role")]
    BadType { name: String, ty: String },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("context full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("the recurrent state holds {state} positions but the cache {kv}: a hybrid model's state cannot be rewound (start again from position 0)")]
    StateMismatch { state: usize, kv: usize },
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Quant(#[from] kestrel_quant::QuantError),
}
