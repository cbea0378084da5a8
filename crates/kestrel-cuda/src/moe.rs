//! Mixture-of-experts FFNs (Qwen3-MoE) on the GPU: [`MoeOps`] over the model's buffers, run
//! by `kernels/moe.cu`. A layer's experts are stacked into one matrix per role (gate, up,
//! down); the router is a plain matmul; the routes (expert ids and weights) stay in device
//! memory, so a decode step with experts is one CUDA graph like a dense model's.
//!
//! Steps of up to [`MATVEC_MAX`] tokens run each route's expert as mat-vecs (a warp a row): a
//! token reads only its `n_used` experts, which is what decode wants. Longer steps (prompts,
//! batched decode) group the routes by expert ([`Experts::tile`]): `moe_sort` puts each
//! expert's routes in consecutive slots, and the int8 mat-mat reads an expert once a tile of
//! slots instead of once a route.

use crate::device::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::matmul::{quantize_rows, swiglu};
use crate::model::CudaModel;
use crate::ops::{cfg, MATVEC_MAX};
use crate::weights::{DevMatrix, Kind};
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, MoeOps};
use kestrel_models::config::MoeConfig;
use kestrel_models::moe::MoeWeights;
use kestrel_models::ModelConfig;

/// Experts a router may score (`kernels/moe.cu`'s `MOE_MAX_EXPERTS`: a warp a token, 16 a lane).
pub const MAX_EXPERTS: usize = 512;

/// Routes a token may take (`moe_route` keeps choice j in lane j).
pub const MAX_USED: usize = 32;

/// A layer's router and expert stacks on the device.
pub struct MoeDev {
    /// (n_experts, dim)
    pub router: DevMatrix,
    /// (n_experts * expert_ffn_dim, dim): expert e's rows from e * expert_ffn_dim
    pub gate: DevMatrix,
    pub up: DevMatrix,
    /// (n_experts * dim, expert_ffn_dim)
    pub down: DevMatrix,
    pub n_experts: usize,
    pub n_used: usize,
    pub norm_top_k: bool,
}

impl MoeDev {
    pub fn upload(gpu: &Gpu, m: &MoeWeights) -> Result<Self> {
        let gate = DevMatrix::upload_stack(gpu, &m.gate)?;
        let up = DevMatrix::upload_stack(gpu, &m.up)?;
        if gate.kind != up.kind {
            return Err(CudaError::Unsupported(format!(
                "experts whose gate ({:?}) and up ({:?}) differ in type",
                gate.kind, up.kind
            )));
        }
        Ok(Self {
            router: DevMatrix::upload(gpu, &m.router)?,
            gate,
            up,
            down: DevMatrix::upload_stack(gpu, &m.down)?,
            n_experts: m.gate.len(),
            n_used: m.n_used,
            norm_top_k: m.norm_top_k,
        })
    }

    /// The launches' shape, with `stack`'s type (the gate / up stacks', or the down stack's).
    fn shape(&self, stack: &DevMatrix) -> Experts {
        Experts {
            kind: stack.kind,
            n_exp: self.n_experts,
            eff: self.down.cols,
            dim: self.gate.cols,
            k: self.n_used,
        }
    }
}

/// Refuses the mixtures the kernels cannot run, before any weight is uploaded.
pub fn check_config(m: &MoeConfig, max_batch: usize) -> Result<()> {
    if m.n_experts > MAX_EXPERTS || m.n_used > MAX_USED {
        return Err(CudaError::Unsupported(format!(
            "{} experts with {} used a token (up to {MAX_EXPERTS} and {MAX_USED} on the GPU)",
            m.n_experts, m.n_used
        )));
    }
    // a launch's routes are its grid's y (at most 65,535)
    if max_batch * m.n_used > 65_535 {
        return Err(CudaError::Unsupported(format!(
            "steps of {max_batch} tokens with {} routes each",
            m.n_used
        )));
    }
    Ok(())
}

