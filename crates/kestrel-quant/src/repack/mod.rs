//! Weights repacked at load into groups of 16 rows, so one 512-bit vector holds four
//! consecutive quants of each of 16 rows and every `vpdpbusd` lane is one output row: the
//! integer dot products need no horizontal sums. Each layout keeps the f32 arithmetic of the
//! llama.cpp kernel it replaces, so results stay bit-identical:
//! - [`q4k`]: Q4_K, as llama.cpp's own repacked `q4_K_8x8` kernels;
//! - [`q6k`]: Q6_K, as its `ggml_vec_dot_q6_K_q8_K` (fewer than 8 tokens) and its tiled
//!   K-quant matmul (8 tokens or more).
//!
//! A repacked group's super-block holds exactly the bytes of its 16 native blocks (decode
//! streams every weight byte once per token, so the repack adds none); groups start on a
//! cache line.

pub mod q4k;
pub mod q6k;

pub use q4k::Q4KRepacked;
pub use q6k::Q6KRepacked;

use crate::QuantError;
use kestrel_gguf::GgmlType;

/// Rows per group.
pub const R: usize = 16;
/// Bytes of one Q8_K activation block.
const Q8K_BYTES: usize = 292;

/// A matrix in one of the repacked layouts.
pub enum Repacked {
    Q4K(Q4KRepacked),
    Q6K(Q6KRepacked),
}

impl Repacked {
    /// Whether `ty` has a repacked layout and kernel on this CPU for a matrix of `rows` rows.
    pub fn supports(ty: GgmlType, rows: usize) -> bool {
        matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
            && rows.is_multiple_of(R)
            && avx512_available()
    }

    /// Repack `rows` rows of `cols` elements of type `ty` (`bytes` row-major, as in a GGUF file).
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        match ty {
            GgmlType::Q4_K => Ok(Self::Q4K(Q4KRepacked::new(bytes, rows, cols)?)),
            GgmlType::Q6_K => Ok(Self::Q6K(Q6KRepacked::new(bytes, rows, cols)?)),
            _ => Err(QuantError::Unsupported { ty, op: "repack" }),
        }
    }

    /// Resident bytes beyond the file's for a matrix of `rows` x `cols` of type `ty` (the
    /// padding that starts each group on a cache line), for the memory plan.
    pub fn extra_bytes(ty: GgmlType, rows: usize, cols: usize) -> u64 {
        let nb = cols / crate::blocks::QK_K;
        let group = match ty {
            GgmlType::Q4_K => nb * q4k::GROUP_BLOCK_BYTES,
            GgmlType::Q6_K => nb * q6k::GROUP_BLOCK_BYTES,
            _ => return 0,
        };
        ((rows / R) * (group.next_multiple_of(64) - group)) as u64
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Q4K(p) => p.rows(),
            Self::Q6K(p) => p.rows(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Q4K(p) => p.bytes(),
            Self::Q6K(p) => p.bytes(),
        }
    }

    /// Rows `16 g .. 16 g + 16` against every activation row of a matmul (`acts`: all its
    /// tokens, Q8_K rows of `cols`): `out[t * 16 + r]`. The token count picks llama.cpp's order
    /// for the type (see the layouts' modules).
    pub fn dot_group(&self, g: usize, acts: &[&[u8]], out: &mut [f32]) -> Result<(), QuantError> {
        match self {
            Self::Q4K(p) => p.dot_group(g, acts, acts.len() - acts.len() % 4, out),
            Self::Q6K(p) => p.dot_group(g, acts, out),
        }
    }
}

/// Whether the SIMD kernels run here (repacking pays only where they do).
pub fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::dot::Backend::detect() == crate::dot::Backend::Avx512Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Zeroed bytes whose start is on a 64-byte boundary, so a group's 64-byte vectors never
/// straddle two cache lines (a plain `Vec<u8>` of this size starts 16 bytes into a page).
pub(crate) struct AlignedBytes {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBytes {
    pub(crate) fn zeroed(len: usize) -> Self {
        let buf = vec![0u8; len + 63];
        let off = buf.as_ptr().align_offset(64).min(63);
        Self { buf, off, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    crate::float16::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn i16_at(b: &[u8], at: usize) -> i32 {
    i16::from_le_bytes([b[at], b[at + 1]]) as i32
}
