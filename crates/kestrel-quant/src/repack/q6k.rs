//! Q6_K repacked into 16-row groups, with llama.cpp's f32 arithmetic for Q6_K on x86 (which
//! itself does not repack Q6_K there), so results equal the row-major kernels bit for bit:
//!
//! - fewer than 8 tokens, `ggml_vec_dot_q6_K_q8_K` (AVX2): per super-block 8 integer lanes,
//!   lane `l` gathering elements `4l .. 4l + 4` of every 32 times their sub-block scales, seeded
//!   with `-32 (sc_2l bsum_2l + sc_2l+1 bsum_2l+1)`; then `acc_l = fma(d * yd, lane_l, acc_l)`
//!   and at the end `hsum_float_8`. Here each of the 8 lanes is one vector over the 16 rows:
//!   a `vpdpbusd` gives 4 products per row, a `vpdpwssd` adds them times the row's scale (the
//!   4-product sum fits 16 bits: 4 * 63 * 128 < 2^15).
//! - 8 tokens or more, its tiled K-quant matmul: one integer sum per super-block,
//!   `chain = fma(float(isum) * d, yd, chain)`. Where the CPU has AMX, matmuls of
//!   [`super::AMX_MIN_TOKENS`] tokens or more take that integer sum from tile products
//!   (`amx_kernel`), the same integer, so the same results.
//!
//! Layout of one group (16 rows), `nb` super-blocks of 3,360 bytes each, as many as the 16
//! native blocks, in pairs `[quants 2p][meta 2p][meta 2p+1][quants 2p+1]` (one stream whose
//! quants start on cache lines; groups padded to a cache line), meta = `d` then scales:
//! - quants, 3,072 bytes per super-block: for each group of 32 elements `g` and half `h`, a
//!   "quad" of the 4-element chunks `l = 4h .. 4h + 4` (A, B, C, D), 192 bytes as three 64-byte
//!   vectors indexed `4 r + k` (row r, element `32 g + 4 l + k`):
//!   `Z0 = A | hi2(C) << 6`, `Z1 = B | hi2(D) << 6`, `Z2 = lo4(C) | lo4(D) << 4`, where A..D
//!   are 6-bit levels (`q + 32`); A and B come out with one mask, C and D with three or four ops;
//! - `d[16]` f16, 32 bytes per super-block;
//! - scales, 256 bytes per super-block: `sc[p][r][t]` i8, sub-block `2p + t` of row r (so one
//!   32-byte load sign-extends to the 16 rows' scale pairs of element group `p`).
//!
//! On CPUs with AVX2 and no AVX-512 the `avx2` kernels run over the same layout, eight rows a
//! vector, with the same integers and f32 steps (so the same bits).

use super::{f16_at, f32_at, i16_at, AlignedBytes, AmxPanel, Q8K_BYTES, R};
use crate::blocks::{BlockQ6K, QK_K};
use crate::QuantError;
use kestrel_gguf::GgmlType;

const Q6K_BYTES: usize = 210;
const QS_BYTES: usize = 3072;
const QUAD_BYTES: usize = 192;
const D_BYTES: usize = 2 * R;
const SC_BYTES: usize = 16 * R;
/// Bytes of one group's super-block.
pub const GROUP_BLOCK_BYTES: usize = QS_BYTES + D_BYTES + SC_BYTES;
const META_BYTES: usize = D_BYTES + SC_BYTES;

/// Where super-block `i`'s quants and its `d` + scales ("meta") start in a group. Super-blocks
/// go in pairs, `[qs 2p][meta 2p][meta 2p+1][qs 2p+1]`, one stream in decode order whose
/// quants all start on a cache line (a pair is 105 lines).
#[inline(always)]
fn offsets(i: usize) -> (usize, usize) {
    let base = (i / 2) * 2 * GROUP_BLOCK_BYTES;
    if i.is_multiple_of(2) {
        (base, base + QS_BYTES)
    } else {
        (
            base + QS_BYTES + 2 * META_BYTES,
            base + QS_BYTES + META_BYTES,
        )
    }
}

/// Activation rows from which a matmul takes llama.cpp's tiled order.
const BATCHED_MIN_TOKENS: usize = crate::dot::BATCHED_MIN_TOKENS;