/// The step's buffers of a mixture: router logits, routes, each route's SwiGLU output, and the
/// 8-bit copies the expert kernels read (the tokens' normed rows past the mat-vecs' size, the
/// routes' SwiGLU rows). Sized for `max_batch` tokens; 16-byte placeholders for other models.
pub struct MoeBufs {
    pub router: DevBuf,
    pub ids: DevBuf,
    pub wts: DevBuf,
    /// Per token, the smallest router margin of the step (`moe_route`; [`CudaModel::route_margins`]).
    pub margin: DevBuf,
    pub ffn: DevBuf,
    pub hq: DevBuf,
    pub hd: DevBuf,
    pub fq: DevBuf,
    pub fd: DevBuf,
    /// The grouped steps' ([`Groups`]): slots' routes, tiles, the slots' 8-bit activations, the
    /// routes' up rows and down rows.
    pub slot_route: DevBuf,
    pub tiles: DevBuf,
    pub gq: DevBuf,
    pub gd: DevBuf,
    pub up: DevBuf,
    pub y: DevBuf,
}

impl MoeBufs {
    /// Bytes of each buffer, in field order.
    fn sizes(cfg: &ModelConfig, t: usize) -> [usize; 15] {
        let Some(m) = &cfg.moe else {
            return [0; 15];
        };
        let routes = t * m.n_used;
        let ffn = routes * m.expert_ffn_dim;
        let [slot_route, tiles, gq, gd, up, y] = if t > MATVEC_MAX {
            Groups::sizes(routes, m.n_experts, cfg.dim, m.expert_ffn_dim)
        } else {
            [0; 6]
        };
        [
            4 * t * m.n_experts,
            4 * routes,
            4 * routes,
            4 * t,
            4 * ffn,
            t * cfg.dim,
            8 * t * cfg.dim.div_ceil(32),
            ffn,
            8 * ffn.div_ceil(32),
            slot_route,
            tiles,
            gq,
            gd,
            up,
            y,
        ]
    }

    pub fn bytes_for(cfg: &ModelConfig, max_batch: usize) -> u64 {
        Self::sizes(cfg, max_batch).iter().sum::<usize>() as u64
    }

    pub fn new(gpu: &Gpu, cfg: &ModelConfig, max_batch: usize) -> Result<Self> {
        let [router, ids, wts, margin, ffn, hq, hd, fq, fd, slot_route, tiles, gq, gd, up, y] =
            Self::sizes(cfg, max_batch);
        Ok(Self {
            router: gpu.alloc(router)?,
            ids: gpu.alloc(ids)?,
            wts: gpu.alloc(wts)?,
            margin: gpu.alloc(margin)?,
            ffn: gpu.alloc(ffn)?,
            hq: gpu.alloc(hq)?,
            hd: gpu.alloc(hd)?,
            fq: gpu.alloc(fq)?,
            fd: gpu.alloc(fd)?,
            slot_route: gpu.alloc(slot_route)?,
            tiles: gpu.alloc(tiles)?,
            gq: gpu.alloc(gq)?,
            gd: gpu.alloc(gd)?,
            up: gpu.alloc(up)?,
            y: gpu.alloc(y)?,
        })
    }

    /// The grouped steps' buffers.
    pub(crate) fn groups(&self) -> Groups {
        Groups {
            slot_route: self.slot_route.ptr,
            tiles: self.tiles.ptr,
            q: self.gq.ptr,
            d: self.gd.ptr,
            up: self.up.ptr,
            y: self.y.ptr,
        }
    }
}

/// Slots a tile of the grouped kernels may take (`moe_mmq_<type>_<slots / 8>`).
const TILES: [usize; 3] = [8, 16, 32];

/// Slots of `routes` routes over `n_exp` experts with each expert's padded to tiles of `tw`:
/// the worst case (every expert's last tile one route), a multiple of `tw`.
fn slots(routes: usize, n_exp: usize, tw: usize) -> usize {
    (routes + n_exp * (tw - 1)).next_multiple_of(tw)
}

/// Device buffers of a grouped step: `slot_route` (a route a slot, -1 for padding), `tiles`
/// (expert, first slot, end slot, 0), the slots' activations in the mat-mat's layout (`q`,
/// `d`), the routes' up rows (`up`: routes x eff) and down rows (`y`: routes x dim).
pub(crate) struct Groups {
    pub slot_route: u64,
    pub tiles: u64,
    pub q: u64,
    pub d: u64,
    pub up: u64,
    pub y: u64,
}

