//! Weights repacked at load into groups of 16 rows, so one 512-bit vector holds four
//! consecutive quants of each of 16 rows and every `vpdpbusd` lane is one output row: the
//! integer dot products need no horizontal sums (on AVX2, Q4_K's: a 256-bit vector holds
//! eight of the rows, and each row's `maddubs` pair sums are its lanes). Each layout keeps the
//! f32 arithmetic of the llama.cpp kernel it replaces, so results stay bit-identical (Q5_K
//! excepted: it takes Q4_K's order, llama.cpp having no repacked Q5_K to follow):
//! - [`q4k`]: Q4_K, as llama.cpp's own repacked `q4_K_8x8` kernels, and Q5_K in the same
//!   order (with a plane of fifth bits);
//! - [`q6k`]: Q6_K, as its `ggml_vec_dot_q6_K_q8_K` (fewer than 8 tokens) and its tiled
//!   K-quant matmul (8 tokens or more);
//! - [`q32`]: Q8_0, Q5_0 and Q4_0, as its `vec_dot` and tinyBLAS kernels for them.
//!
//! A repacked group's super-block holds exactly the bytes of its 16 native blocks (decode
//! streams every weight byte once per token, so the repack adds none); groups start on a
//! cache line.

pub mod q32;
pub mod q4k;
pub mod q6k;
#[cfg(test)]
pub(crate) mod testing;

pub use q32::{Q32Acts, Q32Repacked};
pub use q4k::Q4KRepacked;
pub use q6k::Q6KRepacked;

use crate::QuantError;
use kestrel_gguf::GgmlType;
use std::sync::Arc;

/// Rows per group.
pub const R: usize = 16;
/// Bytes of one Q8_K activation block.
const Q8K_BYTES: usize = 292;

/// A matrix in one of the repacked layouts.
pub enum Repacked {
    /// Q4_K and Q5_K.
    Q4K(Q4KRepacked),
    Q6K(Q6KRepacked),
    Q32(Q32Repacked),
}

/// A matmul's activation rows, quantized to [`Repacked::act_type`] and prepared once for
/// every group ([`Repacked::prepare`]).
pub enum PreparedActs<'a> {
    /// Q8_K rows, and where AMX runs, the same rows as A tiles (shared by the K-quant
    /// matrices of a fused job: [`Repacked::prepare_after`]).
    Q8K(&'a [&'a [u8]], Option<Arc<AmxPanel>>),
    /// Q8_0 rows (Q8_1 for Q5_1 / Q4_1), prepared for the 32-element groups.
    Q32(Q32Acts<'a>),
}

impl Repacked {
    /// Whether `ty` has a repacked layout and kernel on this CPU for a matrix of `rows` rows:
    /// every layout with AVX-512 VNNI, Q4_K's, Q5_K's and Q6_K's with AVX2 too (their `avx2`
    /// kernels).
    pub fn supports(ty: GgmlType, rows: usize) -> bool {
        let simd = match ty {
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q5_1 | GgmlType::Q4_1 => {
                avx512_available()
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => crate::cpu::avx2_available(),
            _ => false,
        };
        simd && rows.is_multiple_of(R)
    }

    /// Repack `rows` rows of `cols` elements of type `ty` (`bytes` row-major, as in a GGUF file).
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        Self::new_with(ty, bytes, rows, cols, &mut |_| {})
    }

