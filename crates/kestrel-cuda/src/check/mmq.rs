//! The mat-mat cases (`kernels/mmq.cu`, int8; `kernels/mmh.cu`, f16): every quantized type,
//! token counts across the four tile widths and past one tile, both epilogues, every block
//! shape of each tile, a row count that leaves the last block partial and a row length (1,280:
//! ten halves of K-quant blocks) that leaves the f16 kernel's last stage partial; and its speed
//! lines.

use super::{cfg, random_matrix, rel_err, CaseResult, Rng};
use crate::device::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::mmq::{
    mmq_block_shapes, mmq_kernel, mmq_launch, F16Grid, MmqInput, MmqLaunch, MmqMat, SplitBufs,
    MMQ_GROUP, SPLIT_FLOATS, SPLIT_TILES,
};
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

/// `t` rows of `x` (`cols` wide) into the mat-mat's 8-bit layout of `t8` tokens on the device:
/// (quants, scales).
fn quantize(
    gpu: &mut Gpu,
    x: &DevBuf,
    t: usize,
    t8: usize,
    cols: usize,
) -> Result<(DevBuf, DevBuf)> {
    let (dq, dd) = (gpu.alloc(t8 * cols)?, gpu.alloc(t8 * cols / 32 * 8)?);
    let f = gpu.func("quantize_q_t")?;
    let (n, ti, t8i) = (cols as i32, t as i32, t8 as i32);
    // SAFETY: `x` holds t rows of cols floats; dq / dd are sized for t8 of them.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&x.ptr)
            .arg(&dq.ptr)
            .arg(&dd.ptr)
            .arg(&n)
            .arg(&ti)
            .arg(&t8i)
            .launch(cfg((t8 as u32, cols.div_ceil(256) as u32, 1), 256))?;
    }
    Ok((dq, dd))
}

/// The copy of `t` rows of `x` (`cols` wide) that `launch` reads, made by the kernels the model
/// runs (`quantize_q_t`, `to_f16`); the buffers live as long as the input is used.
fn activations(
    gpu: &mut Gpu,
    launch: &MmqLaunch,
    x: &DevBuf,
    t: usize,
    cols: usize,
) -> Result<(MmqInput, Vec<DevBuf>)> {
    if !launch.f16 {
        let (q, d) = quantize(gpu, x, t, launch.t8, cols)?;
        return Ok((MmqInput::Int8 { q: q.ptr, d: d.ptr }, vec![q, d]));
    }
    let x16 = gpu.alloc(t * cols * 2)?;
    super::f16_rows(gpu, x.ptr, x16.ptr, t * cols)?;
    let part = gpu.alloc(SPLIT_FLOATS * 4)?;
    let count = gpu.upload(&vec![0u8; SPLIT_TILES * 4])?;
    let splits = SplitBufs {
        part: part.ptr,
        count: count.ptr,
    };
    Ok((MmqInput::F16 { x: x16.ptr, splits }, vec![x16, part, count]))
}

/// Every block shape of a mat-mat of `kind` at `t` tokens, the f16 ones in each of `grids`.
fn launches(kind: Kind, t: usize, epi: u32, grids: &[F16Grid]) -> Vec<MmqLaunch> {
    let mut all = Vec::new();
    for shape in mmq_block_shapes(kind, t) {
        if shape.f16 {
            all.extend(
                grids
                    .iter()
                    .map(|&g| mmq_launch(kind, t, epi, shape).with_grid(g)),
            );
        } else {
            all.push(mmq_launch(kind, t, epi, shape));
        }
    }
    all
}

/// The grids the harness checks the f16 kernel in: stream-K, a wave sharing the work (on the
/// emulator's 4 SMs each block walks several tiles, sharing its first and last), whole tiles
/// in one split, and in three (a last split longer than the others where the stages do not
/// divide by 3).
const CHECKED_GRIDS: [F16Grid; 3] = [F16Grid::Stream, F16Grid::Splits(1), F16Grid::Splits(3)];

