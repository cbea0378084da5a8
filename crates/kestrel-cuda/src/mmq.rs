//! The quantized mat-mat's launches (batched decode of [`MMQ_MIN`] to [`MMQ_MAX`] tokens):
//! which kernel and block shape a matrix takes (`kernels/mmq.cu`, int8 on the tensor cores;
//! `kernels/mmh.cu`, f16 for Q4_K and Q6_K), its shared memory, and its launch over one to
//! [`MMQ_GROUP`] matrices sharing an input.

use crate::error::{CudaError, Result};
use crate::matmul::unit_cols;
use crate::ops::MMQ_MAX;
use cudarc::driver::PushKernelArg;

/// Matrices one mat-mat launch takes at most (`kernels/mmq.cu`'s `MMQ_MATS_ARGS`, `mmq_pick`): the projections
/// that share an input (q / gate / k / v, a DeltaNet layer's four) in one grid, so the small ones
/// (k and v of 1,024 rows, alpha and beta of 32) do not each leave most SMs idle.
pub const MMQ_GROUP: usize = 4;

/// One matrix of a mat-mat launch: its device weights, rows, and the output (`[t, rows]` f32).
#[derive(Clone, Copy, Debug)]
pub struct MmqMat {
    pub w: u64,
    pub rows: usize,
    pub out: u64,
}

/// One launch of the quantized mat-mat (`kernels/mmq.cu`).
pub struct MmqLaunch {
    pub name: String,
    /// Rows a block takes (16 a row tile).
    pub block_rows: usize,
    /// Blocks along the tokens (tiles of the step).
    pub token_tiles: u32,
    /// Threads a block: 32 per warp splitting the rows' units.
    pub block: u32,
    /// Dynamic shared memory a block (the staged kernels' rings), bytes.
    pub smem: u32,
    /// The step's tokens rounded up to the tile (the padded count of its activation layout).
    pub t8: usize,
    /// The f16 kernel (`kernels/mmh.cu`): it reads the f16 copy of the activations, not the
    /// 8-bit one.
    pub f16: bool,
    /// The f16 kernel's column parts (a block's warps split a stage's halves) and token tile.
    kparts: usize,
    tile: usize,
    /// How the f16 kernel's blocks share the launch's tiles.
    pub grid: F16Grid,
}

/// How an f16 launch's blocks share its tiles (row blocks x token tiles, each a run of stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Grid {
    /// Whole tiles split as the occupancy's wave allows, or stream-K where whole tiles would
    /// leave much of the wave idle ([`f16_picked_blocks`]); `KESTREL_CUDA_STREAMK=0` / `=1`
    /// forces the one or the other.
    Picked,
    /// Every tile's stages split evenly among this many blocks (`gpu-check --perf`).
    Splits(usize),
    /// A wave of blocks sharing the launch's units evenly ([`f16_blocks`]).
    Stream,
}

/// The activations a mat-mat launch reads: the 8-bit copy in the mat-mat's layout (quants,
/// scales), or the f16 copy (`[t, cols]`) for the f16 kernels, with the buffers of their
/// column splits.
#[derive(Clone, Copy, Debug)]
pub enum MmqInput {
    Int8 { q: u64, d: u64 },
    F16 { x: u64, splits: SplitBufs },
}

/// Where the f16 kernel's blocks leave their sums of the tiles they share (`kernels/mmh.cu`,
/// `mmh_partial_sum`): `part` holds [`SPLIT_FLOATS`] floats, `count` [`SPLIT_TILES`] i32
/// counters, zero between launches (the last block of each tile zeroes its own).
#[derive(Clone, Copy, Debug)]
pub struct SplitBufs {
    pub part: u64,
    pub count: u64,
}

/// Floats of the shared tiles' partial sums: two slots of a block's rows x its token tile for
/// each block of a launch stay within them (24 MiB: a wave of 264 blocks of 128 rows x 64
/// tokens takes 17).
pub const SPLIT_FLOATS: usize = 6 << 20;

/// (row block, token tile) tiles of a launch whose blocks may share them.
pub const SPLIT_TILES: usize = 8192;

/// Stages a block takes at least on average (the ring's first stages are its start-up).
const MIN_SPLIT_STAGES: usize = 2;

/// Column splits of each of `tiles` tiles (row blocks x token tiles), each `stages` stages
/// long and `slot` floats of sums: `want`, at most one split per [`MIN_SPLIT_STAGES`] stages
/// and as many as the partial sums' buffer holds (two slots a block), evened out so that none
/// is empty.
pub fn f16_splits(tiles: usize, stages: usize, want: usize, slot: usize) -> usize {
    if tiles == 0 || tiles > SPLIT_TILES {
        return 1;
    }
    let most = want
        .min(stages / MIN_SPLIT_STAGES)
        .min(SPLIT_FLOATS / (2 * tiles * slot).max(1))
        .max(1);
    stages.div_ceil(stages.div_ceil(most).max(1)).max(1)
}

