use std::path::PathBuf;

/// What is wrong with a GGUF file, and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} for {what}, file has {len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("invalid {what} at offset {offset}: {reason}")]
    Invalid {
        what: String,
        offset: u64,
        reason: String,
    },
    #[error("tensor '{name}': {reason}")]
    BadTensor { name: String, reason: String },
    #[error("metadata key '{key}': {reason}")]
    BadMetadata { key: String, reason: String },
}