impl Groups {
    /// Buffers of [`Groups::sizes`] (the owners, to keep while the pointers are used) and
    /// their pointers: the op harness's and `--perf`'s.
    pub(crate) fn alloc(
        gpu: &Gpu,
        routes: usize,
        n_exp: usize,
        dim: usize,
        eff: usize,
    ) -> Result<([DevBuf; 6], Self)> {
        let [a, b, c, d, e, f] = Self::sizes(routes, n_exp, dim, eff).map(|n| gpu.alloc(n));
        let bufs = [a?, b?, c?, d?, e?, f?];
        let g = Self {
            slot_route: bufs[0].ptr,
            tiles: bufs[1].ptr,
            q: bufs[2].ptr,
            d: bufs[3].ptr,
            up: bufs[4].ptr,
            y: bufs[5].ptr,
        };
        Ok((bufs, g))
    }

    /// Bytes of each buffer (field order) for up to `routes` routes over `n_exp` experts of
    /// `eff` x `dim`: the widest tile has the most slots, the narrowest the most tiles.
    pub(crate) fn sizes(routes: usize, n_exp: usize, dim: usize, eff: usize) -> [usize; 6] {
        let (narrowest, widest) = (TILES[0], TILES[TILES.len() - 1]);
        let n = slots(routes, n_exp, widest);
        let wide = dim.max(eff);
        [
            4 * n,
            16 * slots(routes, n_exp, narrowest) / narrowest,
            n * wide,
            8 * n * wide.div_ceil(32),
            4 * routes * eff,
            4 * routes * dim,
        ]
    }
}

/// The shape of a layer's expert launches: the stacks' type, experts, rows of one expert's
/// gate / up (`eff`), the model's width (`dim`) and routes a token (`k`).
#[derive(Clone, Copy)]
pub(crate) struct Experts {
    pub kind: Kind,
    pub n_exp: usize,
    pub eff: usize,
    pub dim: usize,
    pub k: usize,
}

/// Activation rows as the expert kernels read them: int8 blocks (`q`, `d`: the quantized
/// types; 0 for F32 / F16) and the f32 rows (`f`).
pub(crate) struct Acts {
    pub q: u64,
    pub d: u64,
    pub f: u64,
}

/// The routes of `tokens` tokens from their router logits (`moe_route`) into `ids` / `wts`
/// (`tokens * k` each) and `margin` (one a token; `first`: this layer starts it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_route(
    gpu: &mut Gpu,
    logits: u64,
    n_exp: usize,
    k: usize,
    norm: bool,
    (ids, wts, margin): (u64, u64, u64),
    first: bool,
    tokens: usize,
) -> Result<()> {
    let f = gpu.func("moe_route")?;
    let (ne, k, norm, first) = (n_exp as i32, k as i32, norm as i32, first as i32);
    // SAFETY: logits holds tokens x n_exp floats; ids / wts tokens x k entries, margin tokens.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&logits)
            .arg(&ne)
            .arg(&k)
            .arg(&norm)
            .arg(&ids)
            .arg(&wts)
            .arg(&margin)
            .arg(&first)
            .launch(cfg((tokens as u32, 1, 1), 32))?;
    }
    Ok(())
}

impl Experts {
    /// Slots a tile when a step of `t` tokens groups its routes by expert: steps of more than
    /// [`MATVEC_MAX`] tokens over quantized stacks whose experts' rows come in 16s (a tile's
    /// row block stays in one expert); the tile about the routes an expert expects (8, 16 or
    /// 32). None: the mat-vecs a route.
    pub(crate) fn tile(&self, t: usize) -> Option<usize> {
        if t <= MATVEC_MAX
            || !self.kind.int8_activations()
            || !self.eff.is_multiple_of(16)
            || !self.dim.is_multiple_of(16)
        {
            return None;
        }
        let per_expert = (t * self.k).div_ceil(self.n_exp);
        TILES
            .into_iter()
            .find(|&tw| per_expert <= tw)
            .or(Some(TILES[TILES.len() - 1]))
    }

