//! The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on x86, outside the repacked
//! layouts:
//! - prefill: up to [`PANEL_ROWS`] weight rows at a time decoded once into a backend's
//!   [`PrefillPanel`], then every activation row against it in tiles of four rows x
//!   [`PrefillPanel::TOKENS`] tokens; the activations' block scales converted to f32 once per
//!   call, in groups of `TOKENS` tokens, transposed (`[group][block][token]`), as the tiles
//!   read them;
//! - decode and batched decode on AVX2: quads of rows straight from the file's layout
//!   ([`row_quads`]).

use super::{vec_dot_type, Backend, PANEL_ROWS, RUN};
use kestrel_gguf::GgmlType;
use std::cell::RefCell;

/// A backend's decoded weight rows and its register tile over them.
pub(crate) trait PrefillPanel {
    /// Tokens per tile (at most 4).
    const TOKENS: usize;

    fn new() -> Self;

    /// Decodes rows `x` (1..=[`PANEL_ROWS`]) as `ceil(len / 4)` quads.
    ///
    /// # Safety
    /// The backend's features are available; each row holds `nb` blocks of `w` (a
    /// [`has_panel`] type).
    unsafe fn fill(&mut self, w: GgmlType, nb: usize, x: &[*const u8]);

    /// Quad `q` of the filled panel against the activation rows `y[..TOKENS]`, whose block
    /// scales are `dyt[TOKENS * block + c]`: lane `4c + r` of the result is row r . token c,
    /// bit for bit the backend's `vec_dot` of that pair.
    ///
    /// # Safety
    /// As [`PrefillPanel::fill`]; the panel holds quad `q` of `nb` blocks of `w`; each
    /// `y[c]` holds `nb` blocks of `vec_dot_type(w)`; `dyt` has `TOKENS * nb` floats.
    unsafe fn tile(
        &mut self,
        w: GgmlType,
        nb: usize,
        q: usize,
        y: [*const u8; 4],
        dyt: *const f32,
    ) -> [f32; 16];
}

/// Whether `backend` has a prefill panel (and, AVX2, row quads; AVX-512, prepared-activation
/// decode) for `w`: the 32-element types on AVX2 and AVX-512.
pub(crate) fn has_panel(backend: Backend, w: GgmlType) -> bool {
    matches!(backend, Backend::Avx2 | Backend::Avx512Vnni)
        && matches!(
            w,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
        )
}

/// The activations' block scales: per token `[block]`, then transposed per group of tokens.
struct Scales {
    dy: Vec<f32>,
    dyt: Vec<f32>,
}

thread_local! {
    static SCALES: RefCell<Scales> = const { RefCell::new(Scales { dy: Vec::new(), dyt: Vec::new() }) };
    static AVX512: RefCell<super::avx512::Panel> = RefCell::new(PrefillPanel::new());
    static AVX2: RefCell<super::avx2::panel::Panel> = RefCell::new(PrefillPanel::new());
}

/// `w_rows` against `acts` through `backend`'s panel, the results handed to `put` as
/// [`vec_dot_rows_each`](super::vec_dot_rows_each) does; false (nothing done) where the
/// backend has no panel for `w`.
///
/// # Safety
/// `backend` is available on this CPU; every row was checked to hold `nb` blocks of `w` (the
/// weights) or of `vec_dot_type(w)` (the activations).
pub(crate) unsafe fn panel_rows(
    backend: Backend,
    w: GgmlType,
    nb: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    put: &mut impl FnMut(usize, usize, &[f32; RUN], usize),
) -> bool {
    if !has_panel(backend, w) {
        return false;
    }
    match backend {
        Backend::Avx512Vnni => AVX512.with_borrow_mut(|p| run(p, w, nb, w_rows, acts, put)),
        Backend::Avx2 => AVX2.with_borrow_mut(|p| run(p, w, nb, w_rows, acts, put)),
        Backend::Generic => return false,
    }
    true
}

