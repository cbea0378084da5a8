//! Layer helpers shared by every recipe: norms, RoPE, activations, and the matmul front door.
//! Activations are row-major `[T, width]` f32 buffers, one row per token.

use crate::pool::{SharedMut, ThreadPool};
use crate::weights::Weight;
use crate::ModelError;
use kestrel_gguf::GgmlType;

/// Which kernels compute the matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// The oracle: every weight row decoded to f32, dotted with f32 activations in plain
    /// sequential order. Slow and obviously right; every faster kernel is checked against it.
    Reference,
    /// As llama.cpp's CPU backend: activations quantized once per matmul to the weight type's
    /// 8-bit partner block, integer dot products with SIMD kernels.
    Quantized,
}

/// RMSNorm of each row of `x` (rows of `w.len()`), in place: x * w / sqrt(mean(x²) + eps).
/// As ggml: the squares (rounded to f32) are summed in f64, the mean rounded back to f32.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let sum: f64 = row.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / w.len() as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `out = rms_norm(x)` without touching `x`.
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm(out, w, eps);
}

/// Adds `bias` (length = row width) to every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `gate = silu(gate) * up`, elementwise over rows of `width` (the SwiGLU of the MLP), rows
/// spread over the pool; each row as ggml computes it ([`crate::vexp::swiglu_row`]).
pub fn swiglu(pool: &ThreadPool, gate: &mut [f32], up: &[f32], width: usize) {
    let width = width.max(1);
    let rows = gate.len() / width;
    let rows_per_task = (16 * 1024 / width).max(1);
    let ptr = SharedMut::new(gate);
    pool.run(rows.div_ceil(rows_per_task), &|task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        for r in r0..r1 {
            // SAFETY: each row belongs to one task.
            let g = unsafe { ptr.slice(r * width, width) };
            crate::vexp::swiglu_row(g, &up[r * width..(r + 1) * width]);
        }
    });
}

/// `x += y`
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Rotary position embedding tables for one batch of positions.
pub struct Rope {
    /// [T, rope_dim / 2] cos and sin of position * theta_i.
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    n_pos: usize,
    neox: bool,
}

impl Rope {
    pub fn new(positions: &[usize], rope_dim: usize, base: f32, neox: bool) -> Self {
        let half = rope_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        // As ggml computes it: theta_i = pos * theta_scale^i by repeated f32 multiplication,
        // so positions far into the context rotate exactly as llama.cpp rotates them.
        let theta_scale = base.powf(-2.0 / rope_dim as f32);
        for &p in positions {
            let mut theta = p as f32;
            for _ in 0..half {
                cos.push(theta.cos());
                sin.push(theta.sin());
                theta *= theta_scale;
            }
        }
        Self {
            cos,
            sin,
            half,
            n_pos: positions.len(),
            neox,
        }
    }

    /// Rotates every head of every row of `x` (`[T, n_heads * head_dim]`) in place.
    pub fn apply(&self, x: &mut [f32], head_dim: usize) {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA.
            unsafe { self.apply_fma(x, head_dim) };
            return;
        }
        self.rotate(x, head_dim);
    }

    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[target_feature(enable = "fma")]
    unsafe fn apply_fma(&self, x: &mut [f32], head_dim: usize) {
        self.rotate(x, head_dim);
    }

    /// The rotation with ggml's roundings (its compiled `rotate_pairs` contracts one product of
    /// each output into a fused multiply-add): normal layout `x0' = fma(x0, c, -(x1 s))`,
    /// `x1' = fma(x1, c, x0 s)`; NeoX `x0' = fma(x0, c, -(x1 s))`, `x1' = fma(x0, s, x1 c)`.
    /// `mul_add` is exact everywhere (a hardware FMA where [`Self::apply_fma`] enables one).
    #[inline(always)]
    fn rotate(&self, x: &mut [f32], head_dim: usize) {
        let row_len = x.len() / self.n_pos.max(1);
        for (t, row) in x.chunks_exact_mut(row_len).enumerate() {
            let cos = &self.cos[t * self.half..(t + 1) * self.half];
            let sin = &self.sin[t * self.half..(t + 1) * self.half];
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..self.half {
                    let (c, s) = (cos[i], sin[i]);
                    if self.neox {
                        let (x0, x1) = (head[i], head[i + self.half]);
                        head[i] = x0.mul_add(c, -(x1 * s));
                        head[i + self.half] = x0.mul_add(s, x1 * c);
                    } else {
                        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = x0.mul_add(c, -(x1 * s));
                        head[2 * i + 1] = x0.mul_add(s, x1 * c);
                    }
                }
            }
        }
    }
}