/// Blocks of an f16 launch over `tiles` tiles of `stages` stages and `slot` floats of sums,
/// sharing its work evenly (stream-K, `kernels/mmh.cu`'s HStream: block b of G walks units
/// [b U / G, (b + 1) U / G) of the U = tiles x stages): one `wave` (the blocks the GPU runs
/// at once), so every SM has the same share wherever the tiles do not divide by the wave, at
/// least [`MIN_SPLIT_STAGES`] units a block and two slots a block within the buffer.
pub fn f16_blocks(tiles: usize, stages: usize, wave: usize, slot: usize) -> usize {
    if tiles == 0 || tiles > SPLIT_TILES {
        return tiles.max(1);
    }
    wave.min(tiles * stages / MIN_SPLIT_STAGES)
        .min(SPLIT_FLOATS / (2 * slot).max(1))
        .max(1)
}

/// Blocks of the picked f16 grid ([`F16Grid::Picked`]): whole tiles split as the `wave`
/// allows ([`f16_splits`]) where their blocks fill at least 85% of the waves they take, else
/// stream-K over one wave ([`f16_blocks`]). H100, 2026-12-07 (`gpu-check --perf mmq`, the
/// w4 r2 k2 s3 kernels, us, whole tiles / a block an SM): 12,288 rows (96 tiles, 73% of a
/// wave) at 32 / 64 tokens Q4_K 30.9 / 40.0 against 29.5 / 37.5, Q6_K 37.6 / 48.7 against
/// 33.6 / 43.1; 4,096 rows (4 splits of 32 tiles, 97%) Q4_K 28.2 / 36.4 against 29.7 / 39.2
/// at 12,288 columns; the 151,936-row head (1,187 tiles, 99.9% of 9 waves) 336 against 329
/// at 32 tokens, 288 against 317 at 16 (where the kernel runs two blocks an SM: hence a wave,
/// not one an SM; over the wave 12,288 rows of Q4_K at 16 tokens took 24.4 against 25.4).
/// `force`: `Some(true)` stream-K, `Some(false)` whole tiles.
pub fn f16_picked_blocks(
    tiles: usize,
    stages: usize,
    wave: usize,
    slot: usize,
    force: Option<bool>,
) -> usize {
    let wave = wave.max(1);
    let whole = tiles * f16_splits(tiles, stages, wave / tiles.max(1), slot);
    let filled = 100 * whole >= 85 * whole.div_ceil(wave) * wave;
    if force.unwrap_or(!filled) {
        f16_blocks(tiles, stages, wave, slot)
    } else {
        whole
    }
}

/// `KESTREL_CUDA_STREAMK`: `1` the picked f16 grid is always stream-K, `0` always whole
/// tiles, unset [`f16_picked_blocks`] chooses.
fn stream_k() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("KESTREL_CUDA_STREAMK").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    })
}

impl MmqLaunch {
    /// This launch with its f16 blocks shared as `grid` says.
    pub fn with_grid(self, grid: F16Grid) -> Self {
        Self { grid, ..self }
    }

    /// The kernel, allowed the dynamic shared memory it takes (above the default 48 KiB).
    pub fn func(&self, gpu: &mut crate::device::Gpu) -> Result<cudarc::driver::CudaFunction> {
        gpu.func_with_smem(&self.name, self.smem)
    }