/// A Q6_K matrix (`rows` a multiple of 16) in the repacked layout.
pub struct Q6KRepacked {
    rows: usize,
    cols: usize,
    /// Bytes from one group's start to the next (a multiple of 64).
    stride: usize,
    data: AlignedBytes,
}

/// The 256 unsigned 6-bit levels (`q + 32`) of a native block, in element order.
fn levels(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        let (ql, qh) = (&b.ql[64 * n..], &b.qh[32 * n..]);
        for l in 0..32 {
            let e = 128 * n + l;
            q[e] = (ql[l] & 15) | (qh[l] & 3) << 4;
            q[e + 32] = (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4;
            q[e + 64] = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
            q[e + 96] = (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4;
        }
    }
    q
}

impl Q6KRepacked {
    /// Repack `rows` rows of `cols` Q6_K elements (`bytes` row-major, as in a GGUF file).
    pub fn new(bytes: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        Self::new_with(bytes, rows, cols, &mut |_| {})
    }

    /// [`Self::new`], calling `done(rows)` as the first `rows` rows are repacked (every
    /// 1,024 rows), so the caller can release their source pages as it goes.
    pub fn new_with(
        bytes: &[u8],
        rows: usize,
        cols: usize,
        done: &mut dyn FnMut(usize),
    ) -> Result<Self, QuantError> {
        let row_bytes = super::source_row_bytes(
            GgmlType::Q6_K,
            bytes,
            rows,
            cols,
            "Q6_K repack (rows must be a multiple of 16)",
        )?;
        let nb = cols / QK_K;
        let stride = (nb * GROUP_BLOCK_BYTES).next_multiple_of(64);
        let mut data = AlignedBytes::zeroed(rows / R * stride);
        let buf = data.as_mut_slice();
        for g in 0..rows / R {
            let dst = &mut buf[g * stride..][..nb * GROUP_BLOCK_BYTES];
            for i in 0..nb {
                for r in 0..R {
                    let src = &bytes[(g * R + r) * row_bytes + i * Q6K_BYTES..][..Q6K_BYTES];
                    let blk: BlockQ6K = crate::blocks::read_block(src);
                    let q = levels(&blk);
                    for quad in 0..16 {
                        let (eg, h) = (quad / 2, quad % 2);
                        let base = offsets(i).0 + quad * QUAD_BYTES;
                        for k in 0..4 {
                            let at = |c: usize| q[32 * eg + 4 * (4 * h + c) + k];
                            let (a, b, c, d) = (at(0), at(1), at(2), at(3));
                            dst[base + 4 * r + k] = a | (c >> 4) << 6;
                            dst[base + 64 + 4 * r + k] = b | (d >> 4) << 6;
                            dst[base + 128 + 4 * r + k] = (c & 15) | (d & 15) << 4;
                        }
                    }
                    let d_at = offsets(i).1 + 2 * r;
                    dst[d_at..d_at + 2].copy_from_slice(&blk.d.0.to_le_bytes());
                    let sc_at = offsets(i).1 + D_BYTES;
                    for j in 0..16 {
                        dst[sc_at + 32 * (j / 2) + 2 * r + j % 2] = blk.scales[j] as u8;
                    }
                }
            }
            if (g + 1) % 64 == 0 {
                done((g + 1) * R);
            }
        }
        Ok(Self {
            rows,
            cols,
            stride,
            data,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (for the memory plan).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as the file stored it (`out`: the row's bytes, 210 per super-block).
    pub fn native_row(&self, r: usize, out: &mut [u8]) {
        let (g, rr) = (r / R, r % R);
        let w = self.group(g);
        for (i, blk) in out.chunks_exact_mut(Q6K_BYTES).enumerate() {
            let q: Vec<u8> = (0..QK_K).map(|e| level(w, i, rr, e) as u8).collect();
            for n in 0..2 {
                for l in 0..32 {
                    let e = 128 * n + l;
                    blk[64 * n + l] = (q[e] & 15) | (q[e + 64] & 15) << 4;
                    blk[64 * n + l + 32] = (q[e + 32] & 15) | (q[e + 96] & 15) << 4;
                    blk[128 + 32 * n + l] = q[e] >> 4
                        | (q[e + 32] >> 4) << 2
                        | (q[e + 64] >> 4) << 4
                        | (q[e + 96] >> 4) << 6;
                }
            }
            let meta = offsets(i).1;
            for j in 0..16 {
                blk[192 + j] = w[meta + D_BYTES + 32 * (j / 2) + 2 * rr + j % 2];
            }
            blk[208..210].copy_from_slice(&w[meta + 2 * rr..meta + 2 * rr + 2]);
        }
    }

    fn group(&self, g: usize) -> &[u8] {
        &self.data.as_slice()[g * self.stride..][..self.cols / QK_K * GROUP_BLOCK_BYTES]
    }

    /// The AMX panel of these activation rows ([`AmxPanel::new`]).
    pub fn amx_panel(&self, acts: &[&[u8]]) -> Option<AmxPanel> {
        AmxPanel::new(acts, self.cols / QK_K)
    }

    /// Rows `16 g .. 16 g + 16` against every activation row of a matmul (`acts`: all its
    /// tokens, Q8_K rows of `cols`): `out[t * 16 + r]`, in llama.cpp's order for that many
    /// tokens (see the module). With `panel` (the same rows as A tiles, [`Self::amx_panel`])
    /// the integer sums come from AMX tile products.
    pub fn dot_group(
        &self,
        g: usize,
        acts: &[&[u8]],
        panel: Option<&AmxPanel>,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        let nb = self.cols / QK_K;
        super::check_q8k_group(
            "Q6_K repacked group output",
            g,
            self.rows / R,
            nb,
            acts,
            out,
        )?;
        let w = self.group(g);
        let batched = acts.len() >= BATCHED_MIN_TOKENS;
        #[cfg(target_arch = "x86_64")]
        if let Some(panel) = panel.filter(|p| batched && p.fits(acts.len(), nb)) {
            super::with_b_tiles(nb * amx_kernel::B_BYTES, |bq| {
                // SAFETY: a panel exists only where AMX (and so AVX-512 VNNI) is available; it
                // holds these `acts` (same count, same `nb`), whose lengths were checked above;
                // `bq` holds `nb` super-blocks of B tiles.
                unsafe { amx_kernel::group(nb, w, acts, panel, out, bq) };
            });
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            for (a, o) in acts.chunks(4).zip(out.chunks_mut(4 * R)) {
                // SAFETY: AVX-512 VNNI is available; the group and every activation row were
                // length-checked above.
                unsafe {
                    match (batched, a.len()) {
                        (true, 4) => avx512::batched::<4>(nb, w, a, o),
                        (true, 3) => avx512::batched::<3>(nb, w, a, o),
                        (true, 2) => avx512::batched::<2>(nb, w, a, o),
                        (true, _) => avx512::batched::<1>(nb, w, a, o),
                        (false, 4) => avx512::lanes8::<4>(nb, w, a, o),
                        (false, 3) => avx512::lanes8::<3>(nb, w, a, o),
                        (false, 2) => avx512::lanes8::<2>(nb, w, a, o),
                        (false, _) => avx512::lanes8::<1>(nb, w, a, o),
                    }
                }
            }
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2_available() {
            // decode's 8 f32 lanes a row for one or two tokens a call (more would only spill)
            let n = if batched { 4 } else { 2 };
            for (a, o) in acts.chunks(n).zip(out.chunks_mut(n * R)) {
                // SAFETY: AVX2, FMA and F16C are available; the group and every activation row
                // were length-checked above.
                unsafe {
                    match (batched, a.len()) {
                        (true, 4) => avx2::batched::<4>(nb, w, a, o),
                        (true, 3) => avx2::batched::<3>(nb, w, a, o),
                        (true, 2) => avx2::batched::<2>(nb, w, a, o),
                        (true, _) => avx2::batched::<1>(nb, w, a, o),
                        (false, 2) => avx2::lanes8::<2>(nb, w, a, o),
                        (false, _) => avx2::lanes8::<1>(nb, w, a, o),
                    }
                }
            }
            return Ok(());
        }
        for (t, a) in acts.iter().enumerate() {
            dot_scalar(nb, w, a, batched, &mut out[t * R..(t + 1) * R]);
        }
        Ok(())
    }
}

/// Row r's level of element `e` of super-block `i` in a group `w` of `nb` super-blocks.
fn level(w: &[u8], i: usize, r: usize, e: usize) -> i32 {
    let (eg, l, k) = (e / 32, e % 32 / 4, e % 4);
    let base = offsets(i).0 + (2 * eg + l / 4) * QUAD_BYTES + 4 * r + k;
    let z = |v: usize| w[base + 64 * v] as i32;
    match l % 4 {
        0 => z(0) & 63,
        1 => z(1) & 63,
        2 => (z(2) & 15) | (z(0) >> 6) << 4,
        _ => (z(2) >> 4) | (z(1) >> 6) << 4,
    }
}

/// The arithmetic of the repacked kernels, one row at a time: the oracle for the SIMD form.
fn dot_scalar(nb: usize, w: &[u8], a: &[u8], batched: bool, out: &mut [f32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; 8];
        let mut chain = 0f32;
        for i in 0..nb {
            let ab = &a[i * Q8K_BYTES..];
            let yd = f32_at(ab, 0);
            let meta = offsets(i).1;
            let d = f16_at(w, meta + 2 * r);
            let sc = |j: usize| w[meta + D_BYTES + 32 * (j / 2) + 2 * r + j % 2] as i8 as i32;
            let bsum = |j: usize| i16_at(ab, 260 + 2 * j);
            let mut lanes = [0i32; 8];
            for (l, s) in lanes.iter_mut().enumerate() {
                *s = -32 * (sc(2 * l) * bsum(2 * l) + sc(2 * l + 1) * bsum(2 * l + 1));
                for eg in 0..8 {
                    let mut dot = 0;
                    for k in 0..4 {
                        let e = 32 * eg + 4 * l + k;
                        dot += level(w, i, r, e) * ab[4 + e] as i8 as i32;
                    }
                    *s += sc(2 * eg + l / 4) * dot;
                }
            }
            if batched {
                let isum: i32 = lanes.iter().sum();
                chain = ((isum as f32) * d).mul_add(yd, chain);
            } else {
                for (acc, s) in acc.iter_mut().zip(lanes) {
                    *acc = (s as f32).mul_add(d * yd, *acc);
                }
            }
        }
        *o = if batched {
            chain
        } else {
            ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// The AMX form of the tiled order. Each element's `(level - 32) * sc` (its sub-block's
/// signed scale folded in; at most 4,096 in size) is split into a low 7-bit part (u8) and a
/// high part (-32..32, i8): per 64-element chunk, one `tdpbsud` and one `tdpbssd` per 16 tokens
/// x 16 rows accumulate the whole super-block, and `C_lo + 128 C_hi` is its integer sum
/// exactly. The f32 steps are the VNNI kernel's.
#[cfg(target_arch = "x86_64")]
mod amx_kernel;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack::testing::{assert_rows_round_trip, assert_same_results, Rng};

    #[test]
    fn simd_equals_the_scalar_form_and_the_row_major_kernels() {
        let (rows, cols) = (32, 768);
        let mut rng = Rng::new(0x0bad_cafe_1234_5678);
        let (w, rb) = rng.matrix(GgmlType::Q6_K, rows, cols);
        let packed = Q6KRepacked::new(&w, rows, cols).unwrap();
        assert_rows_round_trip(&w, rb, |r, out| packed.native_row(r, out));
        let ab = crate::row_bytes(GgmlType::Q8_K, cols).unwrap();
        // From AMX_MIN_TOKENS, through AMX tiles where the CPU has them.
        for t in [1usize, 2, 3, 5, 7, 8, 9, 13, 32, 35, 50] {
            let acts = rng.acts(GgmlType::Q8_K, t, cols);
            let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
            let panel = packed.amx_panel(&act_rows);
            let amx = t >= super::super::AMX_MIN_TOKENS && crate::amx::available();
            assert_eq!(panel.is_some(), amx, "{t} tokens");
            for g in 0..rows / R {
                let mut got = vec![0f32; t * R];
                packed
                    .dot_group(g, &act_rows, panel.as_ref(), &mut got)
                    .unwrap();
                let mut want = vec![0f32; t * R];
                for (c, a) in act_rows.iter().enumerate() {
                    dot_scalar(
                        cols / QK_K,
                        packed.group(g),
                        a,
                        t >= BATCHED_MIN_TOKENS,
                        &mut want[c * R..(c + 1) * R],
                    );
                }
                // The row-major kernels in the same order (llama.cpp's, see docs/parity.md).
                let rows_here: Vec<&[u8]> = w[g * R * rb..(g + 1) * R * rb].chunks(rb).collect();
                let mut row_major = vec![0f32; R * t];
                crate::vec_dot_rows(GgmlType::Q6_K, cols, &rows_here, &act_rows, &mut row_major)
                    .unwrap();
                assert_same_results(&got, &want, &row_major, t, &format!("t {t} g {g}"));
            }
        }
        assert!(Q6KRepacked::new(&w[..rb * 8], 8, cols).is_err());
    }

    /// The AVX2 kernels against the scalar form, bit for bit, on any CPU with AVX2 (whichever
    /// backend this process detected): both orders, every token count a call takes, and the
    /// i16 sums at their largest.
    #[test]
    fn the_avx2_kernels_equal_the_scalar_form() {
        #[cfg(target_arch = "x86_64")]
        {
            if !crate::cpu::Backend::Avx2.is_available() {
                eprintln!("skipped: no AVX2 / FMA / F16C on this CPU");
                return;
            }
            let (rows, cols) = (32, 768);
            let mut rng = Rng::new(0x5eed_0006);
            let (w, _) = rng.matrix(GgmlType::Q6_K, rows, cols);
            let mut packed = Q6KRepacked::new(&w, rows, cols).unwrap();
            let ab = crate::row_bytes(GgmlType::Q8_K, cols).unwrap();
            let nb = cols / QK_K;
            // Random weights, then every level 63 against activations of +127 (tokens 0, 2,
            // ..) and -127 (tokens 1, 3, ..).
            for extreme in [false, true] {
                if extreme {
                    for g in 0..rows / R {
                        let stride = packed.stride;
                        let grp = &mut packed.data.as_mut_slice()[g * stride..(g + 1) * stride];
                        for i in 0..nb {
                            let qs = offsets(i).0;
                            grp[qs..qs + QS_BYTES].fill(0xff);
                        }
                    }
                }
                for t in 1..=4 {
                    let mut acts = rng.acts(GgmlType::Q8_K, t, cols);
                    if extreme {
                        for (c, row) in acts.chunks_exact_mut(ab).enumerate() {
                            for blk in row.chunks_exact_mut(Q8K_BYTES) {
                                blk[4..260].fill(if c % 2 == 0 { 127 } else { 0x81 });
                            }
                        }
                    }
                    let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
                    for batched in [false, true] {
                        if !batched && t > 2 {
                            continue;
                        }
                        for g in 0..rows / R {
                            let mut got = vec![0f32; t * R];
                            let (w, a, o) = (packed.group(g), &act_rows[..], &mut got[..]);
                            // SAFETY: AVX2, FMA and F16C checked above; rows of `nb` Q8_K blocks.
                            unsafe {
                                match (batched, t) {
                                    (true, 4) => avx2::batched::<4>(nb, w, a, o),
                                    (true, 3) => avx2::batched::<3>(nb, w, a, o),
                                    (true, 2) => avx2::batched::<2>(nb, w, a, o),
                                    (true, _) => avx2::batched::<1>(nb, w, a, o),
                                    (false, 2) => avx2::lanes8::<2>(nb, w, a, o),
                                    (false, _) => avx2::lanes8::<1>(nb, w, a, o),
                                }
                            }
                            for (c, a) in act_rows.iter().enumerate() {
                                let mut want = [0f32; R];
                                dot_scalar(nb, packed.group(g), a, batched, &mut want);
                                for r in 0..R {
                                    assert_eq!(
                                        got[c * R + r].to_bits(),
                                        want[r].to_bits(),
                                        "{t} tokens, batched {batched}, extreme {extreme}: \
                                         group {g} token {c} row {r}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
