//! The mat-vec cases: every type, token count, epilogue and warps per row; the fused q/k/v
//! launch; and the mat-vec speed lines.

use super::{bytes_i32, cfg, quantize_rows, random_matrix, rel_err, CaseResult, MvLaunch, Rng};
use crate::device::Gpu;
use crate::error::CudaError;
use crate::error::Result;
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

/// The mat-vec kernels: every type, token count and epilogue, against f64 dot products of the
/// dequantized weights. 8-bit activations cost about 0.5% (one step of 127 per block):
/// tolerance 1e-2 there, 1e-4 for f32 activations.
pub fn check_matvec(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    // the second shape's row count is no multiple of 4: the row groups' last warp is partial
    // the third: an odd number of K-quant blocks a row (9), 509 rows
    for (rows, cols) in [(1536, 4096), (1533, 1024), (509, 2304)] {
        for kind in Kind::QUANTIZED.into_iter().chain([Kind::F16, Kind::F32]) {
            let (file, w) = random_matrix(kind, rows, cols, rng)?;
            let (file2, w2) = random_matrix(kind, rows, cols, rng)?;
            let dw = gpu.upload(&to_device_layout(kind, &file))?;
            let dw2 = gpu.upload(&to_device_layout(kind, &file2))?;
            for nt in [1usize, 2, 4, 8] {
                let x = rng.vec(nt * cols, 1.0);
                let dx = gpu.upload_f32(&x)?;
                let dq = gpu.alloc(nt * cols)?;
                let dd = gpu.alloc(nt * cols / 32 * 8)?;
                quantize_rows(gpu, dx.ptr, dq.ptr, dd.ptr, nt, cols)?;
                // f64 dots, once per token count
                let mut g1 = vec![0f64; nt * rows];
                let mut g2 = vec![0f64; nt * rows];
                for t in 0..nt {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let dot = |m: &[f32]| -> f64 {
                            m[r * cols..(r + 1) * cols]
                                .iter()
                                .zip(xt)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum()
                        };
                        g1[t * rows + r] = dot(&w);
                        g2[t * rows + r] = dot(&w2);
                    }
                }
                let wprs: &[usize] = if kind.int8_activations() {
                    &[1, 2, 4]
                } else {
                    &[1, 4]
                };
                for epi in 0..3 {
                    // (kernel, grid, label): warps per row; one token also in row groups
                    let mut kernels: Vec<(String, u32, String)> = wprs
                        .iter()
                        .map(|&wpr| {
                            (
                                format!("mv_{}_{nt}_{epi}_{wpr}", kind.name()),
                                rows.div_ceil(4 / wpr) as u32,
                                format!("warps/row {wpr}"),
                            )
                        })
                        .collect();
                    if nt == 1 && kind.int8_activations() {
                        for r in [1usize, 2, 4] {
                            kernels.push((
                                format!("mv_{}_1_{epi}_r{r}", kind.name()),
                                rows.div_ceil(4 * r) as u32,
                                format!("rows/warp {r}"),
                            ));
                        }
                        for r in [1usize, 2] {
                            kernels.push((
                                format!("mv_{}_1_{epi}_h{r}", kind.name()),
                                rows.div_ceil(8 * r) as u32,
                                format!("rows/half-warp {r}"),
                            ));
                        }
                    }
                    for (name, grid, label) in &kernels {
                        let base = rng.vec(nt * rows, 1.0);
                        let dout = gpu.upload_f32(&base)?;
                        let f = gpu.func(name)?;
                        let mv = MvLaunch {
                            w: dw.ptr,
                            w2: dw2.ptr,
                            rows,
                            cols,
                            q: (dq.ptr, dd.ptr),
                            xf: dx.ptr,
                            out: dout.ptr,
                        };
                        // SAFETY: as above.
                        unsafe { mv.run(gpu, &f, *grid)? };
                        let got = gpu.read_f32(dout.ptr, nt * rows)?;
                        let want: Vec<f32> = (0..nt * rows)
                            .map(|i| {
                                let g = g1[i];
                                (match epi {
                                    0 => g,
                                    1 => base[i] as f64 + g,
                                    _ => g / (1.0 + (-g).exp()) * g2[i],
                                }) as f32
                            })
                            .collect();
                        let tol = if kind.int8_activations() { 1e-2 } else { 1e-4 };
                        out.push(CaseResult {
                            op: format!(
                                "matvec {} [{rows}x{cols}] tokens {nt} epilogue {} {label}",
                                kind.name(),
                                ["store", "add", "swiglu"][epi]
                            ),
                            err: rel_err(&got, &want),
                            tol,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// The fused mat-vec: up to four matrices of different types in one launch (attention's
/// q/k/v; a DeltaNet layer's qkv, z, alpha and beta, the last two of a few rows).
pub fn check_mvx(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let cols = 1536;
    for (kinds, rows, nt) in [
        (
            vec![Kind::Q4K, Kind::Q4K, Kind::Q6K],
            vec![512usize, 128, 128],
            1usize,
        ),
        (
            vec![Kind::Q8_0, Kind::Q5_0, Kind::Q4_0],
            vec![512, 128, 128],
            4,
        ),
        (
            vec![Kind::F32, Kind::F16, Kind::F32],
            vec![512, 128, 128],
            2,
        ),
        (
            vec![Kind::Q4K, Kind::Q4K, Kind::Q4K, Kind::Q6K],
            vec![384, 256, 16, 16],
            1,
        ),
        (
            vec![Kind::Q6K, Kind::Q4K, Kind::Q8_0, Kind::Q8_0],
            vec![384, 256, 16, 16],
            8,
        ),
        (
            vec![Kind::Q5K, Kind::Q5_1, Kind::Q4_1, Kind::Q5K],
            vec![384, 256, 16, 16],
            1,
        ),
        (
            vec![Kind::Q5K, Kind::Q6K, Kind::Q5_1],
            vec![512, 128, 128],
            2,
        ),
    ] {
        let n_mats = kinds.len();
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..n_mats)
            .map(|i| random_matrix(kinds[i], rows[i], cols, rng))
            .collect::<Result<_>>()?;
        let devs: Vec<_> = (0..n_mats)
            .map(|i| gpu.upload(&to_device_layout(kinds[i], &mats[i].0)))
            .collect::<Result<_>>()?;
        let x = rng.vec(nt * cols, 1.0);
        let dx = gpu.upload_f32(&x)?;
        let (dq, dd) = (gpu.alloc(nt * cols)?, gpu.alloc(nt * cols / 32 * 8)?);
        let n = cols as i32;
        let quantized = kinds.iter().all(|k| k.int8_activations());
        // every kernel with all types' branches; those without them where no kind needs one
        let suffixes: &[&str] = if kinds.iter().any(|k| k.fused_all_only()) {
            &["_all"]
        } else {
            &["", "_all"]
        };
        let mut kernels = Vec::new();
        for suf in suffixes {
            kernels.push((format!("mvx_{}{suf}", nt.next_power_of_two()), 1usize));
            if nt == 1 && quantized {
                for r in [2usize, 4] {
                    if rows.iter().all(|n| n % r == 0) {
                        kernels.push((format!("mvx_1_r{r}{suf}"), r));
                        // half-warp rows: 2 (h1) or 4 (h2) rows per warp
                        kernels.push((format!("mvx_1_h{}{suf}", r / 2), r));
                    }
                }
            }
        }
        for (name, rpw) in kernels {
            // outputs poisoned with NaN: a row the kernel leaves unwritten fails
            let outs: Vec<_> = (0..n_mats)
                .map(|i| gpu.upload_f32(&vec![f32::NAN; nt * rows[i]]))
                .collect::<Result<_>>()?;
            let f = gpu.func(&name)?;
            // absent matrices: no rows
            let (mut r, mut ty, mut wp, mut op) =
                (vec![0i32; 4], vec![0i32; 4], vec![0u64; 4], vec![0u64; 4]);
            for i in 0..n_mats {
                (r[i], ty[i], wp[i], op[i]) =
                    (rows[i] as i32, kinds[i] as i32, devs[i].ptr, outs[i].ptr);
            }
            let total = rows.iter().sum::<usize>();
            quantize_rows(gpu, dx.ptr, dq.ptr, dd.ptr, nt, cols)?;
            // SAFETY: as in check_matvec.
            unsafe {
                gpu.stream
                    .launch_builder(&f)
                    .arg(&wp[0])
                    .arg(&r[0])
                    .arg(&ty[0])
                    .arg(&op[0])
                    .arg(&wp[1])
                    .arg(&r[1])
                    .arg(&ty[1])
                    .arg(&op[1])
                    .arg(&wp[2])
                    .arg(&r[2])
                    .arg(&ty[2])
                    .arg(&op[2])
                    .arg(&wp[3])
                    .arg(&r[3])
                    .arg(&ty[3])
                    .arg(&op[3])
                    .arg(&n)
                    .arg(&dq.ptr)
                    .arg(&dd.ptr)
                    .arg(&dx.ptr)
                    .launch(cfg((total.div_ceil(4 * rpw) as u32, 1, 1), 128))?;
            }
            for i in 0..n_mats {
                let got = gpu.read_f32(outs[i].ptr, nt * rows[i])?;
                let w = &mats[i].1;
                let want: Vec<f32> = (0..nt * rows[i])
                    .map(|j| {
                        let (t, row) = (j / rows[i], j % rows[i]);
                        w[row * cols..(row + 1) * cols]
                            .iter()
                            .zip(&x[t * cols..(t + 1) * cols])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>() as f32
                    })
                    .collect();
                let tol = if kinds[i].int8_activations() {
                    1e-2
                } else {
                    1e-4
                };
                out.push(CaseResult {
                    op: format!(
                        "fused mat-vec ({name}), part {i} of {n_mats}: {} [{}x{cols}] tokens {nt}",
                        kinds[i].name(),
                        rows[i]
                    ),
                    err: rel_err(&got, &want),
                    tol,
                });
            }
        }
    }
    Ok(())
}

/// Mat-vec speed per type: GB/s of weights read, one token. Each line: (label, us per launch,
/// GB/s). The first line of a type is the kernel decode uses on the 8B's FFN shape (12288 x
/// 4096), timed as plain stream launches (as releases before the graphs measured it); for
/// the K-quants the 8B's other decode shapes follow, each with the kernel decode picks and
/// the other warps-per-row and rows-per-warp variants, timed as 100 launches replayed from
/// one CUDA graph (as decode runs: no launch gaps), so they compare among themselves; each
/// shape ends with the read floor (one kernel reading the same bytes and computing nothing)
/// and `read_rows_r1/r2` (the same bytes with the row kernels' grid and rows to a warp, no
/// arithmetic). A shape's lines are timed in [`PERF_ROUNDS`] rounds (each round every line
/// once) and each gives the median of its rounds. (Until the fifteenth session: one round of
/// 200 launches.)
pub fn perf_matvec(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64)>> {
    let mut res = Vec::new();
    for kind in Kind::QUANTIZED {
        let kquant = kind.k_quant();
        let shapes: &[(usize, usize)] = if kquant {
            // the 8B's four decode shapes, then two of a 1024-wide model (16 units per row):
            // the gate/up and the output's rows; then the down projections of the 1.5B and
            // the 0.8B shapes (few rows, long ones) and the 1.5B's o projection; then (Q6_K
            // only) the 8B's, the 9B's and the 1.5B's output projections
            &[
                (12288, 4096),
                (4096, 12288),
                (6144, 4096),
                (4096, 4096),
                (3584, 1024),
                (65536, 1024),
                (1536, 8960),
                (1024, 3584),
                // the 1.5B's o projection (24 units a row: one round of a warp's lanes)
                (1536, 1536),
                // the output projections of the 8B and the 9B (Q6_K in a Q4_K_M file), and the
                // 1.5B's (24 units a row: one a lane, a warp's rows one round trip)
                (151936, 4096),
                (248320, 4096),
                (151936, 1536),
            ]
        } else {
            &[(12288, 4096)]
        };
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            if rows > 100_000 && kind != Kind::Q6K {
                continue; // output projections are Q6_K
            }
            // random bytes (speed does not depend on the values); 8 copies rotate so the
            // 50 MB L2 never holds the weights
            let rb = kestrel_quant::row_bytes(kind.ggml(), cols)
                .map_err(|e| CudaError::Other(e.to_string()))?;
            let dev: Vec<u8> = (0..rows * rb).map(|_| rng.next_u64() as u8).collect();
            let copies: Vec<_> = (0..8).map(|_| gpu.upload(&dev)).collect::<Result<_>>()?;
            let dx = gpu.upload_f32(&rng.vec(cols, 1.0))?;
            let (dq, dd, dout) = (
                gpu.alloc(cols)?,
                gpu.alloc(cols / 32 * 8)?,
                gpu.alloc(rows * 4)?,
            );
            quantize_rows(gpu, dx.ptr, dq.ptr, dd.ptr, 1, cols)?;
            let mut variants = vec![crate::matmul::matvec_kernel(kind, rows, cols, 1, 0)];
            if kquant {
                for w in [1usize, 2, 4] {
                    variants.push((
                        format!("mv_{}_1_0_{w}", kind.name()),
                        rows.div_ceil(4 / w) as u32,
                    ));
                }
                for r in [1usize, 2, 4] {
                    variants.push((
                        format!("mv_{}_1_0_r{r}", kind.name()),
                        rows.div_ceil(4 * r) as u32,
                    ));
                }
                for r in [1usize, 2] {
                    variants.push((
                        format!("mv_{}_1_0_h{r}", kind.name()),
                        rows.div_ceil(8 * r) as u32,
                    ));
                }
            }
            // the fused SwiGLU on the gate/up shape (gate and up: two different copies; the
            // same matrix twice would read its second pass from L2)
            let swiglu_from = variants.len();
            if kquant && si == 0 {
                variants.push(crate::matmul::matvec_kernel(kind, rows, cols, 1, 2));
                for w in [1usize, 2, 4] {
                    variants.push((
                        format!("mv_{}_1_2_{w}", kind.name()),
                        rows.div_ceil(4 / w) as u32,
                    ));
                }
                for r in [1usize, 2] {
                    variants.push((
                        format!("mv_{}_1_2_r{r}", kind.name()),
                        rows.div_ceil(4 * r) as u32,
                    ));
                }
            }
            let time_variant = |gpu: &mut Gpu, vi: usize| -> Result<f64> {
                let (name, grid) = &variants[vi];
                let f = gpu.func(name)?;
                let launch = |gpu: &Gpu, i: usize| -> Result<()> {
                    // a SwiGLU launch reads a pair of copies no launch next to it reads
                    let (w, w2) = if vi >= swiglu_from {
                        (
                            copies[2 * i % copies.len()].ptr,
                            copies[(2 * i + 1) % copies.len()].ptr,
                        )
                    } else {
                        (copies[i % copies.len()].ptr, copies[i % copies.len()].ptr)
                    };
                    let mv = MvLaunch {
                        w,
                        w2,
                        rows,
                        cols,
                        q: (dq.ptr, dd.ptr),
                        xf: dx.ptr,
                        out: dout.ptr,
                    };
                    // SAFETY: as in check_matvec.
                    unsafe { mv.run(gpu, &f, *grid) }
                };
                let graph = !(si == 0 && vi == 0);
                super::time_us(gpu, 20, 100, graph, |g: &mut Gpu, i| launch(g, i))
            };
            // every variant, then the read floor and the row-order reads, timed once a round;
            // each line is the median of its rounds (a kernel timed early and late in one
            // call differed by 9%: rounds spread the drift over every line alike)
            let lines = variants.len() + 3;
            let mut times = vec![Vec::with_capacity(PERF_ROUNDS); lines];
            for _ in 0..PERF_ROUNDS {
                for (e, t) in times.iter_mut().enumerate() {
                    t.push(match e.checked_sub(variants.len()) {
                        None => time_variant(gpu, e)?,
                        Some(0) => read_floor_us(gpu, &copies, dev.len())?,
                        Some(k) => read_rows_us(gpu, &copies, rows, rb, k)?,
                    });
                }
            }
            for (e, mut t) in times.into_iter().enumerate() {
                t.sort_by(f64::total_cmp);
                let us = t[t.len() / 2];
                let (label, bytes) = match e.checked_sub(variants.len()) {
                    None => {
                        let name = &variants[e].0;
                        let label = match (si == 0 && e == 0, e) {
                            (true, _) => kind.name().to_string(),
                            (false, 0) => format!("{rows}x{cols} {name} (decode's, graph)"),
                            (false, v) if v == swiglu_from => {
                                format!("{rows}x{cols} {name} (decode's SwiGLU, 2 matrices, graph)")
                            }
                            _ => format!("{rows}x{cols} {name} (graph)"),
                        };
                        // a SwiGLU launch reads two matrices
                        (label, dev.len() * if e >= swiglu_from { 2 } else { 1 })
                    }
                    Some(0) => (
                        format!(
                            "{rows}x{cols} read floor: the same bytes, nothing computed (graph)"
                        ),
                        dev.len(),
                    ),
                    Some(k) => (
                        format!("{rows}x{cols} read_rows_r{k}: a row kernel's reads alone (graph)"),
                        rows * (rb / 16 * 16),
                    ),
                };
                res.push((label, us, bytes as f64 / us / 1e3));
            }
        }
    }
    Ok(res)
}

/// Rounds of `perf_matvec`'s timings: each line is the median of this many.
const PERF_ROUNDS: usize = 3;

/// Time (us) of a kernel that only reads `bytes` of each rotating copy (16-byte loads, 16
/// blocks of 128 threads per SM, 100 graph replays): what a mat-vec of that size could reach.
fn read_floor_us(gpu: &mut Gpu, copies: &[crate::device::DevBuf], bytes: usize) -> Result<f64> {
    let f = gpu.func("read_floor")?;
    let sink = gpu.alloc(4)?;
    let n16 = (bytes / 16) as u64;
    let launch = |gpu: &Gpu, i: usize| -> Result<()> {
        // SAFETY: each copy holds `bytes`; the kernel reads n16 16-byte words and may write
        // one int to `sink`.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&copies[i % copies.len()].ptr)
                .arg(&n16)
                .arg(&sink.ptr)
                .launch(cfg((132 * 16, 1, 1), 128))?;
        }
        Ok(())
    };
    super::time_us(gpu, 20, 100, true, |g: &mut Gpu, i| launch(g, i))
}

/// Time (us) of `read_rows_r{r}`: the row kernels' grid, each warp reading r rows of `rb`
/// bytes (rounded down to 16-byte words) one after the other, and computing nothing.
fn read_rows_us(
    gpu: &mut Gpu,
    copies: &[crate::device::DevBuf],
    rows: usize,
    rb: usize,
    r: usize,
) -> Result<f64> {
    let f = gpu.func(&format!("read_rows_r{r}"))?;
    let sink = gpu.alloc(4)?;
    let (n, row16) = (rows as i32, (rb / 16) as i32);
    let grid = rows.div_ceil(4 * r) as u32;
    let launch = |gpu: &Gpu, i: usize| -> Result<()> {
        // SAFETY: each copy holds rows x rb bytes; the kernel reads row16 16-byte words of each
        // row and may write one int to `sink`.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&copies[i % copies.len()].ptr)
                .arg(&n)
                .arg(&row16)
                .arg(&sink.ptr)
                .launch(cfg((grid, 1, 1), 128))?;
        }
        Ok(())
    };
    super::time_us(gpu, 20, 100, true, |g: &mut Gpu, i| launch(g, i))
}

/// The fused q/k/v mat-vec with its epilogue in the same warps (`mvx_1_rope`: bias, RoPE, K and
/// V into the f16 cache), and with the RMSNorm before it too (`mvx_1_norm_rope`), against f64
/// dots of the dequantized weights with the CPU's norm, bias and RoPE: q within 1e-2 (8-bit
/// activations), the cache rows within 1e-2 (and f16).
pub fn check_qkv_rope(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    // (NeoX, q heads, kv heads, head dim, columns, kinds of q / k / v); 544 columns: a last
    // part of the norm shorter than 128
    for (neox, nh, nkv, hd, cols, kinds) in [
        (
            true,
            12usize,
            2usize,
            128usize,
            1536usize,
            [Kind::Q4K, Kind::Q4K, Kind::Q6K],
        ),
        (false, 4, 2, 64, 544, [Kind::Q8_0, Kind::Q5_0, Kind::Q4_0]),
        (true, 6, 3, 32, 256, [Kind::Q5K, Kind::Q5_1, Kind::Q4_1]),
    ] {
        let rows = [nh * hd, nkv * hd, nkv * hd];
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..3)
            .map(|i| random_matrix(kinds[i], rows[i], cols, rng))
            .collect::<Result<_>>()?;
        let devs: Vec<_> = (0..3)
            .map(|i| gpu.upload(&to_device_layout(kinds[i], &mats[i].0)))
            .collect::<Result<_>>()?;
        let biases: Vec<Vec<f32>> = rows.iter().map(|&r| rng.vec(r, 0.5)).collect();
        let x = rng.vec(cols, 2.0);
        let nw = rng.vec(cols, 1.0);
        let eps = 1e-6f32;
        let mut xn = x.clone();
        kestrel_models::ops::rms_norm(&mut xn, &nw, eps);
        // the reference: f64 dots with the normalized row, then the CPU's bias and RoPE at
        // position 1234
        let position = 1234usize;
        let mut want: Vec<Vec<f32>> = (0..3)
            .map(|i| {
                let w = &mats[i].1;
                (0..rows[i])
                    .map(|r| {
                        let dot: f64 = w[r * cols..(r + 1) * cols]
                            .iter()
                            .zip(&xn)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        dot as f32 + biases[i][r]
                    })
                    .collect()
            })
            .collect();
        let base = 1e6f32;
        let rope = kestrel_models::ops::Rope::new(&[position], hd, base, neox);
        rope.apply(&mut want[0], hd);
        rope.apply(&mut want[1], hd);
        // the products' input: the raw row and norm weights, or the normalized row's 8-bit copy
        let (dx, dnw, dxn) = (
            gpu.upload_f32(&x)?,
            gpu.upload_f32(&nw)?,
            gpu.upload_f32(&xn)?,
        );
        let (dq, dd) = (gpu.alloc(cols)?, gpu.alloc(cols / 32 * 8)?);
        quantize_rows(gpu, dxn.ptr, dq.ptr, dd.ptr, 1, cols)?;
        let db: Vec<_> = biases
            .iter()
            .map(|b| gpu.upload_f32(b))
            .collect::<Result<_>>()?;
        // the cache: the step's row is 5 of 7
        let (n_rows, row) = (7usize, 5i32);
        let kvd = nkv * hd;
        let (dpos, drow) = (
            gpu.upload(&bytes_i32(&[position as i32]))?,
            gpu.upload(&bytes_i32(&[row]))?,
        );
        let all = if kinds.iter().any(|k| k.fused_all_only()) {
            "_all"
        } else {
            ""
        };
        let (a, b, c, n) = (nh as i32, nkv as i32, hd as i32, cols as i32);
        let ty: Vec<i32> = kinds.iter().map(|&k| k as i32).collect();
        let (ts, nx) = (base.powf(-2.0 / hd as f32), neox as i32);
        let warps = (nh + 2 * nkv) * hd / 2;
        for fold_norm in [false, true] {
            let qout = gpu.upload_f32(&vec![f32::NAN; rows[0]])?;
            let (kc, vc) = (gpu.alloc(n_rows * kvd * 2)?, gpu.alloc(n_rows * kvd * 2)?);
            let name = if fold_norm {
                format!("mvx_1_norm_rope{all}")
            } else {
                format!("mvx_1_rope{all}")
            };
            let f = gpu.func(&name)?;
            let mut l = gpu.stream.launch_builder(&f);
            l.arg(&devs[0].ptr)
                .arg(&ty[0])
                .arg(&devs[1].ptr)
                .arg(&ty[1])
                .arg(&devs[2].ptr)
                .arg(&ty[2])
                .arg(&a)
                .arg(&b)
                .arg(&c)
                .arg(&n)
                .arg(&db[0].ptr)
                .arg(&db[1].ptr)
                .arg(&db[2].ptr)
                .arg(&dpos.ptr)
                .arg(&ts)
                .arg(&nx)
                .arg(&qout.ptr)
                .arg(&kc.ptr)
                .arg(&vc.ptr)
                .arg(&drow.ptr);
            let launch = if fold_norm {
                l.arg(&dx.ptr).arg(&dnw.ptr).arg(&eps);
                cudarc::driver::LaunchConfig {
                    shared_mem_bytes: (cols + cols / 4) as u32,
                    ..cfg((warps.div_ceil(8) as u32, 1, 1), 256)
                }
            } else {
                l.arg(&dq.ptr).arg(&dd.ptr);
                cfg((warps.div_ceil(4) as u32, 1, 1), 128)
            };
            // SAFETY: the buffers are sized for these shapes; the arguments match the kernel.
            unsafe { l.launch(launch) }?;
            let got_q = gpu.read_f32(qout.ptr, rows[0])?;
            let cache_row = |buf: u64| -> Result<Vec<f32>> {
                let mut all = vec![0u8; n_rows * kvd * 2];
                gpu.read(buf, &mut all)?;
                let at = row as usize * kvd * 2;
                Ok(all[at..at + kvd * 2]
                    .chunks_exact(2)
                    .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                    .collect())
            };
            let got = [got_q, cache_row(kc.ptr)?, cache_row(vc.ptr)?];
            let label = format!(
                "{name} ({} rope, {nh}/{nkv} heads of {hd}, {} / {} / {}, {cols} columns)",
                if neox { "neox" } else { "normal" },
                kinds[0].name(),
                kinds[1].name(),
                kinds[2].name()
            );
            for (i, part) in ["q", "k in cache (f16)", "v in cache (f16)"]
                .iter()
                .enumerate()
            {
                out.push(CaseResult {
                    op: format!("{label}: {part}"),
                    err: rel_err(&got[i], &want[i]),
                    tol: 1e-2,
                });
            }
        }
    }
    Ok(())
}