    /// Enqueues `out_i (+)= W_i · x` for 1 to [`MMQ_GROUP`] matrices of this launch's kind and
    /// `cols` columns (the add epilogue takes one), `x` the copy of `t` tokens this launch
    /// reads (the 8-bit one padded to `self.t8` tokens, or the f16 one).
    pub fn launch(
        &self,
        gpu: &mut crate::device::Gpu,
        mats: &[MmqMat],
        cols: usize,
        x: MmqInput,
        t: usize,
    ) -> Result<()> {
        if mats.is_empty() || mats.len() > MMQ_GROUP {
            return Err(CudaError::Other(format!(
                "a mat-mat launch takes 1 to {MMQ_GROUP} matrices, not {}",
                mats.len()
            )));
        }
        let f = self.func(gpu)?;
        let m: Vec<(u64, i32, u64)> = (0..MMQ_GROUP)
            .map(|i| {
                mats.get(i)
                    .map_or((0, 0, 0), |m| (m.w, m.rows as i32, m.out))
            })
            .collect();
        let blocks: usize = mats.iter().map(|m| m.rows.div_ceil(self.block_rows)).sum();
        let grid = if self.f16 {
            // one grid dimension: the kernel finds each block's tiles (HStream)
            let tiles = blocks * self.token_tiles as usize;
            let stages = cols.div_ceil(128).div_ceil(self.kparts);
            let slot = self.block_rows * self.tile;
            // the blocks the GPU runs at once (a driver without the occupancy query: one an SM)
            let wave = gpu
                .wave(&self.name, self.block, self.smem)
                .unwrap_or(gpu.sms as usize);
            let g = match self.grid {
                F16Grid::Picked => f16_picked_blocks(tiles, stages, wave, slot, stream_k()),
                F16Grid::Splits(n) => tiles * f16_splits(tiles, stages, n, slot),
                F16Grid::Stream => f16_blocks(tiles, stages, wave, slot),
            };
            (g as u32, 1, 1)
        } else {
            (blocks as u32, self.token_tiles, 1)
        };
        let config = cudarc::driver::LaunchConfig {
            shared_mem_bytes: self.smem,
            ..crate::ops::cfg(grid, self.block)
        };
        let (c, t8, ti) = (cols as i32, self.t8 as i32, t as i32);
        let mut b = gpu.stream.launch_builder(&f);
        for (w, r, o) in &m {
            b.arg(w).arg(r).arg(o);
        }
        b.arg(&c);
        let (q, d, x16, part, count);
        match (x, self.f16) {
            (MmqInput::Int8 { q: xq, d: xd }, false) => {
                (q, d) = (xq, xd);
                b.arg(&q).arg(&d).arg(&t8).arg(&ti);
            }
            (MmqInput::F16 { x: p, splits: sb }, true) => {
                (x16, part, count) = (p, sb.part, sb.count);
                b.arg(&x16).arg(&ti).arg(&part).arg(&count);
            }
            _ => {
                return Err(CudaError::Other(format!(
                    "{}: activations of the other form ({x:?})",
                    self.name
                )))
            }
        }
        // SAFETY: each W_i holds rows_i x cols of the kernel's type in the device layout, x holds
        // t tokens of cols (the 8-bit copy: t8, in the mat-mat's layout; the f16 copy: t rows),
        // out_i t rows of rows_i floats; unused entries have 0 rows and are never read. The
        // split buffers hold SPLIT_FLOATS / SPLIT_TILES (f16_blocks keeps within them), their
        // counters zero.
        unsafe { b.launch(config) }?;
        Ok(())
    }
}

/// The quantized mat-mat for a step of `t` tokens over a `rows` x `cols` matrix with epilogue
/// `epi` (0 store, 1 add): token tiles of 8, 16, 32 or 64 (the smallest that holds the step;
/// longer steps take several tiles of 64), in the block shape [`mmq_shape`] picks.
pub fn mmq_kernel(
    kind: crate::weights::Kind,
    rows: usize,
    cols: usize,
    t: usize,
    epi: u32,
) -> MmqLaunch {
    mmq_launch(kind, t, epi, mmq_shape(kind, rows, cols, t))
}

/// A mat-mat block: `warps` warps splitting the units of `tiles` x 16 rows (each warp takes
/// every tile: an activation fragment feeds `tiles` mma); `stages` > 0: the staged kernel
/// (K-quants), each warp streaming its units through a ring of that many stages of shared
/// memory. `f16`: the f16 kernel (Q4_K, Q6_K), whose `warps` are `warps / kparts` row groups
/// of `tiles` x 16 rows each (a block of that many rows) times `kparts` parts of the columns,
/// sharing the block's ring of `stages` stages (int8 shapes: `kparts` 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqShape {
    pub warps: usize,
    pub tiles: usize,
    pub stages: usize,
    pub f16: bool,
    pub kparts: usize,
}

/// [`mmq_kernel`] in block shape `shape` (one of [`mmq_block_shapes`]).
pub fn mmq_launch(kind: crate::weights::Kind, t: usize, epi: u32, shape: MmqShape) -> MmqLaunch {
    let tile = mmq_tile(t);
    let MmqShape {
        warps,
        tiles,
        stages,
        f16,
        kparts,
    } = shape;
    let nj = tile / 8;
    let (name, smem, block_rows) = if f16 {
        // kernels/mmh.cu's HStage: each half's row planes, then the tokens at a pitch of 256
        // kparts + 16 bytes; the column parts' sums reuse the ring
        let groups = warps / kparts;
        let rows = groups * tiles * 16;
        let record = if kind == crate::weights::Kind::Q4K {
            80
        } else {
            108
        };
        let stage = kparts * rows * record + tile * (256 * kparts + 16);
        let reduce = (kparts - 1) * groups * nj * tiles * 4 * 32 * 4;
        (
            format!(
                "mmh_{}_{nj}_{epi}_w{groups}_r{tiles}_k{kparts}_s{stages}",
                kind.name()
            ),
            (stages * stage).max(reduce) as u32,
            rows,
        )
    } else if stages > 0 {
        // kernels/mmq.cu's Stage: the rows' records, then two pieces of activations
        let record = if kind == crate::weights::Kind::Q4K {
            48
        } else {
            80
        };
        let stage = tiles * 16 * record + 2 * tile * 32 + 2 * tile * 8;
        let reduce = warps * nj * tiles * 128 * 4;
        (
            format!(
                "mmqs_{}_{nj}_{epi}_w{warps}_r{tiles}_s{stages}",
                kind.name()
            ),
            (warps * stages * stage).max(reduce) as u32,
            16 * tiles,
        )
    } else {
        debug_assert_eq!(tiles, 1, "the register kernels take one row tile");
        (format!("mmq_{}_{nj}_{epi}_w{warps}", kind.name()), 0, 16)
    };
    MmqLaunch {
        name,
        block_rows,
        token_tiles: t.div_ceil(tile) as u32,
        block: 32 * warps as u32,
        smem,
        t8: t.next_multiple_of(tile),
        f16,
        kparts,
        tile,
        grid: F16Grid::Picked,
    }
}

