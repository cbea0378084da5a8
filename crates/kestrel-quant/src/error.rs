use kestrel_gguf::GgmlType;

/// Everything that can go wrong converting or dotting rows. Every length is checked before any
/// block is touched, so bad input yields one of these, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{ty}: {n} elements is not a whole number of {block_len}-element blocks")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block_len: usize,
    },
    #[error("{ty}: {n} elements need {expected} bytes, got {got}")]
    ByteLen {
        ty: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("{what}: expected {expected} elements, got {got}")]
    Len {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("kernel backend {0:?} is not available on this CPU")]
    BackendUnavailable(crate::cpu::Backend),
    #[error("{ty} is not supported by {op}")]
    Unsupported { ty: GgmlType, op: &'static str },
}