unsafe fn run<P: PrefillPanel>(
    panel: &mut P,
    w: GgmlType,
    nb: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    put: &mut impl FnMut(usize, usize, &[f32; RUN], usize),
) {
    let t = acts.len();
    if t == 0 {
        return;
    }
    let k = P::TOKENS;
    let groups = t.div_ceil(k);
    SCALES.with_borrow_mut(|Scales { dy, dyt }| {
        act_scales(w, nb, acts, dy);
        dyt.clear();
        dyt.resize(groups * nb * k, 0.0);
        for (g, dg) in dyt.chunks_exact_mut(nb * k).enumerate() {
            for j in 0..k {
                // Past the last token the group repeats it (results not handed out).
                let c = (k * g + j).min(t - 1);
                for (i, &d) in dy[c * nb..(c + 1) * nb].iter().enumerate() {
                    dg[k * i + j] = d;
                }
            }
        }
        let mut r = 0;
        while r < w_rows.len() {
            let mr = (w_rows.len() - r).min(PANEL_ROWS);
            let x: Vec<*const u8> = w_rows[r..r + mr].iter().map(|row| row.as_ptr()).collect();
            panel.fill(w, nb, &x);
            for g in 0..groups {
                let c = k * g;
                let yy = [0, 1, 2, 3].map(|j| acts[(c + j).min(t - 1)].as_ptr());
                let nr = (t - c).min(k);
                // [token][row] of this group.
                let mut vals = [[0f32; RUN]; 4];
                for q in 0..mr.div_ceil(4) {
                    let v = panel.tile(w, nb, q, yy, dyt[g * nb * k..].as_ptr());
                    for (j, run) in vals.iter_mut().enumerate().take(k) {
                        run[4 * q..4 * q + 4].copy_from_slice(&v[4 * j..4 * j + 4]);
                    }
                }
                for (j, run) in vals.iter().enumerate().take(nr) {
                    put(c + j, r, run, mr);
                }
            }
            r += mr;
        }
    });
}

/// The f16 scales leading each of the `nb` blocks of every activation row, as f32, row after
/// row in `dy`.
///
/// # Safety
/// F16C is available; every row holds `nb` blocks of `vec_dot_type(w)`.
unsafe fn act_scales(w: GgmlType, nb: usize, acts: &[&[u8]], dy: &mut Vec<f32>) {
    let by = vec_dot_type(w).block_bytes() as usize;
    dy.clear();
    dy.resize(acts.len() * nb, 0.0);
    for (a, d) in acts.iter().zip(dy.chunks_exact_mut(nb)) {
        for (i, o) in d.iter_mut().enumerate() {
            *o = super::x86::fp16(a.as_ptr().add(i * by));
        }
    }
}

/// `out[r * t + c] = row r . acts[c]` (`t = acts.len()`) for the rows of `row_bytes` in
/// `w_rows` through AVX2's row quads ([`super::avx2::rows`]).
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` is a [`has_panel`] type; `w_rows` holds
/// `out.len() / t` rows of `nb` blocks and every activation row `nb` blocks of
/// `vec_dot_type(w)`.
pub(crate) unsafe fn row_quads(
    w: GgmlType,
    nb: usize,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) {
    debug_assert!(has_panel(Backend::Avx2, w));
    SCALES.with_borrow_mut(|Scales { dy, .. }| {
        act_scales(w, nb, acts, dy);
        super::avx2::rows::matmul(w, nb, w_rows.as_ptr(), row_bytes, acts, dy, out);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{row_bytes, vec_dot_multi_with};

    /// AVX2's row quads (decode, batched decode) equal its `vec_dot` per row and token, bit
    /// for bit: every type, row counts around the quads, token counts around the pairs.
    #[test]
    fn avx2_row_quads_equal_the_dot_per_row() {
        if !Backend::Avx2.is_available() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut rng = crate::repack::testing::Rng::new(0x051a_b1e5);
        let n = 320;
        for w in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let (rb, ab) = (
                row_bytes(w, n).unwrap(),
                row_bytes(vec_dot_type(w), n).unwrap(),
            );
            let (x, _) = rng.matrix(w, 9, n);
            let y = rng.acts(vec_dot_type(w), 5, n);
            for rows in 1..=9 {
                for t in 1..=5 {
                    let acts: Vec<&[u8]> = y.chunks_exact(ab).take(t).collect();
                    let mut got = vec![0f32; rows * t];
                    // SAFETY: AVX2 is available; the rows and activations hold `n` elements.
                    unsafe { row_quads(w, n / 32, &x[..rows * rb], rb, &acts, &mut got) };
                    for r in 0..rows {
                        let mut want = vec![0f32; t];
                        let row = &x[r * rb..(r + 1) * rb];
                        vec_dot_multi_with(Backend::Avx2, w, n, row, &acts, &mut want).unwrap();
                        for c in 0..t {
                            assert_eq!(
                                got[r * t + c].to_bits(),
                                want[c].to_bits(),
                                "{w} rows {rows} t {t} ({r}, {c})"
                            );
                        }
                    }
                }
            }
        }
    }
}