/// Weight rows per pool task: enough tasks to balance, few enough to keep overhead low.
fn rows_per_task(rows: usize, n_threads: usize) -> usize {
    if n_threads <= 1 {
        return rows;
    }
    (rows / (n_threads * 8)).clamp(16, 1024)
}

/// `out[t, r] = dot(w[r, :], x[t, :])` for `x: [T, w.cols]`, `out: [T, w.rows]`.
pub fn matmul(
    pool: &ThreadPool,
    path: MatmulPath,
    w: &Weight,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let (rows, cols) = (w.rows, w.cols);
    let t_len = x.len() / cols;
    debug_assert_eq!(x.len(), t_len * cols);
    debug_assert_eq!(out.len(), t_len * rows);
    let chunk = rows_per_task(rows, pool.n_threads());
    let n_tasks = rows.div_ceil(chunk);
    let out_ptr = SharedMut::new(out);
    let failed = std::sync::atomic::AtomicBool::new(false);
    match path {
        MatmulPath::Reference => {
            pool.run(n_tasks, &|task| {
                let mut wrow = vec![0f32; cols];
                for r in task * chunk..((task + 1) * chunk).min(rows) {
                    if w.row_f32(r, &mut wrow).is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                    for t in 0..t_len {
                        let xr = &x[t * cols..(t + 1) * cols];
                        let mut acc = 0f32;
                        for (a, b) in wrow.iter().zip(xr) {
                            acc += a * b;
                        }
                        // SAFETY: (t, r) is written by the task that owns row r only.
                        unsafe { out_ptr.slice(t * rows + r, 1)[0] = acc };
                    }
                }
            });
        }
        MatmulPath::Quantized if w.packed().is_some() => {
            return matmul_repacked(pool, w, x, out);
        }
        MatmulPath::Quantized => {
            let act_ty = kestrel_quant::vec_dot_type(w.ty);
            let act_row = act_ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            let mut acts = vec![0u8; t_len * act_row];
            quantize_activations(pool, act_ty, x, cols, &mut acts, act_row)?;
            let act_rows: Vec<&[u8]> = acts.chunks_exact(act_row.max(1)).collect();
            // Groups of 4 weight rows x all activation rows: the tiled kernel reuses each
            // decoded weight block across tokens and each activation block across rows.
            pool.run(n_tasks, &|task| {
                let rows_here = task * chunk..((task + 1) * chunk).min(rows);
                let ok = if t_len == 1 {
                    // Decode: the range streams through the single-row kernels in one call.
                    let span = rows_here.start * w.row_bytes()..rows_here.end * w.row_bytes();
                    // SAFETY: rows `rows_here` belong to this task only.
                    let dst = unsafe { out_ptr.slice(rows_here.start, rows_here.len()) };
                    kestrel_quant::matvec(w.ty, cols, &w.bytes()[span], act_rows[0], dst).is_ok()
                } else if kestrel_quant::dot::prefers_few(w.ty, t_len) {
                    // A few tokens (decode of a few sequences): each weight row decoded once
                    // for all of them, each activation row prepared once for all weight rows.
                    let span = rows_here.start * w.row_bytes()..rows_here.end * w.row_bytes();
                    let mut dots = vec![0f32; rows_here.len() * t_len];
                    let ok = kestrel_quant::matmul_few(
                        w.ty,
                        cols,
                        &w.bytes()[span],
                        &act_rows,
                        &mut dots,
                    )
                    .is_ok();
                    for (i, r) in rows_here.clone().enumerate() {
                        for t in 0..t_len {
                            // SAFETY: (t, r) is written by the task that owns row r only.
                            unsafe { out_ptr.slice(t * rows + r, 1)[0] = dots[i * t_len + t] };
                        }
                    }
                    ok
                } else {
                    matmul_rows_tiled(w, cols, rows_here, &act_rows, rows, out_ptr)
                };
                if !ok {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    }
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ModelError::BadType {
            name: w.name.clone(),
            ty: w.ty.to_string(),
        });
    }
    Ok(())
}

/// A repacked matmul: activations quantized once, then groups of 16 weight rows against every
/// token, spread over the pool, in llama.cpp's order for the type and token count (see
/// `kestrel_quant::repack`).
fn matmul_repacked(
    pool: &ThreadPool,
    w: &Weight,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    repacked_jobs(pool, &mut [MatJob { w, x, out }])
}

/// Several matrices over the same input (q/k/v, gate/up): whether [`matmul_fused`] runs them
/// as one pool job.
fn fusable(path: MatmulPath, ws: &[&Weight]) -> bool {
    let act = |w: &Weight| w.packed().map(|p| p.act_type());
    path == MatmulPath::Quantized
        && ws
            .iter()
            .all(|w| act(w).is_some() && act(w) == act(ws[0]) && w.cols == ws[0].cols)
}

/// `outs[i] = x . ws[i]^T` for matrices sharing the input `x: [T, cols]`. Repacked matrices with
/// one activation type go through one pool job (the activations quantized once, one barrier
/// instead of one per matrix); others are run one by one. Same results either way.
pub fn matmul_fused(
    pool: &ThreadPool,
    path: MatmulPath,
    ws: &[&Weight],
    x: &[f32],
    outs: &mut [&mut [f32]],
) -> Result<(), ModelError> {
    if ws.len() > 1 && fusable(path, ws) {
        return matmul_repacked_fused(pool, ws, x, outs);
    }
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        matmul(pool, path, w, x, out)?;
    }
    Ok(())
}

/// [`matmul_repacked`] over several matrices sharing `x` (all repacked, one activation type):
/// the tasks of every matrix in one job, in order, so the small ones (k, v) end it.
fn matmul_repacked_fused(
    pool: &ThreadPool,
    ws: &[&Weight],
    x: &[f32],
    outs: &mut [&mut [f32]],
) -> Result<(), ModelError> {
    let mut jobs: Vec<MatJob> = ws
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, out)| MatJob { w, x, out })
        .collect();
    repacked_jobs(pool, &mut jobs)
}