    /// [`Repacked::new`], calling `done(rows)` as the first `rows` rows are repacked.
    pub fn new_with(
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        done: &mut dyn FnMut(usize),
    ) -> Result<Self, QuantError> {
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => Ok(Self::Q4K(Q4KRepacked::new_with(
                ty, bytes, rows, cols, done,
            )?)),
            GgmlType::Q6_K => Ok(Self::Q6K(Q6KRepacked::new_with(bytes, rows, cols, done)?)),
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q5_1 | GgmlType::Q4_1 => {
                Ok(Self::Q32(Q32Repacked::new_with(
                    ty, bytes, rows, cols, done,
                )?))
            }
            _ => Err(QuantError::Unsupported { ty, op: "repack" }),
        }
    }

    /// Resident bytes beyond the file's for a matrix of `rows` x `cols` of type `ty` (the
    /// padding that starts each group on a cache line), for the memory plan.
    pub fn extra_bytes(ty: GgmlType, rows: usize, cols: usize) -> u64 {
        let nb = cols / crate::blocks::QK_K;
        let group = match ty {
            GgmlType::Q4_K => nb * q4k::GROUP_BLOCK_BYTES,
            GgmlType::Q5_K => nb * q4k::Q5K_GROUP_BLOCK_BYTES,
            GgmlType::Q6_K => nb * q6k::GROUP_BLOCK_BYTES,
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q5_1 | GgmlType::Q4_1 => {
                cols / 32 * q32::group_block_bytes(ty)
            }
            _ => return 0,
        };
        ((rows / R) * (group.next_multiple_of(64) - group)) as u64
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Q4K(p) => p.rows(),
            Self::Q6K(p) => p.rows(),
            Self::Q32(p) => p.rows(),
        }
    }

    /// Row `r` as the file stored it (`out`: exactly the row's bytes).
    pub fn native_row(&self, r: usize, out: &mut [u8]) -> Result<(), QuantError> {
        let (rows, ty, cols) = match self {
            Self::Q4K(p) => (p.rows(), p.ty(), p.cols()),
            Self::Q6K(p) => (p.rows(), GgmlType::Q6_K, p.cols()),
            Self::Q32(p) => (p.rows(), p.ty(), p.cols()),
        };
        let row_bytes = crate::row_bytes(ty, cols)?;
        if r >= rows || out.len() != row_bytes {
            return Err(QuantError::Len {
                what: "repacked row",
                expected: row_bytes,
                got: out.len(),
            });
        }
        match self {
            Self::Q4K(p) => p.native_row(r, out),
            Self::Q6K(p) => p.native_row(r, out),
            Self::Q32(p) => p.native_row(r, out),
        }
        Ok(())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Q4K(p) => p.bytes(),
            Self::Q6K(p) => p.bytes(),
            Self::Q32(p) => p.bytes(),
        }
    }

    /// The activation type the kernels take (Q8_K for the K-quants, Q8_0 for the others but
    /// Q5_1 / Q4_1, which take Q8_1).
    pub fn act_type(&self) -> GgmlType {
        match self {
            Self::Q4K(_) | Self::Q6K(_) => GgmlType::Q8_K,
            Self::Q32(p) => crate::vec_dot_type(p.ty()),
        }
    }

    /// Prepares a matmul's activation rows (all its tokens, [`Repacked::act_type`] rows of
    /// `cols`) once for every group.
    pub fn prepare<'a>(&self, rows: &'a [&'a [u8]]) -> Result<PreparedActs<'a>, QuantError> {
        match self {
            Self::Q4K(p) => Ok(PreparedActs::Q8K(rows, p.amx_panel(rows).map(Arc::new))),
            Self::Q6K(p) => Ok(PreparedActs::Q8K(rows, p.amx_panel(rows).map(Arc::new))),
            Self::Q32(p) => Ok(PreparedActs::Q32(p.prepare(rows)?)),
        }
    }

    /// [`Repacked::prepare`] for a matrix that shares its input with matrices already
    /// prepared (`earlier`, the q/k/v or gate/up of one job): a K-quant matrix takes the AMX
    /// panel of an earlier K-quant matrix of the same rows instead of building its own copy.
    pub fn prepare_after<'a>(
        &self,
        rows: &'a [&'a [u8]],
        earlier: &[PreparedActs<'a>],
    ) -> Result<PreparedActs<'a>, QuantError> {
        if matches!(self, Self::Q4K(_) | Self::Q6K(_)) {
            let same_rows = |a: &&[&[u8]]| std::ptr::eq(*a, rows);
            let shared = earlier.iter().find_map(|e| match e {
                PreparedActs::Q8K(a, Some(panel)) if same_rows(a) => Some(panel),
                _ => None,
            });
            if let Some(panel) = shared {
                return Ok(PreparedActs::Q8K(rows, Some(Arc::clone(panel))));
            }
        }
        self.prepare(rows)
    }

    /// Rows `16 g .. 16 g + 16` against every activation row of a matmul: `out[t * 16 + r]`.
    /// The token count picks llama.cpp's order for the type (see the layouts' modules).
    pub fn dot_group(
        &self,
        g: usize,
        acts: &PreparedActs,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        match (self, acts) {
            (Self::Q4K(p), PreparedActs::Q8K(a, panel)) => {
                p.dot_group(g, a, panel.as_deref(), a.len() - a.len() % 4, out)
            }
            (Self::Q6K(p), PreparedActs::Q8K(a, panel)) => p.dot_group(g, a, panel.as_deref(), out),
            (Self::Q32(p), PreparedActs::Q32(a)) => p.dot_group(g, a, out),
            _ => Err(QuantError::Len {
                what: "activations prepared for another repacked type",
                expected: 0,
                got: 0,
            }),
        }
    }
}