impl MmqShape {
    /// The register kernel's block (one row tile).
    const fn regs(warps: usize) -> Self {
        Self {
            warps,
            tiles: 1,
            stages: 0,
            f16: false,
            kparts: 1,
        }
    }

    /// The staged kernel's block.
    const fn staged(warps: usize, tiles: usize, stages: usize) -> Self {
        Self {
            warps,
            tiles,
            stages,
            f16: false,
            kparts: 1,
        }
    }

    /// The f16 kernel's block: `groups` x `tiles` x 16 rows, `groups` x `kparts` warps.
    const fn half(groups: usize, tiles: usize, kparts: usize, stages: usize) -> Self {
        Self {
            warps: groups * kparts,
            tiles,
            stages,
            f16: true,
            kparts,
        }
    }
}

/// The block shapes a mat-mat of `kind` for `t` tokens comes in (`kernels/mmq.cu` builds these):
/// 8 warps at 8 tokens, 4 or 8 at 16-32, 4 at 64; for the K-quants the staged kernels at 16-64
/// tokens instead of the register kernel's 8 warps at 64; for Q4_K and Q6_K at 8-64 tokens
/// also the f16 kernel's blocks (`kernels/mmh.cu`).
pub fn mmq_block_shapes(kind: crate::weights::Kind, t: usize) -> Vec<MmqShape> {
    let mut shapes = int8_block_shapes(kind, t);
    if takes_f16(kind) {
        shapes.extend(f16_block_shapes(t));
    }
    shapes
}

/// The f16 kernel's blocks (`kernels/mmh.cu`'s `MMH_ALL`): 128 rows as 4 row groups of two
/// tiles over halves of the columns (8 warps, 3 stages), 64 rows as 2 groups of two tiles over
/// quarters of the columns (8 warps, 2 stages): the fastest two of six timed on an H100
/// (2026-12-07, docs/cuda.md lab book; without column parts, 4 warps a block, every shape was
/// slower). At 8-32 tokens also the 128-row block with a ring of 4 stages, built for
/// `gpu-check --perf` and not picked: ncu found the 3-stage kernel waiting on its copies most
/// (thirty-sixth session), and a ring of 4 fits shared memory only up to 32 tokens.
fn f16_block_shapes(t: usize) -> Vec<MmqShape> {
    let mut shapes = vec![MmqShape::half(4, 2, 2, 3), MmqShape::half(2, 2, 4, 2)];
    if mmq_tile(t) <= 32 {
        shapes.push(MmqShape::half(4, 2, 2, 4));
    }
    shapes
}

/// Whether the f16 kernel is built for `kind`: Q4_K and Q6_K, at every tile (8-64 tokens).
fn takes_f16(kind: crate::weights::Kind) -> bool {
    use crate::weights::Kind;
    matches!(kind, Kind::Q4K | Kind::Q6K)
}

fn int8_block_shapes(kind: crate::weights::Kind, t: usize) -> Vec<MmqShape> {
    let (regs, staged) = (MmqShape::regs, MmqShape::staged);
    let k_quant = kind.k_quant();
    match mmq_tile(t) {
        8 if k_quant => vec![regs(8), regs(16), staged(16, 2, 2)],
        8 => vec![regs(8)],
        16 if k_quant => vec![regs(4), regs(8), staged(16, 2, 2)],
        32 if k_quant => vec![
            regs(4),
            regs(8),
            staged(16, 2, 2),
            staged(8, 2, 3),
            staged(4, 2, 4),
        ],
        64 if k_quant => vec![regs(4), staged(16, 1, 2), staged(4, 2, 3)],
        64 => vec![regs(4)],
        _ => vec![regs(4), regs(8)],
    }
}

