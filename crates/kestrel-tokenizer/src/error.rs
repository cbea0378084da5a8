//! Typed errors for loading tokenizers and rendering chat templates.

use std::path::PathBuf;

/// Failure to build or use a [`crate::Tokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(&'static str),
    #[error("GGUF metadata key `{key}` is malformed: {reason}")]
    BadMetadata { key: &'static str, reason: String },
    #[error("unsupported tokenizer model `{0}` (only \"gpt2\" byte-level BPE is supported)")]
    UnsupportedModel(String),
    #[error("unknown pre-tokenizer `{0}` (tokenizer.ggml.pre)")]
    UnknownPreTokenizer(String),
    #[error("building the tokenizer failed: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("opening GGUF file: {0}")]
    Gguf(#[from] kestrel_gguf::GgufError),
}

/// Failure to compile or render a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The template itself called `raise_exception(msg)`.
    #[error("chat template raised: {0}")]
    Raised(String),
    #[error("chat request is malformed: {0}")]
    BadRequest(String),
}