/// The arguments of a K-quant layout's `dot_group`, checked: group `g` of `groups`, `out` of 16
/// floats per activation row, and every activation row a Q8_K row of `nb` super-blocks.
fn check_q8k_group(
    what: &'static str,
    g: usize,
    groups: usize,
    nb: usize,
    acts: &[&[u8]],
    out: &[f32],
) -> Result<(), QuantError> {
    if g >= groups || out.len() != acts.len() * R {
        return Err(QuantError::Len {
            what,
            expected: acts.len() * R,
            got: out.len(),
        });
    }
    match acts.iter().find(|a| a.len() != nb * Q8K_BYTES) {
        Some(a) => Err(QuantError::Len {
            what: "Q8_K activation row",
            expected: nb * Q8K_BYTES,
            got: a.len(),
        }),
        None => Ok(()),
    }
}

/// The row size of a `rows` x `cols` matrix of `ty` held in `bytes`, checked for a repack
/// (`rows` a multiple of 16, `bytes` exactly the rows).
fn source_row_bytes(
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    what: &'static str,
) -> Result<usize, QuantError> {
    let row_bytes = crate::blocks::row_bytes(ty, cols)?;
    if !rows.is_multiple_of(R) || bytes.len() != rows * row_bytes {
        return Err(QuantError::Len {
            what,
            expected: rows.next_multiple_of(R) * row_bytes,
            got: bytes.len(),
        });
    }
    Ok(row_bytes)
}

pub use crate::amx::AMX_MIN_TOKENS;

/// A matmul's Q8_K activation rows laid out as AMX A tiles, built once per matmul where AMX
/// runs: per 16-token tile, super-block and 64-element chunk, the chunk's quants of each token,
/// 1 KiB (`[tile][nb][chunk][16 tokens][64]`). Tile loads then read whole cache lines instead
/// of 64 bytes straddling two lines of every activation row (that cost 15-25% of the Q4_K AMX
/// matmul). Both K-quant layouts take their A tiles from it.
pub struct AmxPanel {
    data: AlignedBytes,
    tokens: usize,
    nb: usize,
}

impl AmxPanel {
    /// The panel of `acts` (Q8_K rows of `nb` super-blocks), when AMX runs here and the matmul
    /// is long enough for it ([`AMX_MIN_TOKENS`]); `None` otherwise (or for rows of the wrong
    /// length, which the kernels then report).
    pub fn new(acts: &[&[u8]], nb: usize) -> Option<AmxPanel> {
        if acts.len() < AMX_MIN_TOKENS || !crate::amx::available() {
            return None;
        }
        Self::build(acts, nb)
    }

    /// The layout itself, on any CPU (`None` for rows of the wrong length).
    fn build(acts: &[&[u8]], nb: usize) -> Option<AmxPanel> {
        if acts.iter().any(|a| a.len() != nb * Q8K_BYTES) {
            return None;
        }
        let mut data = AlignedBytes::zeroed(acts.len().div_ceil(16) * nb * 4 * 1024);
        let d = data.as_mut_slice();
        for (t, a) in acts.iter().enumerate() {
            for i in 0..nb {
                for kc in 0..4 {
                    let at = (((t / 16) * nb + i) * 4 + kc) * 1024 + (t % 16) * 64;
                    d[at..at + 64].copy_from_slice(&a[i * Q8K_BYTES + 4 + 64 * kc..][..64]);
                }
            }
        }
        Some(AmxPanel {
            data,
            tokens: acts.len(),
            nb,
        })
    }

    /// Whether this panel holds a matmul's `tokens` rows of `nb` super-blocks.
    pub(crate) fn fits(&self, tokens: usize, nb: usize) -> bool {
        self.tokens == tokens && self.nb == nb
    }

    /// The 16-token tile starting at token `t0` (a multiple of 16): `nb * 4` KiB.
    pub(crate) fn tile(&self, t0: usize) -> *const u8 {
        self.data.as_slice()[t0 / 16 * self.nb * 4 * 1024..].as_ptr()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Runs `f` on this thread's scratch for a group's AMX B tiles, `len` bytes on a cache line
/// (kept between calls: a matmul makes one per row group).
#[cfg(target_arch = "x86_64")]
fn with_b_tiles<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    thread_local! {
        static B_TILES: std::cell::RefCell<AlignedBytes> =
            std::cell::RefCell::new(AlignedBytes::zeroed(0));
    }
    B_TILES.with_borrow_mut(|bq| {
        if bq.len() < len {
            *bq = AlignedBytes::zeroed(len);
        }
        f(&mut bq.as_mut_slice()[..len])
    })
}

pub use crate::cpu::avx512_available;

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

#[cfg(test)]
mod tests {
    use super::*;
    use testing::Rng;