/// The block shape of a mat-mat (`gpu-check --perf`, H200, 2026-12-03 17:42 and 12-03 19:47
/// calls: docs/cuda.md has the tables). On rows of 4,096+ columns (64+ units of a K-quant: the
/// shapes measured) the staged kernels, each warp streaming its units through shared memory:
/// where rows are few (<= 4,096, one block an SM) 16 warps (Q6_K at 32 tokens: 8), and at 64
/// tokens on Q4_K's many rows; on many rows 4 warps of two row tiles at 32 tokens, and for Q6_K
/// at 64 (several blocks an SM). At 8 tokens the register kernel, on 16 warps where Q4_K rows
/// are few (4096x12288 24.6 -> 19.8 us) and 8 elsewhere (16 lost on 12,288 rows), except Q6_K's
/// few rows of 128+ units (staged, 33.2 -> 30.4 us). At 16 tokens the staged kernel on many
/// rows too (H100, 2026-12-06 09:42 call: 12288x4096 Q4_K 26.0 us against 37.7 on the 4-warp
/// register kernel picked before, 30.4 on 8 warps; Q6_K 35.9 against 47.6 / 35.7; the 8B's
/// aggregate decode at 12 / 16 sequences +5% / +4%, H200, 10:20 call). The register
/// kernels on short rows (not measured staged): 8 warps where rows are long (128+ units) or
/// few, else 4.
///
/// The f16 kernel (`kernels/mmh.cu`) where it was faster ([`f16_shape`]: Q6_K of 4,096+ rows,
/// Q4_K's long or many rows, at 9-64 tokens); `KESTREL_CUDA_MMH=0` keeps the int8 kernels,
/// `8` adds Q6_K's many rows at 5-8 tokens, `all` takes the f16 one wherever it can (A/B).
pub fn mmq_shape(kind: crate::weights::Kind, rows: usize, cols: usize, t: usize) -> MmqShape {
    let f16 = match f16_picks() {
        F16Picks::Off => None,
        F16Picks::Measured => f16_shape(kind, rows, cols, t, false),
        F16Picks::WithEight => f16_shape(kind, rows, cols, t, true),
        F16Picks::All => f16_everywhere(kind, rows, cols),
    };
    f16.unwrap_or_else(|| int8_shape(kind, rows, cols, t))
}

/// Where the f16 mat-mat is picked (`KESTREL_CUDA_MMH`): `0` nowhere (the int8 kernels only),
/// `all` on every matrix it is built for (to time the picks in the model), `8` where
/// [`f16_shape`] found it faster including its 8-token tiles (faster alone, not yet timed in
/// the model), else where it found it faster at 9-64 tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum F16Picks {
    Off,
    Measured,
    WithEight,
    All,
}

fn f16_picks() -> F16Picks {
    static PICKS: std::sync::OnceLock<F16Picks> = std::sync::OnceLock::new();
    *PICKS.get_or_init(|| match std::env::var("KESTREL_CUDA_MMH").as_deref() {
        Ok("0") => F16Picks::Off,
        Ok("all") => F16Picks::All,
        Ok("8") => F16Picks::WithEight,
        _ => F16Picks::Measured,
    })
}

/// Whether the f16 kernel can take a `kind` matrix of `rows` x `cols`: Q4_K or Q6_K rows of
/// 4,096+ columns, a matrix under 4 GiB (its copies take 32-bit offsets).
fn f16_fits(kind: crate::weights::Kind, rows: usize, cols: usize) -> bool {
    let bytes = kestrel_quant::row_bytes(kind.ggml(), cols).map_or(u64::MAX, |b| (b * rows) as u64);
    takes_f16(kind) && cols / unit_cols(kind) >= 64 && bytes < 1 << 32
}

/// The f16 kernel on every matrix it can take (`KESTREL_CUDA_MMH=all`): 128-row blocks of 3
/// stages, the faster shape on all but one of the 8B's matrices in `gpu-check --perf`.
fn f16_everywhere(kind: crate::weights::Kind, rows: usize, cols: usize) -> Option<MmqShape> {
    f16_fits(kind, rows, cols).then_some(MmqShape::half(4, 2, 2, 3))
}

