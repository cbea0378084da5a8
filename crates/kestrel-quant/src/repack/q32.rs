//! Q8_0, Q5_0 and Q4_0 (32-element blocks, against Q8_0 activations) and Q5_1, Q4_1 (against
//! Q8_1) repacked into 16-row groups, with llama.cpp's f32 arithmetic for them (its `vec_dot`
//! and tinyBLAS alike): per block and row, 8 integer lanes of 4 products (lane `l` holds
//! elements `4l .. 4l + 4`), then `acc_l = fma(dx * dy, lane_l, acc_l)`, and at the end
//! `hsum_float_8`, plus for Q5_1 / Q4_1 the mins' `summ = fma(m, s_y, summ)` over the blocks
//! in order. Here each lane is one vector over the 16 rows, from one `vpdpbusd` of unsigned
//! levels `u = q + off` (`off` 128 for Q8_0, 16 for Q5_0, 8 for Q4_0, 0 for Q5_1 / Q4_1)
//! seeded with `-off * (y_4l + .. + y_4l+3)`, so the sums are exact.
//!
//! Layout of one group (16 rows), per block, as many bytes as the 16 native blocks:
//! - Q8_0, 544 bytes: `u[8][16][4]` (chunk l, row r, element `4l + k`), then `d[16]` f16;
//! - Q5_0, 352 bytes: `lo[4][16][4]` (byte = low nibbles of chunks m and m + 4), then
//!   `hi[8]` u64 (chunk l's fifth bits, bit `4r + k`), then `d[16]` f16;
//! - Q4_0, 288 bytes: `lo[4][16][4]` as Q5_0's (each byte is the file's own), then `d[16]` f16;
//! - Q5_1 (384 bytes) and Q4_1 (320): Q5_0's and Q4_0's levels, then `d[16]` and `m[16]` f16.
//!
//! Blocks go in pairs `[levels 2p][scales 2p][scales 2p+1][levels 2p+1]` so every block's
//! levels start on a cache line; groups are padded to one. Matmuls over many tokens unpack a
//! 4- or 5-bit group once into the Q8_0 form (levels as bytes, the same scales) and run the
//! Q8_0 kernel on it.

use super::{AlignedBytes, R};
use crate::float16::f16_to_f32;
use crate::QuantError;
use kestrel_gguf::GgmlType;

const QK: usize = 32;
const D_BYTES: usize = 2 * R;
const Q8_LEVELS: usize = 8 * R * 4;
const Q5_LEVELS: usize = 4 * R * 4 + 8 * 8;
const Q4_LEVELS: usize = 4 * R * 4;
/// Tokens from which a Q5_0 or Q4_0 matmul unpacks each group into the Q8_0 form first.
const UNPACK_MIN_TOKENS: usize = 8;

/// Bytes of one group's block.
pub const fn group_block_bytes(ty: GgmlType) -> usize {
    levels_bytes(ty) + scale_bytes(has_min(ty))
}

const fn levels_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 => Q5_LEVELS,
        GgmlType::Q4_0 | GgmlType::Q4_1 => Q4_LEVELS,
        _ => Q8_LEVELS,
    }
}

/// Whether `ty`'s blocks carry a min (Q5_1, Q4_1: `d[16]` then `m[16]`).
const fn has_min(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_1 | GgmlType::Q4_1)
}

/// A group block's scale bytes: `d[16]`, and with a min `m[16]` after it.
const fn scale_bytes(min: bool) -> usize {
    if min {
        2 * D_BYTES
    } else {
        D_BYTES
    }
}

/// The activation blocks of a type without a min (Q8_0: 34 bytes, quants at 2) or with one
/// (`min`; Q8_1: 36, the block's `d * sum` at 2, quants at 4): (bytes, where the quants start).
const fn act_layout(min: bool) -> (usize, usize) {
    if min {
        (36, 4)
    } else {
        (34, 2)
    }
}

/// Where block `i`'s levels and scales start in a group of blocks of `levels` level bytes and
/// `sb` scale bytes.
#[inline(always)]
fn offsets(levels: usize, sb: usize, i: usize) -> (usize, usize) {
    let base = (i / 2) * 2 * (levels + sb);
    if i.is_multiple_of(2) {
        (base, base + levels)
    } else {
        (base + levels + 2 * sb, base + levels + sb)
    }
}

