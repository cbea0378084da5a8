//! Dot products between a quantized weight row and an activation row quantized to the weight
//! type's partner ([`vec_dot_type`]): the inner loop of every matmul.
//!
//! Shape: `generic` is the scalar oracle for every pair and stays forever; per-ISA modules
//! override the pairs the real models use and return `None` for the rest, which fall back to
//! the oracle. The backend is picked once per process ([`Backend::detect`]); a backend can
//! only be selected when the CPU reports its features, so nothing here can raise SIGILL.
//! aarch64 NEON slots in as one more `Backend` arm and module.

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod avx2;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
pub(crate) mod avx512;
pub mod generic;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod q32;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
pub(crate) mod x86;

use crate::blocks::check_row;
use crate::QuantError;
use kestrel_gguf::GgmlType;

/// The type activations must be quantized to before [`vec_dot`] with a weight of type `w`;
/// the same pairing as llama.cpp's CPU backend, except F16/BF16 which take F32 activations
/// (f32 accumulation). Types without a dot kernel map to themselves, and [`vec_dot`] rejects them.
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    match w {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            GgmlType::Q8_K
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => GgmlType::F32,
        other => other,
    }
}

/// Whether [`vec_dot`] has a kernel for weights of type `w`.
pub fn has_vec_dot(w: GgmlType) -> bool {
    matches!(
        w,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

pub use crate::cpu::Backend;

/// Dot product of one weight row (`n` elements of `w`) with one activation row (`n` elements of
/// `vec_dot_type(w)`), on the detected backend.
///
/// # Panics
/// When the row lengths do not match `n` or `w` has no kernel: a shape bug in the caller, which
/// checks shapes once at load. Use [`try_vec_dot`] where inputs are untrusted.
pub fn vec_dot(w: GgmlType, n: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    match try_vec_dot(w, n, w_row, act_row) {
        Ok(v) => v,
        Err(e) => panic!("vec_dot: {e}"),
    }
}

/// [`vec_dot`] with the lengths checked into an error.
pub fn try_vec_dot(w: GgmlType, n: usize, w_row: &[u8], act_row: &[u8]) -> Result<f32, QuantError> {
    let mut out = [0f32];
    vec_dot_multi_with(Backend::detect(), w, n, w_row, &[act_row], &mut out)?;
    Ok(out[0])
}

/// One weight row against several activation rows: `out[c] = w_row . acts[c]`. This is where
/// batched prefill reuses the weights: each weight block is decoded once per group of up to
/// four activation rows, and the row stays in L1 across groups.
pub fn vec_dot_multi(
    w: GgmlType,
    n: usize,
    w_row: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    vec_dot_multi_with(Backend::detect(), w, n, w_row, acts, out)
}

/// Several weight rows against several activation rows, a register-tiled block of a matmul:
/// `out[r * acts.len() + c] = w_rows[r] . acts[c]` (row-major by weight row).
///
/// For batched prefill this is the faster form: on AVX-512 and AVX2 the Q4_0 / Q4_1 / Q5_0 /
/// Q8_0 rows are decoded once into a panel for every activation row, then tiles of 4 weight
/// rows x 4 tokens (AVX-512) or x 2 (AVX2) run over it ([`q32`]); on AVX-512 Q4_K / Q6_K go through a 4 x 4 tile
/// (`maddubs` + `vpdpwssd` with the sub-block scales, one 16-lane i32 sum per super-block) that
/// is also their `vec_dot_multi` kernel (as 1 x N). Pass 4 (or a multiple of 4) weight rows
/// per call for the full tile; any count works. Results are bit-identical to calling
/// [`vec_dot_multi`] on each weight row, so the caller may mix the two freely. Other types and
/// backends run [`vec_dot_multi`] per weight row, over L2-sized chunks of the activations.
pub fn vec_dot_rows(
    w: GgmlType,
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    vec_dot_rows_with(Backend::detect(), w, n, w_rows, acts, out)
}

/// [`vec_dot_rows`] on a chosen backend.
pub fn vec_dot_rows_with(
    backend: Backend,
    w: GgmlType,
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let t = acts.len();
    if out.len() != w_rows.len() * t {
        return Err(QuantError::Len {
            what: "vec_dot_rows out",
            expected: w_rows.len() * t,
            got: out.len(),
        });
    }
    vec_dot_rows_each_with(backend, w, n, w_rows, acts, |c, r, v, len| {
        for (i, &x) in v[..len].iter().enumerate() {
            out[(r + i) * t + c] = x;
        }
    })
}

/// [`vec_dot_rows`] with the results handed over token by token, for callers whose output is
/// token-major (a matmul's `[T, rows]`): `put(c, r, v, len)` receives `v[i] = w_rows[r + i] .
/// acts[c]` for `i < len` (a run of consecutive weight rows; `v[len..]` is unspecified, so a
/// caller with [`RUN`] slack after its last row may copy `v` whole, a fixed-size copy); every
/// (row, token) pair arrives exactly once. Same kernels and bits as [`vec_dot_rows`].
pub fn vec_dot_rows_each(
    w: GgmlType,
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    put: impl FnMut(usize, usize, &[f32; RUN], usize),
) -> Result<(), QuantError> {
    vec_dot_rows_each_with(Backend::detect(), w, n, w_rows, acts, put)
}

/// [`vec_dot_rows_each`] on a chosen backend.
pub fn vec_dot_rows_each_with(
    backend: Backend,
    w: GgmlType,
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    mut put: impl FnMut(usize, usize, &[f32; RUN], usize),
) -> Result<(), QuantError> {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend != Backend::Generic
        && (q32::has_panel(backend, w) || avx512::has_tile(w) && backend == Backend::Avx512Vnni)
        && backend.is_available()
    {
        for r in w_rows {
            check_row(w, n, r.len())?;
        }
        for a in acts {
            check_row(vec_dot_type(w), n, a.len())?;
        }
        let nb = n / w.block_len() as usize;
        // SAFETY: the backend is available; the rows were length-checked above.
        if unsafe { q32::panel_rows(backend, w, nb, w_rows, acts, &mut put) } {
            return Ok(());
        }
        // The K-quants (the only other `has_tile` types) through the register tile.
        let mut r = 0;
        while r < w_rows.len() {
            let x = &w_rows[r..];
            let step = match w_rows.len() - r {
                1 => tile_rows::<1, { avx512::KTILE_A }>(w, nb, x, r, acts, &mut put),
                2 | 3 => tile_rows::<2, { avx512::KTILE_A }>(w, nb, x, r, acts, &mut put),
                _ => tile_rows::<{ avx512::KTILE_W }, { avx512::KTILE_A }>(
                    w, nb, x, r, acts, &mut put,
                ),
            };
            r += step;
        }
        return Ok(());
    }
    // The activation rows in chunks of at most ACT_CHUNK_BYTES (a multiple of the kernels'
    // groups of four), each passed over by every weight row while it stays in L2, rather than
    // all of them streamed from L3 once per weight row (a 512-token prompt through an
    // 8960-column ffn_down: 5 MB of activations per 7 KB row). A token's dot does not depend
    // on the grouping, so the bits are the same.
    let act_bytes = acts.first().map_or(1, |a| a.len().max(1));
    let chunk = (ACT_CHUNK_BYTES / act_bytes / 4 * 4).clamp(4, 64);
    let mut dots = [0f32; 64];
    for c0 in (0..acts.len()).step_by(chunk) {
        let part = &acts[c0..(c0 + chunk).min(acts.len())];
        for (r, row) in w_rows.iter().enumerate() {
            vec_dot_multi_with(backend, w, n, row, part, &mut dots[..part.len()])?;
            for (c, &d) in dots[..part.len()].iter().enumerate() {
                let mut v = [0f32; RUN];
                v[0] = d;
                put(c0 + c, r, &v, 1);
            }
        }
    }
    Ok(())
}

/// Bytes of activation rows the portable prefill path passes every weight row over at a time:
/// with the rows of a call (about 1 MB at most, `matmul_rows_tiled`) they stay in a 2 MB L2.
const ACT_CHUNK_BYTES: usize = 256 * 1024;

/// From this many activation rows on, llama.cpp runs Q6_K (and the other non-repacked K-quants)
/// through its tiled matmul, whose f32 order [`vec_dot_rows`] then follows; below, its `vec_dot`.
pub const BATCHED_MIN_TOKENS: usize = 8;

/// Weight rows per prefill panel (two quads; a quad x 4 tokens is AVX-512's 16 accumulators,
/// x 2 AVX2's 8).
pub const PANEL_ROWS: usize = 8;

/// The most consecutive rows one [`vec_dot_rows_each`] hand-over carries (the values array).
pub const RUN: usize = PANEL_ROWS;

/// The first `MR` of `w_rows` (rows `r0..` of the call) against all of `acts` (lengths
/// checked, AVX-512 available).
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn tile_rows<const MR: usize, const NR: usize>(
    w: GgmlType,
    nb: usize,
    w_rows: &[&[u8]],
    r0: usize,
    acts: &[&[u8]],
    put: &mut impl FnMut(usize, usize, &[f32; RUN], usize),
) -> usize {
    let t = acts.len();
    let x: [*const u8; MR] = std::array::from_fn(|r| w_rows[r].as_ptr());
    let mut c = 0;
    while c < t {
        // SAFETY: AVX-512 VNNI is available (checked by the caller) and every row holds
        // exactly `nb` blocks of its type.
        c += unsafe {
            match t - c {
                k if k >= NR => tile_cols::<MR, NR>(w, nb, x, acts, c, r0, put),
                k if k >= 2 && NR > 2 => tile_cols::<MR, 2>(w, nb, x, acts, c, r0, put),
                _ => tile_cols::<MR, 1>(w, nb, x, acts, c, r0, put),
            }
        };
    }
    MR
}

/// Activation rows `c..c + NR` of a [`tile_rows`] call.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
unsafe fn tile_cols<const MR: usize, const NR: usize>(
    w: GgmlType,
    nb: usize,
    x: [*const u8; MR],
    acts: &[&[u8]],
    c: usize,
    r0: usize,
    put: &mut impl FnMut(usize, usize, &[f32; RUN], usize),
) -> usize {
    let t = acts.len();
    let y: [*const u8; NR] = std::array::from_fn(|j| acts[c + j].as_ptr());
    let v = avx512::tile::<MR, NR>(w, nb, x, y, t >= BATCHED_MIN_TOKENS);
    for (j, token) in (c..c + NR).enumerate() {
        let vals: [f32; RUN] = std::array::from_fn(|r| if r < MR { v[r][j] } else { 0.0 });
        put(token, r0, &vals, MR);
    }
    NR
}

/// [`vec_dot_multi`] on a chosen backend (tests and benches compare backends with this).
/// A backend this CPU lacks is an error, never an illegal instruction.
pub fn vec_dot_multi_with(
    backend: Backend,
    w: GgmlType,
    n: usize,
    w_row: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    if !has_vec_dot(w) {
        return Err(QuantError::Unsupported {
            ty: w,
            op: "vec_dot",
        });
    }
    if !backend.is_available() {
        return Err(QuantError::BackendUnavailable(backend));
    }
    if out.len() != acts.len() {
        return Err(QuantError::Len {
            what: "vec_dot_multi out",
            expected: acts.len(),
            got: out.len(),
        });
    }
    check_row(w, n, w_row.len())?;
    for a in acts {
        check_row(vec_dot_type(w), n, a.len())?;
    }
    let nb = n / w.block_len() as usize;
    let mut i = 0;
    // Groups of 8 where 32 vector registers hold their accumulators, else of 4; then 4, 2, 1.
    let wide = backend == Backend::Avx512Vnni;
    while i < acts.len() {
        i += match acts.len() - i {
            1 => group::<1>(backend, w, n, nb, w_row, &acts[i..], &mut out[i..]),
            2 | 3 => group::<2>(backend, w, n, nb, w_row, &acts[i..], &mut out[i..]),
            r if r < 8 || !wide => group::<4>(backend, w, n, nb, w_row, &acts[i..], &mut out[i..]),
            _ => group::<8>(backend, w, n, nb, w_row, &acts[i..], &mut out[i..]),
        };
    }
    Ok(())
}

/// Matrix-vector product for decode: `out[r] = w_rows[r] . act` for `out.len()` contiguous
/// weight rows of `n` elements, with the lengths checked and the backend chosen once for the
/// whole range (per-row dispatch costs ~8% of decode on small rows).
pub fn matvec(
    w: GgmlType,
    n: usize,
    w_rows: &[u8],
    act: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let backend = Backend::detect();
    if !has_vec_dot(w) {
        return Err(QuantError::Unsupported {
            ty: w,
            op: "vec_dot",
        });
    }
    let row_bytes = crate::blocks::row_bytes(w, n)?;
    if w_rows.len() != row_bytes * out.len() {
        return Err(QuantError::Len {
            what: "matvec weight rows",
            expected: row_bytes * out.len(),
            got: w_rows.len(),
        });
    }
    check_row(vec_dot_type(w), n, act.len())?;
    let nb = n / w.block_len() as usize;
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend == Backend::Avx512Vnni && q32::has_panel(backend, w) {
        thread_local! {
            static PRE: std::cell::RefCell<avx512::PreAct> = std::cell::RefCell::new(avx512::PreAct::new());
        }
        PRE.with_borrow_mut(|pre| {
            // SAFETY: AVX-512 VNNI is available; the rows and the activation were length-checked.
            unsafe {
                avx512::preact_fill(w, nb, act.as_ptr(), pre);
                avx512::matvec_pre(w, nb, w_rows.as_ptr(), row_bytes, pre, out);
            }
        });
        return Ok(());
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend == Backend::Avx512Vnni && matches!(w, GgmlType::Q4_K | GgmlType::Q6_K) {
        // SAFETY: AVX-512 VNNI is available; the rows and the activation were length-checked.
        unsafe { avx512::matvec_k(w, nb, w_rows.as_ptr(), row_bytes, act.as_ptr(), out) };
        return Ok(());
    }
    let acts = [act];
    let ahead = crate::cpu::weight_prefetch_ahead();
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend == Backend::Avx2 && q32::has_panel(backend, w) {
        // SAFETY: AVX2 is available (detected); the rows and the activation were length-checked.
        unsafe { q32::row_quads(w, nb, w_rows, row_bytes, &acts, out) };
        return Ok(());
    }
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w_rows[r * row_bytes..(r + 1) * row_bytes];
        // The row `ahead` bytes on is on its way to L2 while this one is dotted.
        #[cfg(target_arch = "x86_64")]
        crate::cpu::prefetch_ahead(row.as_ptr(), ahead, row_bytes);
        group::<1>(backend, w, n, nb, row, &acts, std::slice::from_mut(o));
    }
    Ok(())
}

/// Most activation rows [`matmul_few`] takes through its prepared-activation kernel.
pub const FEW_MAX_TOKENS: usize = 8;

/// Whether a matmul of `t` tokens over `w` should go through [`matmul_few`] (batched decode)
/// rather than the tiled [`vec_dot_rows`] (prefill).
pub fn prefers_few(w: GgmlType, t: usize) -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if Backend::detect() == Backend::Avx512Vnni && q32::has_panel(Backend::Avx512Vnni, w) {
        return t <= FEW_MAX_TOKENS;
    }
    let _ = w;
    t < BATCHED_MIN_TOKENS
}

/// A batched decode step's matmul slice: `out[r * T + c] = w_rows[r] . acts[c]` for the
/// contiguous rows in `w_rows` and a few activation rows. On AVX-512 the 32-element block
/// types prepare each activation row once for all weight rows, on AVX2 they go four rows at a
/// time ([`q32::row_quads`]); the other types run [`vec_dot_multi`] per row. The results
/// equal [`vec_dot_multi`]'s bit for bit.
pub fn matmul_few(
    w: GgmlType,
    n: usize,
    w_rows: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let backend = Backend::detect();
    let t = acts.len();
    let row_bytes = crate::blocks::row_bytes(w, n)?;
    let rows = w_rows.len() / row_bytes.max(1);
    if w_rows.len() != rows * row_bytes || out.len() != rows * t {
        return Err(QuantError::Len {
            what: "matmul_few weight rows / output",
            expected: rows * t,
            got: out.len(),
        });
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend == Backend::Avx512Vnni
        && q32::has_panel(backend, w)
        && (1..=FEW_MAX_TOKENS).contains(&t)
    {
        for a in acts {
            check_row(vec_dot_type(w), n, a.len())?;
        }
        let nb = n / w.block_len() as usize;
        thread_local! {
            static PRES: std::cell::RefCell<Vec<avx512::PreAct>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        PRES.with_borrow_mut(|pres| {
            while pres.len() < t {
                pres.push(avx512::PreAct::new());
            }
            let x = w_rows.as_ptr();
            // SAFETY: AVX-512 VNNI is available; rows and activations were length-checked.
            unsafe {
                for (p, a) in pres.iter_mut().zip(acts) {
                    avx512::preact_fill(w, nb, a.as_ptr(), p);
                }
                match t {
                    1 => avx512::multi_pre::<1>(w, nb, x, row_bytes, rows, pres, out),
                    2 => avx512::multi_pre::<2>(w, nb, x, row_bytes, rows, pres, out),
                    3 => avx512::multi_pre::<3>(w, nb, x, row_bytes, rows, pres, out),
                    4 => avx512::multi_pre::<4>(w, nb, x, row_bytes, rows, pres, out),
                    5 => avx512::multi_pre::<5>(w, nb, x, row_bytes, rows, pres, out),
                    6 => avx512::multi_pre::<6>(w, nb, x, row_bytes, rows, pres, out),
                    7 => avx512::multi_pre::<7>(w, nb, x, row_bytes, rows, pres, out),
                    _ => avx512::multi_pre::<8>(w, nb, x, row_bytes, rows, pres, out),
                }
            }
        });
        return Ok(());
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if backend == Backend::Avx2 && q32::has_panel(backend, w) {
        for a in acts {
            check_row(vec_dot_type(w), n, a.len())?;
        }
        let nb = n / w.block_len() as usize;
        // SAFETY: AVX2 is available (detected); rows and activations were length-checked.
        unsafe { q32::row_quads(w, nb, w_rows, row_bytes, acts, out) };
        return Ok(());
    }
    for r in 0..rows {
        let row = &w_rows[r * row_bytes..(r + 1) * row_bytes];
        vec_dot_multi_with(backend, w, n, row, acts, &mut out[r * t..(r + 1) * t])?;
    }
    Ok(())
}

/// Dot the first `N` of `acts` (lengths checked) and return `N`.
#[inline]
fn group<const N: usize>(
    backend: Backend,
    w: GgmlType,
    n: usize,
    nb: usize,
    x: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) -> usize {
    let simd: Option<[f32; N]> = match backend {
        Backend::Generic => None,
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        Backend::Avx2 | Backend::Avx512Vnni => {
            let y: [*const u8; N] = std::array::from_fn(|c| acts[c].as_ptr());
            // SAFETY: the backend is available on this CPU (checked by the caller), and every
            // row was checked to hold exactly `nb` blocks of its type.
            unsafe {
                if backend == Backend::Avx512Vnni {
                    avx512::dot512::<N>(w, nb, x.as_ptr(), y)
                } else {
                    avx2::dot::<N>(w, nb, x.as_ptr(), y)
                }
            }
        }
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        _ => None,
    };
    match simd {
        Some(v) => out[..N].copy_from_slice(&v),
        None => {
            for c in 0..N {
                out[c] = generic::vec_dot(w, n, x, acts[c]);
            }
        }
    }
    N
}