    /// `moe_sort`: the `tokens * k` routes in `ids` into slots by expert, tiles of `tw`.
    fn sort(&self, gpu: &mut Gpu, ids: u64, g: &Groups, tw: usize, tokens: usize) -> Result<()> {
        let routes = tokens * self.k;
        let n = slots(routes, self.n_exp, tw);
        let f = gpu.func("moe_sort")?;
        let (r, ne, twi, ni, nt) = (
            routes as i32,
            self.n_exp as i32,
            tw as i32,
            n as i32,
            (n / tw) as i32,
        );
        // SAFETY: ids holds `routes` experts below n_exp; slot_route n slots and tiles n / tw
        // entries (MoeBufs sizes them for the widest and the narrowest tile).
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&ids)
                .arg(&r)
                .arg(&ne)
                .arg(&twi)
                .arg(&ni)
                .arg(&nt)
                .arg(&g.slot_route)
                .arg(&g.tiles)
                .launch(cfg((1, 1, 1), 1024))?;
        }
        Ok(())
    }

    /// `moe_gather_q`: row `p / div` of `x` (`cols` wide) for each slot's route p into the
    /// mat-mat's 8-bit layout.
    fn gather(
        &self,
        gpu: &mut Gpu,
        x: u64,
        g: &Groups,
        div: usize,
        cols: usize,
        n: usize,
    ) -> Result<()> {
        let f = gpu.func("moe_gather_q")?;
        let (divi, ci, ni) = (div as i32, cols as i32, n as i32);
        // SAFETY: x holds the rows the routes name, `cols` wide; q / d n slots of cols.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&x)
                .arg(&g.slot_route)
                .arg(&divi)
                .arg(&g.q)
                .arg(&g.d)
                .arg(&ci)
                .arg(&ni)
                .launch(cfg((n as u32, cols.div_ceil(256) as u32, 1), 256))?;
        }
        Ok(())
    }

    /// `moe_mmq_<kind>_<tw / 8>`: each slot's row of `stack` (experts of `rows` x `cols`)
    /// products into its route's row of `out` (`rows` wide).
    #[allow(clippy::too_many_arguments)]
    fn mmq(
        &self,
        gpu: &mut Gpu,
        stack: u64,
        (rows, cols): (usize, usize),
        g: &Groups,
        tw: usize,
        n: usize,
        out: u64,
    ) -> Result<()> {
        let nj = tw / 8;
        let f = gpu.func(&format!("moe_mmq_{}_{nj}", self.kind.name()))?;
        let warps = if nj == 1 { 8 } else { 4 };
        let (ri, ne, ci, ni) = (rows as i32, self.n_exp as i32, cols as i32, n as i32);
        // SAFETY: the stack holds n_exp x rows rows of cols; q / d n slots; tiles n / tw entries
        // of experts below n_exp and slots below n; out a row of `rows` for each route a slot
        // names.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&stack)
                .arg(&ri)
                .arg(&ne)
                .arg(&ci)
                .arg(&g.q)
                .arg(&g.d)
                .arg(&ni)
                .arg(&g.tiles)
                .arg(&g.slot_route)
                .arg(&out)
                .launch(cfg(((rows / 16) as u32, (n / tw) as u32, 1), 32 * warps))?;
        }
        Ok(())
    }

    /// The grouped gate / up: routes sorted by expert (`ids`), the tokens' rows of `x`
    /// gathered, both products, SwiGLU into `out` (the routes' rows of eff). `tw`: from
    /// [`Experts::tile`]; the sort stays for [`Experts::down_grouped`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gate_up_grouped(
        &self,
        gpu: &mut Gpu,
        (gate, up): (u64, u64),
        ids: u64,
        x: u64,
        g: &Groups,
        out: u64,
        (tw, tokens): (usize, usize),
    ) -> Result<()> {
        let n = slots(tokens * self.k, self.n_exp, tw);
        self.sort(gpu, ids, g, tw, tokens)?;
        self.gather(gpu, x, g, self.k, self.dim, n)?;
        let shape = (self.eff, self.dim);
        self.mmq(gpu, gate, shape, g, tw, n, out)?;
        self.mmq(gpu, up, shape, g, tw, n, g.up)?;
        swiglu(gpu, out, g.up, (tokens * self.k * self.eff) as u64)
    }

    /// The grouped down: the routes' SwiGLU rows `ffn` gathered in the slots
    /// [`Experts::gate_up_grouped`] sorted, each route's down row, and `moe_combine` adding the
    /// token's routes, weighted by `wts`, into its row of `x`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn down_grouped(
        &self,
        gpu: &mut Gpu,
        down: u64,
        wts: u64,
        ffn: u64,
        g: &Groups,
        x: u64,
        (tw, tokens): (usize, usize),
    ) -> Result<()> {
        let n = slots(tokens * self.k, self.n_exp, tw);
        self.gather(gpu, ffn, g, 1, self.eff, n)?;
        self.mmq(gpu, down, (self.dim, self.eff), g, tw, n, g.y)?;
        let f = gpu.func("moe_combine")?;
        let (k, d) = (self.k as i32, self.dim as i32);
        // SAFETY: y and wts hold tokens x k routes (rows of dim), x tokens rows of dim.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&g.y)
                .arg(&wts)
                .arg(&k)
                .arg(&d)
                .arg(&x)
                .launch(cfg((self.dim.div_ceil(256) as u32, tokens as u32, 1), 256))?;
        }
        Ok(())
    }

    /// `moe_gate_up_<kind>`: each of the `tokens * k` routes' SwiGLU rows into `out`.
    pub(crate) fn gate_up(
        &self,
        gpu: &mut Gpu,
        (gate, up): (u64, u64),
        ids: u64,
        x: &Acts,
        out: u64,
        tokens: usize,
    ) -> Result<()> {
        let f = gpu.func(&format!("moe_gate_up_{}", self.kind.name()))?;
        let (e, c, n, k) = (
            self.eff as i32,
            self.dim as i32,
            self.n_exp as i32,
            self.k as i32,
        );
        let grid = (self.eff.div_ceil(4) as u32, (tokens * self.k) as u32, 1);
        // SAFETY: the stacks hold n_exp x eff rows of dim; x tokens rows; out tokens x k rows
        // of eff; ids tokens x k experts below n_exp.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&gate)
                .arg(&up)
                .arg(&e)
                .arg(&c)
                .arg(&n)
                .arg(&ids)
                .arg(&k)
                .arg(&x.q)
                .arg(&x.d)
                .arg(&x.f)
                .arg(&out)
                .launch(cfg(grid, 128))?;
        }
        Ok(())
    }

    /// `moe_down_<kind>`: each token's routes' down projections of `ffn`, weighted by `wts`,
    /// added into its row of `x`.
    pub(crate) fn down(
        &self,
        gpu: &mut Gpu,
        down: u64,
        (ids, wts): (u64, u64),
        ffn: &Acts,
        x: u64,
        tokens: usize,
    ) -> Result<()> {
        let f = gpu.func(&format!("moe_down_{}", self.kind.name()))?;
        let (d, e, n, k) = (
            self.dim as i32,
            self.eff as i32,
            self.n_exp as i32,
            self.k as i32,
        );
        // SAFETY: the stack holds n_exp x dim rows of eff; ffn tokens x k rows of eff; x tokens
        // rows of dim.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&down)
                .arg(&d)
                .arg(&e)
                .arg(&n)
                .arg(&ids)
                .arg(&wts)
                .arg(&k)
                .arg(&ffn.q)
                .arg(&ffn.d)
                .arg(&ffn.f)
                .arg(&x)
                .launch(cfg((self.dim.div_ceil(4) as u32, tokens as u32, 1), 128))?;
        }
        Ok(())
    }
}