/// The mat-mat against f64 dot products of the dequantized weights with the f32 activations
/// (the 8-bit activations cost about 0.5%, as in the mat-vec cases, the f16 ones less:
/// tolerance 1e-2). Outputs start as NaN for the store epilogue (a row or token left unwritten
/// fails) and as random values for the add.
pub fn check_mmq(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let token_counts = [5usize, 8, 9, 16, 17, 32, 33, 64, 100];
    let most = 100;
    for (rows, cols) in [(1536usize, 4096usize), (1533, 1280)] {
        for kind in Kind::QUANTIZED {
            let (file, w) = random_matrix(kind, rows, cols, rng)?;
            let dw = gpu.upload(&to_device_layout(kind, &file))?;
            let x = rng.vec(most * cols, 1.0);
            let dx = gpu.upload_f32(&x)?;
            // f64 dots for the most tokens; fewer tokens are its first rows
            let mut want = vec![0f64; most * rows];
            for t in 0..most {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    want[t * rows + r] = w[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                }
            }
            for t in token_counts {
                for epi in 0..2u32 {
                    let base = if epi == 0 {
                        vec![f32::NAN; t * rows]
                    } else {
                        rng.vec(t * rows, 1.0)
                    };
                    let expect: Vec<f32> = (0..t * rows)
                        .map(|i| {
                            let add = if epi == 1 { base[i] as f64 } else { 0.0 };
                            (add + want[i]) as f32
                        })
                        .collect();
                    // every block shape, whichever the matrix would take
                    for mmq in launches(kind, t, epi, &CHECKED_GRIDS) {
                        let dout = gpu.upload_f32(&base)?;
                        let (input, _bufs) = activations(gpu, &mmq, &dx, t, cols)?;
                        let mat = MmqMat {
                            w: dw.ptr,
                            rows,
                            out: dout.ptr,
                        };
                        mmq.launch(gpu, &[mat], cols, input, t)?;
                        let got = gpu.read_f32(dout.ptr, t * rows)?;
                        out.push(CaseResult {
                            op: format!(
                                "mat-mat {}{} [{rows}x{cols}] tokens {t} epilogue {}",
                                mmq.name,
                                grid_label(&mmq),
                                ["store", "add"][epi as usize]
                            ),
                            err: rel_err(&got, &expect),
                            tol: 1e-2,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// How an f16 launch's blocks share its tiles, for a case's or a `--perf` line's name:
/// " picked", " stream-K", " N splits"; nothing for the int8 kernels.
fn grid_label(mmq: &MmqLaunch) -> String {
    match (mmq.f16, mmq.grid) {
        (false, _) => String::new(),
        (true, F16Grid::Picked) => " picked".into(),
        (true, F16Grid::Stream) => " stream-K".into(),
        (true, F16Grid::Splits(n)) => format!(" {n} splits"),
    }
}

/// One launch over several matrices (the projections sharing an input): [`MMQ_GROUP`] matrices
/// whose rows leave partial blocks (and one smaller than a block), each against f64 dots, at
/// each tile width in every block shape.
pub fn check_mmq_group(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let (cols, most) = (1024usize, 64usize);
    let rows = [1040usize, 33, 500, 8];
    let x = rng.vec(most * cols, 1.0);
    let dx = gpu.upload_f32(&x)?;
    for kind in Kind::QUANTIZED {
        let mut mats = Vec::new();
        for &r in &rows[..MMQ_GROUP] {
            let (file, w) = random_matrix(kind, r, cols, rng)?;
            let dw = gpu.upload(&to_device_layout(kind, &file))?;
            let want: Vec<f64> = (0..most * r)
                .map(|i| {
                    let (t, row) = (i / r, i % r);
                    let xt = &x[t * cols..(t + 1) * cols];
                    w[row * cols..(row + 1) * cols]
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum()
                })
                .collect();
            mats.push((dw, r, want));
        }
        for t in [5usize, 16, 32, 64] {
            for mmq in launches(kind, t, 0, &CHECKED_GRIDS) {
                let (input, _bufs) = activations(gpu, &mmq, &dx, t, cols)?;
                let outs: Vec<DevBuf> = mats
                    .iter()
                    .map(|(_, r, _)| gpu.upload_f32(&vec![f32::NAN; t * r]))
                    .collect::<Result<_>>()?;
                let group: Vec<MmqMat> = mats
                    .iter()
                    .zip(&outs)
                    .map(|((dw, r, _), o)| MmqMat {
                        w: dw.ptr,
                        rows: *r,
                        out: o.ptr,
                    })
                    .collect();
                mmq.launch(gpu, &group, cols, input, t)?;
                for ((_, r, want), o) in mats.iter().zip(&outs) {
                    let got = gpu.read_f32(o.ptr, t * r)?;
                    let expect: Vec<f32> = want[..t * r].iter().map(|&v| v as f32).collect();
                    out.push(CaseResult {
                        op: format!(
                            "mat-mat {}{} grouped [{}x{cols}] of {rows:?}, tokens {t}",
                            mmq.name,
                            grid_label(&mmq),
                            r
                        ),
                        err: rel_err(&got, &expect),
                        tol: 1e-2,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The mat-mat's speed on the 8B's decode shapes at 8, 16, 32 and 64 tokens (batched decode of
/// that many sequences) and 512 (a prefill chunk's worth, for the comparison), Q4_K and Q6_K,
/// and on its Q6_K head (151,936 x 4,096, the f16 kernel's pick) at 8-64 tokens, in every
/// block shape of the tile (the shipped one first),
/// as 50 launches replayed from one CUDA graph with 8 copies of the weights rotating (the 50 MB
/// L2 never holds them); beside it the GEMM path it replaces (the whole matrix dequantized to
/// f16, then cuBLAS) at 32 and 512 tokens, as stream launches. Each line: (label, us per
/// launch, GB/s of weights, TOPS).
pub fn perf_mmq(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64, f64)>> {
    let mut res = Vec::new();
    let layers = [(12288usize, 4096usize), (4096, 12288), (4096, 4096)];
    let shapes = layers
        .map(|s| (Kind::Q4K, s))
        .into_iter()
        .chain(layers.map(|s| (Kind::Q6K, s)))
        .chain([(Kind::Q6K, (151_936, 4096))]);
    for (kind, (rows, cols)) in shapes {
        let rb = kestrel_quant::row_bytes(kind.ggml(), cols)
            .map_err(|e| CudaError::Other(e.to_string()))?;
        let dev: Vec<u8> = (0..rows * rb).map(|_| rng.next_u64() as u8).collect();
        let copies: Vec<_> = (0..8).map(|_| gpu.upload(&dev)).collect::<Result<_>>()?;
        if kind == Kind::Q4K {
            for t in [32usize, 512] {
                let us = gemm_path_us(gpu, kind, &copies, rows, cols, t, rng)?;
                let ops = 2.0 * (rows * cols * t) as f64;
                res.push((
                    format!(
                        "{} {rows}x{cols}, {t} tokens (dequantize + cuBLAS f16)",
                        kind.name()
                    ),
                    us,
                    dev.len() as f64 / us / 1e3,
                    ops / us / 1e6,
                ));
            }
        }
        if kind == Kind::Q4K || kind == Kind::Q6K {
            // the mat-vec of 8 tokens (decode of 8 sequences) beside the mat-mat's 8-token tile
            let (name, grid) = crate::matmul::matvec_kernel(kind, rows, cols, 8, 0);
            let us = matvec8_us(gpu, &name, grid, &copies, rows, cols, rng)?;
            res.push((
                format!(
                    "{} {rows}x{cols}, 8 tokens ({name}, the mat-vec)",
                    kind.name()
                ),
                us,
                dev.len() as f64 / us / 1e3,
                2.0 * (rows * cols * 8) as f64 / us / 1e6,
            ));
        }
        let head = rows > 100_000;
        for t in [8usize, 16, 32, 64, 512] {
            if head && t > 64 {
                continue;
            }
            let dx = gpu.upload_f32(&rng.vec(t * cols, 1.0))?;
            let shipped = mmq_kernel(kind, rows, cols, t, 0);
            let dout = gpu.alloc(t * rows * 4)?;
            // every block shape, the shipped one first (the f16 shapes as picked, stream-K over
            // a wave, then whole tiles in 1, 2, 4, 8 and 16 splits)
            let grids = [
                F16Grid::Picked,
                F16Grid::Stream,
                F16Grid::Splits(1),
                F16Grid::Splits(2),
                F16Grid::Splits(4),
                F16Grid::Splits(8),
                F16Grid::Splits(16),
            ];
            let mut variants = launches(kind, t, 0, &grids);
            variants.sort_by_key(|v| v.name != shipped.name || v.grid != F16Grid::Picked);
            for mmq in variants {
                let (input, _bufs) = activations(gpu, &mmq, &dx, t, cols)?;
                let go = |gpu: &mut Gpu, i: usize| {
                    let mat = MmqMat {
                        w: copies[i % copies.len()].ptr,
                        rows,
                        out: dout.ptr,
                    };
                    mmq.launch(gpu, &[mat], cols, input, t)
                };
                let us = super::time_us(gpu, 8, 50, true, go)?;
                let ops = 2.0 * (rows * cols * t) as f64;
                let picked = grid_label(&mmq);
                res.push((
                    format!(
                        "{} {rows}x{cols}, {t} tokens ({}{picked})",
                        kind.name(),
                        mmq.name
                    ),
                    us,
                    dev.len() as f64 / us / 1e3,
                    ops / us / 1e6,
                ));
            }
        }
    }
    Ok(res)
}

/// The GEMM path's time for one matmul (us, mean of 10 after 2 warm-ups): the whole matrix
/// dequantized to f16, then cuBLAS against `t` f16 activation rows.
fn gemm_path_us(
    gpu: &mut Gpu,
    kind: Kind,
    copies: &[DevBuf],
    rows: usize,
    cols: usize,
    t: usize,
    rng: &mut Rng,
) -> Result<f64> {
    let act: Vec<u8> = (0..t * cols)
        .flat_map(|_| half::f16::from_f32(rng.f()).to_le_bytes())
        .collect();
    let act = gpu.upload(&act)?;
    let (wf16, out) = (gpu.alloc(rows * cols * 2)?, gpu.alloc(rows * t * 4)?);
    let go = |gpu: &mut Gpu, i: usize| -> Result<()> {
        let w = copies[i % copies.len()].ptr;
        crate::matmul::dequant_f16(gpu, kind, w, rows, cols, 0, rows, wf16.ptr)?;
        gpu.gemm_f16(rows, t, cols, wf16.ptr, act.ptr, out.ptr, rows, 0.0)
    };
    go(gpu, 0)?;
    go(gpu, 1)?;
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let e0 = gpu.stream.record_event(timing)?;
    let reps = 10;
    for i in 0..reps {
        go(gpu, i)?;
    }
    let e1 = gpu.stream.record_event(timing)?;
    e1.synchronize()?;
    Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / reps as f64)
}

/// The 8-token mat-vec's time (us, 50 graph replays, weights rotating as in [`perf_mmq`]).
fn matvec8_us(
    gpu: &mut Gpu,
    name: &str,
    grid: u32,
    copies: &[DevBuf],
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Result<f64> {
    let t = 8;
    let dx = gpu.upload_f32(&rng.vec(t * cols, 1.0))?;
    let (dq, dd, dout) = (
        gpu.alloc(t * cols)?,
        gpu.alloc(t * cols / 32 * 8)?,
        gpu.alloc(t * rows * 4)?,
    );
    super::quantize_rows(gpu, dx.ptr, dq.ptr, dd.ptr, t, cols)?;
    let f = gpu.func(name)?;
    let go = |gpu: &Gpu, i: usize| -> Result<()> {
        let w = copies[i % copies.len()].ptr;
        let mv = super::MvLaunch {
            w,
            w2: w,
            rows,
            cols,
            q: (dq.ptr, dd.ptr),
            xf: dx.ptr,
            out: dout.ptr,
        };
        // SAFETY: the mat-vec's arguments as in check_matvec.
        unsafe { mv.run(gpu, &f, grid) }
    };
    super::time_us(gpu, 8, 50, true, |g: &mut Gpu, i| go(g, i))
}