/// Activation rows of a matmul (Q8_0; Q8_1 for Q5_1 / Q4_1), prepared once for every group:
/// each block's `dy` (and Q8_1's `d * sum`, `sy`) as f32 and each chunk's seed `-off * sum of
/// its 4 quants`.
pub struct Q32Acts<'a> {
    rows: &'a [&'a [u8]],
    dy: Vec<f32>,
    sy: Vec<f32>,
    seed: Vec<i32>,
}

/// A Q8_0, Q5_0, Q4_0, Q5_1 or Q4_1 matrix (`rows` a multiple of 16) in the repacked layout.
pub struct Q32Repacked {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    stride: usize,
    data: AlignedBytes,
}

/// Offset that makes a type's levels unsigned.
fn level_offset(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q5_0 => 16,
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_1 | GgmlType::Q4_1 => 0,
        _ => 128,
    }
}

/// Where a native block's qh (5-bit types) and nibbles start: after d (and m).
const fn native_quants(ty: GgmlType) -> usize {
    if has_min(ty) {
        4
    } else {
        2
    }
}

/// A native block's d (f16 bits), m (f16 bits; 0 without a min) and 32 unsigned levels.
fn native_levels(ty: GgmlType, b: &[u8]) -> (u16, u16, [u8; QK]) {
    let d = u16::from_le_bytes([b[0], b[1]]);
    let m = if has_min(ty) {
        u16::from_le_bytes([b[2], b[3]])
    } else {
        0
    };
    let q = native_quants(ty);
    let mut u = [0u8; QK];
    if levels_bytes(ty) == Q4_LEVELS {
        for (j, v) in u.iter_mut().enumerate() {
            *v = b[q + j % 16] >> (4 * (j / 16)) & 15;
        }
    } else if levels_bytes(ty) == Q5_LEVELS {
        let qh = u32::from_le_bytes([b[q], b[q + 1], b[q + 2], b[q + 3]]);
        for (j, v) in u.iter_mut().enumerate() {
            let lo = if j < 16 {
                b[q + 4 + j] & 15
            } else {
                b[q + 4 + j - 16] >> 4
            };
            *v = lo | ((qh >> j & 1) as u8) << 4;
        }
    } else {
        for (j, v) in u.iter_mut().enumerate() {
            *v = b[2 + j] ^ 0x80;
        }
    }
    (d, m, u)
}