/// The f16 kernel's block for a mat-mat, where it beat the int8 kernels ([`mmq_shape`]), with
/// its column splits picked at launch. H100, `gpu-check --perf` (2026-12-07 10:04 call, us,
/// f16 / the int8 pick; docs/cuda.md lab book): every Q6_K matrix of 4,096+ rows (4096x12288
/// at 16 / 32 / 64 tokens 29.1 / 32.3 / 41.6 against 31.4 / 40.8 / 69.1; 12288x4096 34.0 /
/// 37.7 / 48.7 against 35.9 / 43.3 / 63.7; the 8B's head 293 / 332 / 431 against 381 / 457 /
/// 769); Q4_K's many rows at 16 and 64 tokens (12288x4096 25.8 / 40.5 against 27.6 / 43.3; at
/// 32 30.9 against 29.7), its long rows at 32 and 64 (4096x12288 27.4 / 37.2 against 28.6 /
/// 47.4); not Q4_K's 4096x4096 (11.8 / 14.8 / 18.0 against 9.8 / 12.0 / 17.7), nor matrices of
/// fewer than 4,096 rows (not measured: the 1.5B's 1536x8960 down stays int8). Q6_K's rows of
/// 4,096 at 16 tokens take blocks of 64 rows (29.1 against 31.6 us), the rest of 128. At 5-8
/// tokens (2026-12-08 00:36 call, H100) it won on Q6_K's many rows only (the 8B's head 260.0
/// against 338.4 us, 12288x4096 28.5 against 32.4); it lost on Q6_K's 4096x4096 (13.7-15.5
/// against 12.0), was within 3% on 4096x12288, and lost on every Q4_K shape (12288x4096
/// 22.3-24.4 against 21.0, 4096x12288 23.2-25.7 against 19.9). `eight`: take those 8-token
/// wins (`KESTREL_CUDA_MMH=8`, until the model is timed with them).
fn f16_shape(
    kind: crate::weights::Kind,
    rows: usize,
    cols: usize,
    t: usize,
    eight: bool,
) -> Option<MmqShape> {
    use crate::weights::Kind;
    if !f16_fits(kind, rows, cols) {
        return None;
    }
    let (tile, many, long) = (mmq_tile(t), rows >= 8192, cols >= 8192);
    let take = rows >= 4096
        && match (kind, tile) {
            (Kind::Q6K, 8) => eight && many,
            (_, 8) => false,
            (Kind::Q6K, _) => true,
            (_, 16) => many,
            (_, 32) => long,
            _ => many || long,
        };
    let shape = if kind == Kind::Q6K && tile == 16 && !many {
        MmqShape::half(2, 2, 4, 2)
    } else {
        MmqShape::half(4, 2, 2, 3)
    };
    take.then_some(shape)
}

/// The int8 kernels' block for a mat-mat ([`mmq_shape`]'s measured picks).
fn int8_shape(kind: crate::weights::Kind, rows: usize, cols: usize, t: usize) -> MmqShape {
    use crate::weights::Kind;
    let (regs, staged) = (MmqShape::regs, MmqShape::staged);
    let long = kind.k_quant() && cols / unit_cols(kind) >= 64;
    let few = rows <= 4096;
    // Q5_K (not measured on its own) takes Q4_K's picks: the same units and their qh bytes
    let q4k = matches!(kind, Kind::Q4K | Kind::Q5K);
    match mmq_tile(t) {
        8 if long && few && q4k => regs(16),
        8 if few && kind == Kind::Q6K && cols / unit_cols(kind) >= 128 => staged(16, 2, 2),
        8 => regs(8),
        32 if long && few && kind == Kind::Q6K => staged(8, 2, 3),
        16 if long => staged(16, 2, 2),
        32 if long && few => staged(16, 2, 2),
        32 if long => staged(4, 2, 4),
        64 if long && (few || q4k) => staged(16, 1, 2),
        64 if long => staged(4, 2, 3),
        64 => regs(4),
        _ if cols / unit_cols(kind) >= 128 || few => regs(8),
        _ => regs(4),
    }
}

/// Fewest tokens for which a quantized matmul takes the mat-mat: from 5 tokens the mat-vecs run
/// their 8-token form, which the mat-mat's 8-token tile beats (`gpu-check --perf`, H200: Q4_K
/// 12288x4096 22 against 67 us, 4096x12288 44 against 67; Q6_K 53 against 77, 76 against 73).
pub const MMQ_MIN: usize = 5;

/// Whether a matmul of `t` tokens over a `kind` matrix takes the int8 mat-mat.
pub fn takes_mmq(kind: crate::weights::Kind, t: usize) -> bool {
    kind.int8_activations() && (MMQ_MIN..=MMQ_MAX).contains(&t)
}