impl CudaModel {
    /// Per token of the last pass: the smallest gap, in router logits, between the last expert
    /// a route took and the next one, over its layers (infinite when every expert is used;
    /// empty for models without experts). A check that finds the GPU and a reference apart
    /// from some position on reads here whether a routing near-tie explains it.
    pub fn route_margins(&mut self) -> Result<Vec<f32>> {
        if self.config.moe.is_none() {
            return Ok(Vec::new());
        }
        self.gpu.bind()?;
        self.gpu.stream.synchronize()?;
        let mut margins = vec![0f32; self.step.t];
        self.gpu.read(self.scratch.moe.margin.ptr, &mut margins)?;
        Ok(margins)
    }
}

impl MoeOps for CudaModel {
    fn moe_route(&mut self, layer: usize, logits: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let (ne, k, norm) = (m.n_experts, m.n_used, m.norm_top_k);
        // the step's first routed layer starts the margins
        let first = (0..layer).all(|l| self.moe(l).is_err());
        let (lp, n) = self.buf(logits);
        let t = self.rows(logits);
        if n != ne {
            return Err(CudaError::Other(format!(
                "router logits of {n} experts for a layer of {ne}"
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let b = &self.scratch.moe;
        let out = (b.ids.ptr, b.wts.ptr, b.margin.ptr);
        launch_route(&mut self.gpu, lp, ne, k, norm, out, first, t)
    }

    fn expert_swiglu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let e = m.shape(&m.gate);
        let stacks = (m.gate.buf.ptr, m.up.buf.ptr);
        let (xp, xn) = self.buf(x);
        let (op, on) = self.buf(out);
        if xn != e.dim || on != e.eff || m.up.kind != e.kind {
            return Err(CudaError::Other(format!(
                "experts of [{}, {}] against rows of {xn} -> {on}",
                e.eff, e.dim
            )));
        }
        let t = self.rows(x);
        if t == 0 {
            return Ok(());
        }
        let ids = self.scratch.moe.ids.ptr;
        if let Some(tw) = e.tile(t) {
            let g = self.scratch.moe.groups();
            e.gate_up_grouped(&mut self.gpu, stacks, ids, xp, &g, op, (tw, t))?;
            self.wrote(out);
            return Ok(());
        }
        let (q, d) = if !e.kind.int8_activations() {
            (0, 0)
        } else if t <= MATVEC_MAX {
            // the norm's 8-bit copy, where it already is
            self.quantize(x)?;
            (self.scratch.xq.ptr, self.scratch.xd.ptr)
        } else {
            let (hq, hd) = (self.scratch.moe.hq.ptr, self.scratch.moe.hd.ptr);
            quantize_rows(&mut self.gpu, xp, hq, hd, t, e.dim)?;
            (hq, hd)
        };
        e.gate_up(&mut self.gpu, stacks, ids, &Acts { q, d, f: xp }, op, t)?;
        self.wrote(out);
        Ok(())
    }

    fn expert_down_add(&mut self, layer: usize, ffn: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let e = m.shape(&m.down);
        let dp = m.down.buf.ptr;
        let (fp, fnn) = self.buf(ffn);
        let (xp, xn) = self.buf(out);
        if fnn != e.eff || xn != e.dim {
            return Err(CudaError::Other(format!(
                "experts' down of [{}, {}] against rows of {fnn} -> {xn}",
                e.dim, e.eff
            )));
        }
        let t = self.rows(out);
        if t == 0 {
            return Ok(());
        }
        let wts = self.scratch.moe.wts.ptr;
        if let Some(tw) = e.tile(t) {
            let g = self.scratch.moe.groups();
            e.down_grouped(&mut self.gpu, dp, wts, fp, &g, xp, (tw, t))?;
            self.wrote(out);
            return Ok(());
        }
        let (q, d) = if e.kind.int8_activations() {
            let (fq, fd) = (self.scratch.moe.fq.ptr, self.scratch.moe.fd.ptr);
            quantize_rows(&mut self.gpu, fp, fq, fd, t * e.k, e.eff)?;
            (fq, fd)
        } else {
            (0, 0)
        };
        let routes = (self.scratch.moe.ids.ptr, wts);
        e.down(&mut self.gpu, dp, routes, &Acts { q, d, f: fp }, xp, t)?;
        self.wrote(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experts(kind: Kind, n_exp: usize, eff: usize, dim: usize, k: usize) -> Experts {
        Experts {
            kind,
            n_exp,
            eff,
            dim,
            k,
        }
    }

    #[test]
    fn long_quantized_steps_group_their_routes() {
        let e = experts(Kind::Q4K, 128, 768, 2048, 8);
        assert_eq!(e.tile(1), None);
        assert_eq!(e.tile(MATVEC_MAX), None);
        // 16 tokens: 128 routes, one an expert; 512 tokens: 32 an expert
        assert_eq!(e.tile(16), Some(8));
        assert_eq!(e.tile(256), Some(16));
        assert_eq!(e.tile(512), Some(32));
        assert_eq!(e.tile(4096), Some(32));
        // float stacks and rows not in 16s stay on the mat-vecs
        assert_eq!(experts(Kind::F32, 128, 768, 2048, 8).tile(512), None);
        assert_eq!(experts(Kind::Q8_0, 8, 40, 64, 2).tile(512), None);
    }

    #[test]
    fn the_buffers_hold_every_tile_choice() {
        for (n_exp, k) in [(8usize, 2usize), (128, 8), (512, 10)] {
            let e = experts(Kind::Q4K, n_exp, 768, 2048, k);
            for max_batch in [9usize, 64, 512] {
                let [slot_route, tiles, gq, ..] = Groups::sizes(max_batch * k, n_exp, 2048, 768);
                for t in MATVEC_MAX + 1..=max_batch {
                    let tw = e.tile(t).expect("grouped");
                    let n = slots(t * k, n_exp, tw);
                    assert_eq!(n % tw, 0);
                    assert!(4 * n <= slot_route && 16 * (n / tw) <= tiles && n * 2048 <= gq);
                }
            }
        }
    }
}
