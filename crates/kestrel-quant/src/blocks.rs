//! Quantization block layouts, byte for byte as ggml's `ggml-common.h`.
//!
//! A row of `n` elements of a block type is `n / BLOCK_LEN` blocks laid end to end with no
//! padding. All fields are plain integers, so every bit pattern is a valid block; rows are read
//! with unaligned loads ([`read_block`]), because a tensor slice in a mapped file carries no
//! alignment promise for our structs.

use crate::float16::F16;
use kestrel_gguf::GgmlType;
use std::mem::size_of;

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// `x[i] = d * (q[i] - 8)`, q 4-bit. `qs[j]` holds element j (low nibble) and j+16 (high).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: F16,
    pub qs: [u8; QK4_0 / 2],
}

/// `x[i] = d * q[i] + m`, q 4-bit, same nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: F16,
    pub m: F16,
    pub qs: [u8; QK4_1 / 2],
}

/// `x[i] = d * (q[i] - 16)`, q 5-bit: low nibbles as Q4_0, bit i of `qh` (LE u32) is bit 4 of `q[i]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: F16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}

/// `x[i] = d * q[i] + m`, q 5-bit, bits as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: F16,
    pub m: F16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}

/// `x[i] = d * q[i]`, q int8. Weights, and the activations paired with Q4_0/Q5_0/Q8_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: F16,
    pub qs: [i8; QK8_0],
}

/// Q8_0 plus `s = d * sum(q)`: the activations paired with Q4_1/Q5_1 (the sum carries the min).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: F16,
    pub s: F16,
    pub qs: [i8; QK8_1],
}

/// 16 groups of 16: `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q 2-bit.
/// qs: per 128 elements, 32 bytes; bits 2k..2k+1 of byte l hold element 32k + l.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16,
    pub dmin: F16,
}

/// 16 groups of 16: `x = d * (sc - 32) * (q - 4 * !hbit)`, q 2+1 bits, scales 6-bit packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16,
}

/// 8 groups of 32: `x = d * sc * q - dmin * m`, q 4-bit, (sc, m) 6-bit packed in 12 bytes.
/// qs: per 64 elements, 32 bytes; low nibbles first 32, high nibbles next 32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: F16,
    pub dmin: F16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q4_K plus a fifth bit per element in `qh` (bit 2k / 2k+1 of byte l for group pair k).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: F16,
    pub dmin: F16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 16 groups of 16: `x = d * sc * (q - 32)`, q 6-bit (4 low bits in ql, 2 high in qh), sc int8.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16,
}

/// Activations paired with every K-quant: f32 scale, int8 quants, and sums of each 16 quants
/// (so the K-quant mins fold in with 16 multiplies instead of 256).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);

#[cfg(target_endian = "big")]
compile_error!("kestrel-quant reads ggml blocks as little-endian");

/// A ggml block type.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only integer / float fields with no padding, so any
/// `size_of::<Self>()` bytes are a valid value.
pub unsafe trait Block: Copy {
    const TYPE: GgmlType;
    const LEN: usize;
    const BYTES: usize = size_of::<Self>();
}

macro_rules! impl_block {
    ($($t:ty => $ty:ident, $len:expr;)*) => {$(
        // SAFETY: repr(C), integer fields only, size asserted above (no padding).
        unsafe impl Block for $t {
            const TYPE: GgmlType = GgmlType::$ty;
            const LEN: usize = $len;
        }
    )*};
}

impl_block! {
    BlockQ4_0 => Q4_0, QK4_0;
    BlockQ4_1 => Q4_1, QK4_1;
    BlockQ5_0 => Q5_0, QK5_0;
    BlockQ5_1 => Q5_1, QK5_1;
    BlockQ8_0 => Q8_0, QK8_0;
    BlockQ8_1 => Q8_1, QK8_1;
    BlockQ2K => Q2_K, QK_K;
    BlockQ3K => Q3_K, QK_K;
    BlockQ4K => Q4_K, QK_K;
    BlockQ5K => Q5_K, QK_K;
    BlockQ6K => Q6_K, QK_K;
    BlockQ8K => Q8_K, QK_K;
}

/// Copy one block out of `bytes` (which must be exactly `B::BYTES` long; callers iterate with
/// `chunks_exact(B::BYTES)`).
#[inline(always)]
pub fn read_block<B: Block>(bytes: &[u8]) -> B {
    assert!(bytes.len() >= B::BYTES);
    // SAFETY: length checked; any bit pattern is a valid B (trait contract); unaligned read.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const B) }
}

/// Write one block into `bytes` (at least `B::BYTES` long).
#[inline(always)]
pub fn write_block<B: Block>(block: &B, bytes: &mut [u8]) {
    assert!(bytes.len() >= B::BYTES);
    // SAFETY: length checked; B has no padding, so all written bytes are initialized.
    unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr() as *mut B, *block) }
}

/// Bytes of a row of `n` elements of `ty`, or an error when `n` is not a whole number of blocks.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, crate::QuantError> {
    let block_len = ty.block_len() as usize;
    if !n.is_multiple_of(block_len) {
        return Err(crate::QuantError::NotBlockMultiple { ty, n, block_len });
    }
    Ok(n / block_len * ty.block_bytes() as usize)
}

/// Check that `bytes` holds exactly a row of `n` elements of `ty`.
pub(crate) fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), crate::QuantError> {
    let expected = row_bytes(ty, n)?;
    if expected != bytes {
        return Err(crate::QuantError::ByteLen {
            ty,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Unpack scale and min `j` (0..8) from the 12 packed bytes of Q4_K / Q5_K.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Unpack the 16 six-bit Q3_K scales (still biased by +32).
#[inline(always)]
pub fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0xf
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8;
    }
    out
}