/// Tokens per tile of the mat-mat for a step of `t` tokens.
fn mmq_tile(t: usize) -> usize {
    if t <= 8 {
        8
    } else if t <= 16 {
        16
    } else if t <= 32 {
        32
    } else {
        64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Kind;

    /// Column splits fill the wave where the stages allow, never leave a split empty, and stay
    /// within the partial sums' buffers.
    #[test]
    fn f16_splits_fill_the_wave_within_the_buffers() {
        let slot = 128 * 32;
        // the 8B's 4096x4096 at 32 tokens: 32 blocks of 16 stages, a wave of 264
        assert_eq!(f16_splits(32, 16, 264 / 32, slot), 8);
        assert_eq!(f16_splits(96, 16, 264 / 96, slot), 2);
        assert_eq!(f16_splits(300, 16, 0, slot), 1);
        // 5 wanted of 16 stages: 4 of 4 stages, not 5 with an empty last
        assert_eq!(f16_splits(32, 16, 5, slot), 4);
        // two stages a split at least
        assert_eq!(f16_splits(4, 6, 100, slot), 3);
        assert_eq!(f16_splits(4, 1, 100, slot), 1);
        // the buffers: two slots a block (tiles x splits blocks), SPLIT_TILES counters
        let tiles = SPLIT_FLOATS / slot / 4;
        assert_eq!(f16_splits(tiles, 64, 16, slot), 2);
        assert_eq!(f16_splits(SPLIT_TILES + 1, 64, 16, 1), 1);
        for tiles in 1..200 {
            for stages in 1..40 {
                for want in 0..20 {
                    let n = f16_splits(tiles, stages, want, slot);
                    let per = stages.div_ceil(n);
                    assert!(
                        n >= 1 && (n - 1) * per < stages,
                        "{tiles} {stages} {want}: {n}"
                    );
                    assert!(n == 1 || 2 * tiles * n * slot <= SPLIT_FLOATS);
                }
            }
        }
    }

    /// The pick: whole tiles where they fill the waves they take, stream-K over a wave where
    /// they leave more than 15% of it idle; the forced settings take the one or the other.
    #[test]
    fn picked_f16_grid_streams_where_whole_tiles_leave_the_wave_idle() {
        let slot = 128 * 32;
        // the 8B's 4096-row matrices at 32 tokens: 32 tiles in 4 splits fill 128 of 132
        assert_eq!(f16_picked_blocks(32, 16, 132, slot, None), 128);
        assert_eq!(f16_picked_blocks(32, 16, 264, slot, None), 256);
        // 12,288 rows: 96 whole tiles are 73% of a wave of 132, 192 of 264
        assert_eq!(f16_picked_blocks(96, 16, 132, slot, None), 132);
        assert_eq!(f16_picked_blocks(96, 16, 264, slot, None), 264);
        // the head's 1,187 tiles fill 9 waves of 132 (99.9%) and 5 of 264 (89.9%)
        assert_eq!(f16_picked_blocks(1187, 16, 132, slot, None), 1187);
        assert_eq!(f16_picked_blocks(1187, 16, 264, slot, None), 1187);
        // forced
        assert_eq!(f16_picked_blocks(32, 16, 132, slot, Some(true)), 132);
        assert_eq!(f16_picked_blocks(96, 16, 132, slot, Some(false)), 96);
        // no wave known: still a grid
        assert_eq!(f16_picked_blocks(5, 1, 0, slot, None), 5);
    }

    /// The stream-K walk of `kernels/mmh.cu` (HStream), as the kernel does it: every block's
    /// runs of units, tile by tile.
    fn runs(tiles: usize, stages: usize, g: usize) -> Vec<Vec<(usize, usize, usize)>> {
        let units = tiles * stages;
        let start = |b: usize| b * units / g;
        (0..g)
            .map(|b| {
                let (mut u, end, mut out) = (start(b), start(b + 1), Vec::new());
                while u < end {
                    let (tile, s) = (u / stages, u % stages);
                    let n = (stages - s).min(end - u);
                    out.push((tile, s, n));
                    u += n;
                }
                out
            })
            .collect()
    }

    /// Stream-K's blocks: a wave within the buffers. Every unit is walked once; the blocks
    /// sharing a tile are the consecutive ones the kernel's `block_of` names, and their slots
    /// (`slot`: a block's first tile in 2 b, its last in 2 b + 1) never collide.
    #[test]
    fn stream_k_walks_every_unit_once_and_its_slots_never_collide() {
        let slot = 128 * 32;
        assert_eq!(f16_blocks(192, 16, 132, slot), 132);
        assert_eq!(f16_blocks(32, 4, 132, slot), 64);
        assert_eq!(f16_blocks(4, 1, 132, slot), 2);
        assert_eq!(f16_blocks(SPLIT_TILES + 1, 16, 132, slot), SPLIT_TILES + 1);
        assert_eq!(
            f16_blocks(96, 16, 1000, 128 * 64),
            SPLIT_FLOATS / (2 * 128 * 64)
        );
        for (tiles, stages, g) in [
            (192, 16, 264),
            (96, 16, 132),
            (7, 5, 3),
            (3, 16, 9),
            (5, 7, 35),
            (300, 24, 132),
        ] {
            let all = runs(tiles, stages, g);
            let units = tiles * stages;
            let block_of = |u: usize| ((u + 1) * g - 1) / units;
            let slot_of =
                |b: usize, tile: usize| 2 * b + usize::from((b * units / g) / stages != tile);
            let mut walked = vec![0u32; units];
            let mut slots = std::collections::HashSet::new();
            for (b, runs) in all.iter().enumerate() {
                for &(tile, s, n) in runs {
                    (s..s + n).for_each(|i| walked[tile * stages + i] += 1);
                    let (first, last) =
                        (block_of(tile * stages), block_of((tile + 1) * stages - 1));
                    assert!((first..=last).contains(&b));
                    if n < stages {
                        assert!(first < last, "a run short of its tile is shared");
                        assert!(
                            slots.insert(slot_of(b, tile)),
                            "{tiles} {stages} {g}: slot of {b} {tile}"
                        );
                        assert!(slot_of(b, tile) < 2 * g);
                    } else {
                        assert_eq!(first, last);
                    }
                }
            }
            assert!(walked.iter().all(|&w| w == 1), "{tiles} {stages} {g}");
        }
    }

    /// Every shape the mat-mat picks is one `kernels/mmq.cu` builds (and the harness checks):
    /// a picked shape outside the list would be a kernel missing at run time.
    #[test]
    fn picked_mmq_shapes_are_built_ones() {
        for kind in Kind::QUANTIZED {
            for rows in [896, 1024, 1536, 4096, 6144, 12288, 151_936] {
                for cols in [1024, 4096, 12288] {
                    for t in MMQ_MIN..=MMQ_MAX {
                        let f16 = f16_shape(kind, rows, cols, t, false);
                        let eight = f16_shape(kind, rows, cols, t, true);
                        let all = f16_everywhere(kind, rows, cols);
                        for s in [int8_shape(kind, rows, cols, t)]
                            .into_iter()
                            .chain(f16)
                            .chain(eight)
                            .chain(all)
                        {
                            assert!(
                                mmq_block_shapes(kind, t).contains(&s),
                                "{kind:?} {rows}x{cols} t {t}: {s:?}"
                            );
                        }
                    }
                }
            }
        }
        // the measured picks (the 8B's shapes)
        let shape = |warps, tiles, stages| MmqShape {
            warps,
            tiles,
            stages,
            f16: false,
            kparts: 1,
        };
        let half = MmqShape::half;
        assert_eq!(int8_shape(Kind::Q4K, 4096, 12288, 32), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 32), shape(8, 2, 3));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 32), shape(4, 2, 4));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 16), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 16), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 64), shape(16, 1, 2));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 64), shape(4, 2, 3));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 64), shape(16, 1, 2));
        assert_eq!(int8_shape(Kind::Q4K, 4096, 4096, 8), shape(16, 1, 0));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 8), shape(8, 1, 0));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 8), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 4096, 8), shape(8, 1, 0));
        // short rows (the 0.8B's 4096x1024 q + gate) not measured staged: the register kernel
        assert_eq!(int8_shape(Kind::Q4K, 4096, 1024, 32), shape(8, 1, 0));
        // the f16 kernel: Q6_K of 4,096+ rows, Q4_K's many or long rows by tile, at 9-64
        // tokens (with KESTREL_CUDA_MMH=8 also Q6_K's 8,192+ rows at 5-8)
        let f16 =
            |k, r, c, t| f16_shape(k, r, c, t, false).unwrap_or_else(|| int8_shape(k, r, c, t));
        let eight =
            |k, r, c, t| f16_shape(k, r, c, t, true).unwrap_or_else(|| int8_shape(k, r, c, t));
        assert_eq!(f16(Kind::Q6K, 151_936, 4096, 9), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 4096, 12288, 16), half(2, 2, 4, 2));
        assert_eq!(f16(Kind::Q6K, 151_936, 4096, 32), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 12288, 4096, 64), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 4096, 12288, 32), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 4096, 4096, 32), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 151_936, 4096, 8), shape(8, 1, 0));
        assert_eq!(eight(Kind::Q6K, 151_936, 4096, 8), half(4, 2, 2, 3));
        assert_eq!(eight(Kind::Q6K, 12288, 4096, 5), half(4, 2, 2, 3));
        assert_eq!(eight(Kind::Q6K, 4096, 12288, 8), shape(16, 2, 2));
        assert_eq!(eight(Kind::Q4K, 12288, 4096, 8), shape(8, 1, 0));
        assert_eq!(eight(Kind::Q6K, 151_936, 4096, 32), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q6K, 1024, 4096, 32), shape(8, 2, 3));
        assert_eq!(f16(Kind::Q4K, 24576, 4096, 16), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q4K, 24576, 4096, 32), shape(4, 2, 4));
        assert_eq!(f16(Kind::Q4K, 24576, 4096, 64), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q4K, 4096, 12288, 16), shape(16, 2, 2));
        assert_eq!(f16(Kind::Q4K, 4096, 12288, 32), half(4, 2, 2, 3));
        assert_eq!(f16(Kind::Q4K, 4096, 4096, 64), shape(16, 1, 2));
        assert_eq!(f16(Kind::Q5K, 12288, 4096, 32), shape(4, 2, 4));
        assert_eq!(f16(Kind::Q6K, 151_936, 1024, 32), shape(4, 1, 0));
        assert_eq!(f16(Kind::Q4K, 1536, 8960, 32), shape(16, 2, 2));
    }
}