/// One matrix of a grouped matmul with its own input: `out = x . w^T`, `x: [T, w.cols]`,
/// `out: [T, w.rows]` (T may differ between the jobs of a group).
pub struct MatJob<'a> {
    pub w: &'a Weight,
    pub x: &'a [f32],
    pub out: &'a mut [f32],
}

/// Every job of a group, each with its own input (the experts of a mixture, each over the
/// tokens routed to it). Repacked matrices go through one pool job: each input quantized once
/// (jobs that pass the same slice share it), then the row groups of every matrix spread over
/// the pool, so k small experts cost one barrier, not k. Same results as [`matmul`] per job.
pub fn matmul_grouped(
    pool: &ThreadPool,
    path: MatmulPath,
    jobs: &mut [MatJob],
) -> Result<(), ModelError> {
    let all_packed = jobs.iter().all(|j| j.w.packed().is_some());
    if path != MatmulPath::Quantized || !all_packed {
        for j in jobs.iter_mut() {
            matmul(pool, path, j.w, j.x, j.out)?;
        }
        return Ok(());
    }
    repacked_jobs(pool, jobs)
}

/// Repacked matrices, each over its input, as one pool job: each distinct (input, activation
/// type) quantized once, each matrix's activations prepared (a K-quant matrix reusing the AMX
/// panel of an earlier one over the same rows), then the 16-row groups of all matrices in
/// shrinking tasks.
fn repacked_jobs(pool: &ThreadPool, jobs: &mut [MatJob]) -> Result<(), ModelError> {
    let bad = |w: &Weight| ModelError::BadType {
        name: w.name.clone(),
        ty: w.ty.to_string(),
    };
    // One quantized copy per (input, activation type): `keys[i]` = (input, type, first job).
    let mut keys: Vec<((*const f32, usize), GgmlType, usize)> = Vec::new();
    let mut key_of = Vec::with_capacity(jobs.len());
    for (ji, j) in jobs.iter().enumerate() {
        let act_ty = j.w.packed().ok_or_else(|| bad(j.w))?.act_type();
        let input = (j.x.as_ptr(), j.x.len());
        match keys.iter().position(|k| k.0 == input && k.1 == act_ty) {
            Some(at) => key_of.push(at),
            None => {
                key_of.push(keys.len());
                keys.push((input, act_ty, ji));
            }
        }
    }
    let act_row = |&(_, ty, ji): &(_, GgmlType, usize)| {
        ty.bytes_for(jobs[ji].w.cols as u64).unwrap_or(0) as usize
    };
    let mut acts: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
    for k in &keys {
        let j = &jobs[k.2];
        let mut a = vec![0u8; (j.x.len() / j.w.cols.max(1)) * act_row(k)];
        quantize_activations(pool, k.1, j.x, j.w.cols, &mut a, act_row(k))?;
        acts.push(a);
    }
    let act_rows: Vec<Vec<&[u8]>> = keys
        .iter()
        .zip(&acts)
        .map(|(k, a)| a.chunks_exact(act_row(k).max(1)).collect())
        .collect();
    let mut prepared = Vec::with_capacity(jobs.len());
    for (j, &ki) in jobs.iter().zip(&key_of) {
        let packed = j.w.packed().ok_or_else(|| bad(j.w))?;
        let p = packed.prepare_after(&act_rows[ki], &prepared)?;
        prepared.push(p);
    }
    let r = kestrel_quant::repack::R;
    let groups: Vec<usize> = jobs.iter().map(|j| j.w.rows / r).collect();
    let tasks = shrinking_tasks(&groups, pool.n_threads());
    let t_lens: Vec<usize> = jobs.iter().map(|j| j.x.len() / j.w.cols.max(1)).collect();
    let ws: Vec<&Weight> = jobs.iter().map(|j| j.w).collect();
    let out_ptrs: Vec<SharedMut<f32>> = jobs.iter_mut().map(|j| SharedMut::new(j.out)).collect();
    let failed = std::sync::atomic::AtomicUsize::new(usize::MAX);
    pool.run(tasks.len(), &|task| {
        let GroupRange { matrix: i, lo, hi } = tasks[task];
        let (rows, t_len) = (ws[i].rows, t_lens[i]);
        let Some(packed) = ws[i].packed() else {
            failed.store(i, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let mut tmp = vec![0f32; t_len * r];
        for g in lo..hi {
            if packed.dot_group(g, &prepared[i], &mut tmp).is_err() {
                failed.store(i, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            for t in 0..t_len {
                // SAFETY: rows 16g..16g+16 of every token of matrix i belong to this task only.
                let dst = unsafe { out_ptrs[i].slice(t * rows + g * r, r) };
                dst.copy_from_slice(&tmp[t * r..(t + 1) * r]);
            }
        }
    });
    match failed.load(std::sync::atomic::Ordering::Relaxed) {
        usize::MAX => Ok(()),
        i => Err(bad(ws[i])),
    }
}

/// Row groups `lo..hi` of one matrix of a fused job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GroupRange {
    matrix: usize,
    lo: usize,
    hi: usize,
}

/// Splits a job's row groups (`groups[i]` for matrix i, walked in order) into tasks that
/// shrink towards the end: each takes `1 / n_threads` of what is left (at least one group),
/// so the first tasks are long sequential streams and the last are a group or two.
/// Equal tasks left one thread idle for up to a whole task (~6% of a decode token in waits);
/// small equal tasks cost every stream its prefetch ramp. With `1 / (2 n_threads)` (twice the
/// tasks) the small matrices ran slower: on the AMD VM the 0.5B's q/k/v and attn_output
/// took 28.6 / 40.0 µs a call against 20.5–21.4 / 29.4–31.4 µs, and its decode was 74–85
/// tok/s against 85–94, four alternations (BENCHMARKS.md, tenth session).
fn shrinking_tasks(groups: &[usize], n_threads: usize) -> Vec<GroupRange> {
    let total: usize = groups.iter().sum();
    let mut tasks = Vec::new();
    let (mut matrix, mut lo, mut done) = (0, 0, 0);
    while done < total {
        let mut take = ((total - done) / n_threads.max(1)).max(1);
        done += take;
        while take > 0 {
            while lo == groups[matrix] {
                matrix += 1;
                lo = 0;
            }
            let hi = (lo + take).min(groups[matrix]);
            tasks.push(GroupRange { matrix, lo, hi });
            take -= hi - lo;
            lo = hi;
        }
    }
    tasks
}

/// Quantizes every activation row (`x: [T, cols]`) once, rows spread over the pool.
fn quantize_activations(
    pool: &ThreadPool,
    ty: GgmlType,
    x: &[f32],
    cols: usize,
    out: &mut [u8],
    act_row: usize,
) -> Result<(), ModelError> {
    let t_len = x.len() / cols;
    if t_len == 1 {
        kestrel_quant::quantize_activation_row(ty, x, out)?;
        return Ok(());
    }
    let per_task = t_len.div_ceil(pool.n_threads() * 4).max(1);
    let out_ptr = SharedMut::new(out);
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool.run(t_len.div_ceil(per_task), &|task| {
        for t in task * per_task..((task + 1) * per_task).min(t_len) {
            // SAFETY: row t belongs to this task only.
            let dst = unsafe { out_ptr.slice(t * act_row, act_row) };
            if kestrel_quant::quantize_activation_row(ty, &x[t * cols..(t + 1) * cols], dst)
                .is_err()
            {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ModelError::BadType {
            name: "activations".into(),
            ty: ty.to_string(),
        });
    }
    Ok(())
}

/// Floats of the task-local result block of [`matmul_rows_tiled`] (256 KiB): small enough to
/// stay in L2, and a fixed bound on its scratch whatever the batch.
const TILED_BLOCK_FLOATS: usize = 64 * 1024;

/// Prefill: this task's weight rows x all activation rows through the tiled kernels, which
/// reuse each decoded weight block across tokens and each activation block across rows. The
/// kernels' short runs (8 or 4 rows of a token) go to a task-local `[T, rows + RUN]` block, each
/// as one fixed-size copy (the slack takes a short run's tail); each token's results are then
/// copied to `out` (`[T, rows]`) whole. Rows go through in sub-ranges sized so the block stays
/// within [`TILED_BLOCK_FLOATS`].
fn matmul_rows_tiled(
    w: &Weight,
    cols: usize,
    rows_here: std::ops::Range<usize>,
    act_rows: &[&[u8]],
    rows: usize,
    out_ptr: SharedMut<f32>,
) -> bool {
    use kestrel_quant::dot::{PANEL_ROWS, RUN};
    thread_local! {
        static BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let t_len = act_rows.len();
    let per_call = ((TILED_BLOCK_FLOATS / t_len.max(1)).saturating_sub(RUN) / PANEL_ROWS
        * PANEL_ROWS)
        .max(PANEL_ROWS);
    BLOCK.with_borrow_mut(|block| {
        let mut r0 = rows_here.start;
        while r0 < rows_here.end {
            let r1 = (r0 + per_call).min(rows_here.end);
            let w_rows: Vec<&[u8]> = (r0..r1).map(|r| w.row(r)).collect();
            let n = r1 - r0;
            let stride = n + RUN;
            block.resize(stride * t_len, 0.0);
            let ok =
                kestrel_quant::vec_dot_rows_each(w.ty, cols, &w_rows, act_rows, |t, r, v, _| {
                    block[t * stride + r..][..RUN].copy_from_slice(v);
                })
                .is_ok();
            if !ok {
                return false;
            }
            for t in 0..t_len {
                // SAFETY: (t, r0..r1) is written by the task that owns rows_here only.
                let dst = unsafe { out_ptr.slice(t * rows + r0, n) };
                dst.copy_from_slice(&block[t * stride..][..n]);
            }
            r0 = r1;
        }
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every group of every matrix exactly once, in order, no task across two matrices.
    fn assert_covers(groups: &[usize], tasks: &[GroupRange]) {
        let mut expect = (0..groups.len()).flat_map(|m| (0..groups[m]).map(move |g| (m, g)));
        for t in tasks {
            assert!(t.lo < t.hi && t.hi <= groups[t.matrix], "{t:?}");
            for g in t.lo..t.hi {
                assert_eq!(expect.next(), Some((t.matrix, g)), "{t:?}");
            }
        }
        assert_eq!(expect.next(), None);
    }

    #[test]
    fn shrinking_tasks_cover_every_group_once() {
        for groups in [
            &[560][..],
            &[96, 8, 8],
            &[1],
            &[3, 0, 5],
            &[0],
            &[7, 1, 1, 200],
        ] {
            for threads in 1..=4 {
                assert_covers(groups, &shrinking_tasks(groups, threads));
            }
        }
    }

    #[test]
    fn shrinking_tasks_start_long_and_end_with_single_groups() {
        let tasks = shrinking_tasks(&[560], 2);
        let sizes: Vec<usize> = tasks.iter().map(|t| t.hi - t.lo).collect();
        assert_eq!(sizes, [280, 140, 70, 35, 17, 9, 4, 2, 1, 1, 1]);
        // One thread: one stream.
        assert_eq!(shrinking_tasks(&[560], 1).len(), 1);
        // Few claims per job: each costs a cross-core atomic.
        assert!(tasks.len() < 40, "{}", tasks.len());
    }
}