impl Q32Repacked {
    /// Repack `rows` rows of `cols` elements of `ty` (Q8_0, Q5_0, Q4_0, Q5_1 or Q4_1; `bytes`
    /// row-major).
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        Self::new_with(ty, bytes, rows, cols, &mut |_| {})
    }

    /// [`Self::new`], calling `done(rows)` as the first `rows` rows are repacked (every
    /// 1,024 rows), so the caller can release their source pages as it goes.
    pub fn new_with(
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        done: &mut dyn FnMut(usize),
    ) -> Result<Self, QuantError> {
        if !matches!(
            ty,
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q5_1 | GgmlType::Q4_1
        ) {
            return Err(QuantError::Unsupported { ty, op: "repack" });
        }
        let row_bytes = super::source_row_bytes(
            ty,
            bytes,
            rows,
            cols,
            "Q8_0 / Q5_x / Q4_x repack (rows must be a multiple of 16)",
        )?;
        let nb = cols / QK;
        let (levels, native) = (levels_bytes(ty), row_bytes / nb);
        let sb = scale_bytes(has_min(ty));
        let stride = (nb * group_block_bytes(ty)).next_multiple_of(64);
        let mut data = AlignedBytes::zeroed(rows / R * stride);
        let buf = data.as_mut_slice();
        for g in 0..rows / R {
            let dst = &mut buf[g * stride..][..nb * group_block_bytes(ty)];
            for i in 0..nb {
                let (lv, dp) = offsets(levels, sb, i);
                for r in 0..R {
                    let src = &bytes[(g * R + r) * row_bytes + i * native..][..native];
                    let (d, m, u) = native_levels(ty, src);
                    dst[dp + 2 * r..dp + 2 * r + 2].copy_from_slice(&d.to_le_bytes());
                    if has_min(ty) {
                        let mp = dp + D_BYTES + 2 * r;
                        dst[mp..mp + 2].copy_from_slice(&m.to_le_bytes());
                    }
                    for (j, &v) in u.iter().enumerate() {
                        let (l, k) = (j / 4, j % 4);
                        if ty == GgmlType::Q8_0 {
                            dst[lv + 64 * l + 4 * r + k] = v;
                        } else {
                            dst[lv + 64 * (l % 4) + 4 * r + k] |= (v & 15) << (4 * (l / 4));
                            if levels == Q5_LEVELS {
                                let bit = 4 * r + k;
                                dst[lv + 256 + 8 * l + bit / 8] |= (v >> 4) << (bit % 8);
                            }
                        }
                    }
                }
            }
            if (g + 1) % 64 == 0 {
                done((g + 1) * R);
            }
        }
        Ok(Self {
            ty,
            rows,
            cols,
            stride,
            data,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as the file stored it (`out`: the row's bytes, 34, 22, 18, 24 or 20 per
    /// block).
    pub fn native_row(&self, r: usize, out: &mut [u8]) {
        let (g, rr) = (r / R, r % R);
        let w = self.group(g);
        let (levels, min) = (levels_bytes(self.ty), has_min(self.ty));
        let q = native_quants(self.ty);
        for (i, blk) in out
            .chunks_exact_mut(self.ty.block_bytes() as usize)
            .enumerate()
        {
            let (_, dp) = offsets(levels, scale_bytes(min), i);
            blk[0..2].copy_from_slice(&w[dp + 2 * rr..dp + 2 * rr + 2]);
            if min {
                let mp = dp + D_BYTES + 2 * rr;
                blk[2..4].copy_from_slice(&w[mp..mp + 2]);
            }
            let u: Vec<u8> = (0..QK).map(|j| self.level(w, i, rr, j) as u8).collect();
            if levels == Q8_LEVELS {
                for j in 0..QK {
                    blk[2 + j] = u[j] ^ 0x80;
                }
            } else if levels == Q4_LEVELS {
                for j in 0..16 {
                    blk[q + j] = u[j] | u[j + 16] << 4;
                }
            } else {
                let qh = (0..QK).fold(0u32, |h, j| h | ((u[j] >> 4) as u32) << j);
                blk[q..q + 4].copy_from_slice(&qh.to_le_bytes());
                for j in 0..16 {
                    blk[q + 4 + j] = (u[j] & 15) | (u[j + 16] & 15) << 4;
                }
            }
        }
    }

    fn group(&self, g: usize) -> &[u8] {
        &self.data.as_slice()[g * self.stride..][..self.cols / QK * group_block_bytes(self.ty)]
    }

    /// Prepares a matmul's activation rows (`cols` each; Q8_0, or Q8_1 for Q5_1 / Q4_1) for
    /// [`Q32Repacked::dot_group`].
    pub fn prepare<'a>(&self, rows: &'a [&'a [u8]]) -> Result<Q32Acts<'a>, QuantError> {
        let nb = self.cols / QK;
        let off = level_offset(self.ty);
        let (ab, qoff) = act_layout(has_min(self.ty));
        let min = has_min(self.ty);
        let mut dy = Vec::with_capacity(rows.len() * nb);
        let mut sy = Vec::with_capacity(if min { rows.len() * nb } else { 0 });
        let mut seed = Vec::with_capacity(rows.len() * nb * 8);
        for a in rows {
            if a.len() != nb * ab {
                return Err(QuantError::Len {
                    what: "Q8_0 / Q8_1 activation row",
                    expected: nb * ab,
                    got: a.len(),
                });
            }
            for b in a.chunks_exact(ab) {
                dy.push(f16_to_f32(u16::from_le_bytes([b[0], b[1]])));
                if min {
                    sy.push(f16_to_f32(u16::from_le_bytes([b[2], b[3]])));
                }
                for c in b[qoff..].chunks_exact(4) {
                    seed.push(-off * c.iter().map(|&q| q as i8 as i32).sum::<i32>());
                }
            }
        }
        Ok(Q32Acts { rows, dy, sy, seed })
    }

    /// Rows `16 g .. 16 g + 16` against every prepared activation row: `out[t * 16 + r]`.
    pub fn dot_group(&self, g: usize, acts: &Q32Acts, out: &mut [f32]) -> Result<(), QuantError> {
        let nb = self.cols / QK;
        let t_len = acts.rows.len();
        let min = has_min(self.ty);
        if g >= self.rows / R
            || out.len() != t_len * R
            || acts.dy.len() != t_len * nb
            || acts.sy.len() != if min { t_len * nb } else { 0 }
            || acts.seed.len() != t_len * nb * 8
        {
            return Err(QuantError::Len {
                what: "Q8_0 / Q5_x / Q4_x repacked group output",
                expected: t_len * R,
                got: out.len(),
            });
        }
        let w = self.group(g);
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            // The weight stream is prefetched for decode (few tokens) reading the group from
            // memory; an unpacked group is already in L2.
            let ahead = if t_len <= 4 {
                crate::cpu::weight_prefetch_ahead()
            } else {
                0
            };
            // `levels`: the group's level bytes (which of the three forms)
            let run = |w: &[u8], levels: usize, ahead: usize, out: &mut [f32]| {
                let mut c = 0;
                while c < t_len {
                    let n = (t_len - c).min(2);
                    let o = &mut out[c * R..(c + n) * R];
                    // SAFETY: AVX-512 VNNI is available; the group, the activation rows and
                    // their preparation were length-checked above.
                    unsafe {
                        use avx512::{lanes, Q4, Q5, Q8};
                        match (levels, n, min) {
                            (Q5_LEVELS, 2, false) => {
                                lanes::<2, Q5, false>(nb, w, ahead, acts, c, o)
                            }
                            (Q5_LEVELS, _, false) => {
                                lanes::<1, Q5, false>(nb, w, ahead, acts, c, o)
                            }
                            (Q4_LEVELS, 2, false) => {
                                lanes::<2, Q4, false>(nb, w, ahead, acts, c, o)
                            }
                            (Q4_LEVELS, _, false) => {
                                lanes::<1, Q4, false>(nb, w, ahead, acts, c, o)
                            }
                            (_, 2, false) => lanes::<2, Q8, false>(nb, w, ahead, acts, c, o),
                            (_, _, false) => lanes::<1, Q8, false>(nb, w, ahead, acts, c, o),
                            (Q5_LEVELS, 2, true) => lanes::<2, Q5, true>(nb, w, ahead, acts, c, o),
                            (Q5_LEVELS, _, true) => lanes::<1, Q5, true>(nb, w, ahead, acts, c, o),
                            (Q4_LEVELS, 2, true) => lanes::<2, Q4, true>(nb, w, ahead, acts, c, o),
                            (Q4_LEVELS, _, true) => lanes::<1, Q4, true>(nb, w, ahead, acts, c, o),
                            (_, 2, true) => lanes::<2, Q8, true>(nb, w, ahead, acts, c, o),
                            (_, _, true) => lanes::<1, Q8, true>(nb, w, ahead, acts, c, o),
                        }
                    }
                    c += n;
                }
            };
            let levels = levels_bytes(self.ty);
            if levels == Q8_LEVELS || t_len < UNPACK_MIN_TOKENS {
                run(w, levels, ahead, out);
            } else {
                thread_local! {
                    static UNPACKED: std::cell::RefCell<AlignedBytes> = std::cell::RefCell::new(AlignedBytes::zeroed(0));
                }
                UNPACKED.with_borrow_mut(|buf| {
                    let len = nb * (Q8_LEVELS + scale_bytes(min));
                    if buf.len() < len {
                        *buf = AlignedBytes::zeroed(len);
                    }
                    let dst = &mut buf.as_mut_slice()[..len];
                    // SAFETY: AVX-512 VNNI is available; `dst` holds the Q8_0 form of `nb`
                    // blocks (with the mins' scale bytes where `min`) and `w` the form of
                    // `self.ty`.
                    unsafe {
                        use avx512::{unpack, Q4, Q5};
                        match (levels, min) {
                            (Q5_LEVELS, false) => unpack::<Q5, false>(nb, w, dst),
                            (_, false) => unpack::<Q4, false>(nb, w, dst),
                            (Q5_LEVELS, true) => unpack::<Q5, true>(nb, w, dst),
                            (_, true) => unpack::<Q4, true>(nb, w, dst),
                        }
                    }
                    run(dst, Q8_LEVELS, 0, out);
                });
            }
            return Ok(());
        }
        for t in 0..t_len {
            self.dot_scalar(w, acts, t, &mut out[t * R..(t + 1) * R]);
        }
        Ok(())
    }

    /// Row r's level of element j of block i in a group `w`.
    fn level(&self, w: &[u8], i: usize, r: usize, j: usize) -> i32 {
        let levels = levels_bytes(self.ty);
        let (lv, _) = offsets(levels, scale_bytes(has_min(self.ty)), i);
        let (l, k) = (j / 4, j % 4);
        if levels == Q8_LEVELS {
            return w[lv + 64 * l + 4 * r + k] as i32;
        }
        let lo = w[lv + 64 * (l % 4) + 4 * r + k] >> (4 * (l / 4)) & 15;
        if levels == Q4_LEVELS {
            return lo as i32;
        }
        let bit = 4 * r + k;
        let hi = w[lv + 256 + 8 * l + bit / 8] >> (bit % 8) & 1;
        (lo | hi << 4) as i32
    }

    /// The arithmetic of the SIMD kernels one row at a time: their oracle.
    fn dot_scalar(&self, w: &[u8], acts: &Q32Acts, t: usize, out: &mut [f32]) {
        let nb = self.cols / QK;
        let y = acts.rows[t];
        let min = has_min(self.ty);
        let (ab, qoff) = act_layout(has_min(self.ty));
        let f16_at = |p: usize| f16_to_f32(u16::from_le_bytes([w[p], w[p + 1]]));
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = [0f32; 8];
            let mut summ = 0f32;
            for i in 0..nb {
                let (_, dp) = offsets(levels_bytes(self.ty), scale_bytes(min), i);
                let d = f16_at(dp + 2 * r) * acts.dy[t * nb + i];
                if min {
                    summ = f16_at(dp + D_BYTES + 2 * r).mul_add(acts.sy[t * nb + i], summ);
                }
                for (l, a) in acc.iter_mut().enumerate() {
                    let mut s = acts.seed[(t * nb + i) * 8 + l];
                    for k in 0..4 {
                        let j = 4 * l + k;
                        s += self.level(w, i, r, j) * y[i * ab + qoff + j] as i8 as i32;
                    }
                    *a = d.mul_add(s as f32, *a);
                }
            }
            *o = ((acc[0] + acc[4]) + (acc[2] + acc[6]))
                + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
                + summ;
        }
    }
}

// Per-token and per-lane register arrays are indexed by constant loop counters (unrolled).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// The layouts, by the bits of a level (the kernels' constant parameter).
    pub(super) const Q8: u8 = 8;
    pub(super) const Q5: u8 = 5;
    pub(super) const Q4: u8 = 4;

    const fn levels(bits: u8) -> usize {
        match bits {
            Q5 => Q5_LEVELS,
            Q4 => Q4_LEVELS,
            _ => Q8_LEVELS,
        }
    }

    /// Block i's 8 chunks of unsigned levels (16 rows x 4 elements each) in a group of the
    /// `BITS` layout (with `MIN`, the mins' scale bytes too), and where its `d` (then `m`) are.
    #[inline(always)]
    unsafe fn chunks<const BITS: u8, const MIN: bool>(
        w: *const u8,
        i: usize,
    ) -> ([__m512i; 8], *const u8) {
        let (lv, dp) = offsets(levels(BITS), scale_bytes(MIN), i);
        let p = w.add(lv);
        if BITS == Q8 {
            let u = std::array::from_fn(|l| _mm512_loadu_si512(p.add(64 * l) as *const _));
            return (u, w.add(dp));
        }
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(16);
        let hi = p.add(256) as *const u64;
        let mut u = [_mm512_setzero_si512(); 8];
        for m in 0..4 {
            let z = _mm512_loadu_si512(p.add(64 * m) as *const _);
            let lo = _mm512_and_si512(z, m4);
            let up = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            if BITS == Q5 {
                u[m] = _mm512_mask_add_epi8(lo, hi.add(m).read_unaligned(), lo, sixteen);
                u[m + 4] = _mm512_mask_add_epi8(up, hi.add(m + 4).read_unaligned(), up, sixteen);
            } else {
                (u[m], u[m + 4]) = (lo, up);
            }
        }
        (u, w.add(dp))
    }

    /// 16 rows x `N` tokens (`t0..t0 + N` of `acts`), prefetching the group `ahead` bytes
    /// ahead of its reads (0: not at all). `MIN`: Q5_1 / Q4_1 against Q8_1 (the mins' sums).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn lanes<const N: usize, const BITS: u8, const MIN: bool>(
        nb: usize,
        w: &[u8],
        ahead: usize,
        acts: &Q32Acts,
        t0: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        let mut summ = [_mm512_setzero_ps(); N];
        let (ab, qoff) = act_layout(MIN);
        let y: [*const u8; N] = std::array::from_fn(|c| acts.rows[t0 + c].as_ptr());
        let dy: [*const f32; N] = std::array::from_fn(|c| acts.dy.as_ptr().add((t0 + c) * nb));
        // (dangling but never read without MIN: `sy` is empty then)
        let sy: [*const f32; N] =
            std::array::from_fn(|c| acts.sy.as_ptr().wrapping_add((t0 + c) * nb));
        let seed: [*const i32; N] =
            std::array::from_fn(|c| acts.seed.as_ptr().add((t0 + c) * nb * 8));
        let block_bytes = levels(BITS) + scale_bytes(MIN);
        for i in 0..nb {
            crate::cpu::prefetch_ahead(
                w.as_ptr().wrapping_add(i * block_bytes),
                ahead,
                block_bytes,
            );
            let (u, dp) = chunks::<BITS, MIN>(w.as_ptr(), i);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(dp as *const __m256i));
            if MIN {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(dp.add(D_BYTES) as *const __m256i));
                for c in 0..N {
                    summ[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(*sy[c].add(i)), summ[c]);
                }
            }
            for c in 0..N {
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(*dy[c].add(i)));
                let q = y[c].add(i * ab + qoff) as *const i32;
                let s = seed[c].add(i * 8);
                for l in 0..8 {
                    let dot = _mm512_dpbusd_epi32(
                        _mm512_set1_epi32(*s.add(l)),
                        u[l],
                        _mm512_set1_epi32(q.add(l).read_unaligned()),
                    );
                    acc[c][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc[c][l]);
                }
            }
        }
        for c in 0..N {
            let a = &acc[c];
            let mut s = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
            );
            if MIN {
                s = _mm512_add_ps(s, summ[c]);
            }
            _mm512_storeu_ps(out.as_mut_ptr().add(c * R), s);
        }
    }

    /// A 5- or 4-bit group (`nb` blocks, the `BITS` layout, with `MIN` the mins' scale bytes)
    /// rewritten in the Q8_0 form (levels as bytes, the same scales).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn unpack<const BITS: u8, const MIN: bool>(
        nb: usize,
        w: &[u8],
        dst: &mut [u8],
    ) {
        let sb = scale_bytes(MIN);
        for i in 0..nb {
            let (u, dp) = chunks::<BITS, MIN>(w.as_ptr(), i);
            let (lv, dq) = offsets(Q8_LEVELS, sb, i);
            let p = dst.as_mut_ptr();
            for (l, v) in u.iter().enumerate() {
                _mm512_storeu_si512(p.add(lv + 64 * l) as *mut _, *v);
            }
            std::ptr::copy_nonoverlapping(dp, p.add(dq), sb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack::testing::{assert_rows_round_trip, assert_same_results, Rng};

    #[test]
    fn simd_equals_the_scalar_form_and_the_row_major_kernels() {
        let (rows, cols) = (32, 160);
        let mut rng = Rng::new(0x5eed_1234_abcd_0001);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::Q5_1,
            GgmlType::Q4_1,
        ] {
            let (w, rb) = rng.matrix(ty, rows, cols);
            let packed = Q32Repacked::new(ty, &w, rows, cols).unwrap();
            assert_rows_round_trip(&w, rb, |r, out| packed.native_row(r, out));
            let at = crate::vec_dot_type(ty);
            let ab = crate::row_bytes(at, cols).unwrap();
            for t in [1usize, 2, 3, 8, 11] {
                let acts = rng.acts(at, t, cols);
                let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
                let prepared = packed.prepare(&act_rows).unwrap();
                for g in 0..rows / R {
                    let mut got = vec![0f32; t * R];
                    packed.dot_group(g, &prepared, &mut got).unwrap();
                    let mut want = vec![0f32; t * R];
                    for c in 0..t {
                        packed.dot_scalar(
                            packed.group(g),
                            &prepared,
                            c,
                            &mut want[c * R..(c + 1) * R],
                        );
                    }
                    let rows_here: Vec<&[u8]> =
                        w[g * R * rb..(g + 1) * R * rb].chunks(rb).collect();
                    let mut row_major = vec![0f32; R * t];
                    crate::vec_dot_rows(ty, cols, &rows_here, &act_rows, &mut row_major).unwrap();
                    assert_same_results(&got, &want, &row_major, t, &format!("{ty} t {t} g {g}"));
                }
            }
            assert!(Q32Repacked::new(ty, &w[..rb * 8], 8, cols).is_err());
        }
    }
}