    #[test]
    fn the_weight_prefetch_default_follows_the_vendor_and_the_summary_names_it() {
        if std::env::var_os("KESTREL_WEIGHT_PREFETCH").is_some() {
            return; // set by hand: the default is not in play
        }
        let ahead = crate::cpu::weight_prefetch_ahead();
        assert_eq!(ahead, if crate::cpu_is_amd() { 0 } else { 4096 });
        if crate::cpu::avx2_available() {
            let summary = crate::kernels_summary();
            let named = if ahead == 0 {
                "no weight prefetch".to_string()
            } else {
                format!("prefetches weights {ahead} B ahead")
            };
            assert!(summary.contains(&named), "{summary}");
        }
    }

    #[test]
    fn the_amx_panel_holds_each_tokens_chunks_where_its_tile_reads_them() {
        let (nb, t_len) = (3, 37);
        let ab = nb * Q8K_BYTES;
        let acts = Rng::new(7).acts(GgmlType::Q8_K, t_len, nb * 256);
        let rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
        let panel = AmxPanel::build(&rows, nb).unwrap();
        assert!(panel.fits(t_len, nb) && !panel.fits(t_len - 1, nb));
        assert_eq!(panel.bytes(), t_len.div_ceil(16) * nb * 4 * 1024);
        for (t, row) in rows.iter().enumerate() {
            // SAFETY: `tile` points into the panel; every offset stays inside its 16-token tile.
            let tile = panel.tile(t / 16 * 16);
            for i in 0..nb {
                for kc in 0..4 {
                    let at = (i * 4 + kc) * 1024 + (t % 16) * 64;
                    let got = unsafe { std::slice::from_raw_parts(tile.add(at), 64) };
                    assert_eq!(
                        got,
                        &row[i * Q8K_BYTES + 4 + 64 * kc..][..64],
                        "t {t} i {i} kc {kc}"
                    );
                }
            }
        }
        let short: Vec<&[u8]> = rows.iter().map(|r| &r[..ab - 1]).collect();
        assert!(AmxPanel::build(&short, nb).is_none());
    }

    #[test]
    fn k_quant_matrices_of_one_job_share_one_amx_panel() {
        let (nb, t_len) = (2, 40);
        let cols = nb * 256;
        let mut rng = Rng::new(11);
        let (w6, _) = rng.matrix(GgmlType::Q6_K, R, cols);
        let (w8, _) = rng.matrix(GgmlType::Q8_0, R, cols);
        let q6 = Repacked::new(GgmlType::Q6_K, &w6, R, cols).unwrap();
        let q8 = Repacked::new(GgmlType::Q8_0, &w8, R, cols).unwrap();
        let acts = rng.acts(GgmlType::Q8_K, t_len, cols);
        let rows: Vec<&[u8]> = acts.chunks_exact(nb * Q8K_BYTES).collect();
        let copy = rows.clone();
        // Built by hand so that the sharing is tested on any CPU; never handed to a kernel.
        let earlier = [PreparedActs::Q8K(
            &rows,
            AmxPanel::build(&rows, nb).map(Arc::new),
        )];
        let panel_of = |p: &PreparedActs| match p {
            PreparedActs::Q8K(_, Some(panel)) => Some(Arc::clone(panel)),
            _ => None,
        };
        let first = panel_of(&earlier[0]).unwrap();
        let shared = q6.prepare_after(&rows, &earlier).unwrap();
        assert!(Arc::ptr_eq(&panel_of(&shared).unwrap(), &first));
        // Other rows (equal bytes, another slice) get their own panel, where AMX runs at all.
        match panel_of(&q6.prepare_after(&copy, &earlier).unwrap()) {
            Some(own) => assert!(!Arc::ptr_eq(&own, &first)),
            None => assert!(!crate::amx::available()),
        }
        // A Q8_0-activation layout takes no K-quant panel: it checks the rows as its own.
        assert!(q8.prepare_after(&rows, &earlier).is_err());
    }
}
