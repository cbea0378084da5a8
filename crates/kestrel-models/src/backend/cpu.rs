//! The CPU carrying out the shared recipes ([`super::dense`], [`super::moe`]) with the CPU
//! kernels of [`crate::ops`] and [`crate::attention`]: the reference any other backend of the
//! seam is compared with, step for step, and the proof that the recipe the GPU runs is the CPU's.
//! The serving path still runs the recipes of [`crate::recipes`] (same kernels, fused into
//! fewer thread-pool jobs); `tests/backend_seam.rs` checks both give the same logits.

use super::{dense, moe, Buf, MoeOps, Ops, Param, W};
use crate::attention::{causal_attention, TokenKv};
use crate::config::{Arch, ModelConfig, RopeLayout};
use crate::kv::{row_of, KvPool, KvType};
use crate::layers::{Ffn, LayerWeights};
use crate::model::{SeqStep, WantLogits};
use crate::ops::{self, MatmulPath, Rope};
use crate::pool::ThreadPool;
use crate::recipes;
use crate::weights::{TensorStore, Weight};
use crate::ModelError;

/// A dense or mixture model's weights and its KV pool, run through [`dense::forward`] or
/// [`moe::forward`].
pub struct CpuBackend {
    pub config: ModelConfig,
    weights: CpuWeights,
    pub kv: KvPool,
}

struct CpuWeights {
    layers: Vec<LayerWeights>,
    embed: Weight,          // (vocab, dim)
    output: Option<Weight>, // (vocab, dim); None when tied
    output_norm: Vec<f32>,  // (dim)
    pool: ThreadPool,
    path: MatmulPath,
    /// The dense family, or None for the mixture recipe (Qwen3-MoE).
    family: Option<dense::Family>,
}

impl CpuBackend {
    /// Loads a dense model from `store` (no repacking: the reference kernels read the file's
    /// blocks) with a pool of `n_blocks` blocks of `block_size` positions (f32 K/V).
    pub fn load(
        store: &TensorStore,
        config: ModelConfig,
        n_blocks: usize,
        block_size: usize,
        threads: usize,
        path: MatmulPath,
    ) -> Result<Self, ModelError> {
        let family = dense::Family::of(config.arch);
        let load_layer = match config.arch {
            Arch::Llama => recipes::llama::load_layer,
            Arch::Qwen2 => recipes::qwen2::load_layer,
            Arch::Qwen3 => recipes::qwen3::load_layer,
            Arch::Qwen3Moe => recipes::qwen3moe::load_layer,
            Arch::Qwen35 => {
                return Err(ModelError::Unsupported(format!(
                    "{} in the CPU backend of the seam",
                    config.arch.name()
                )))
            }
        };
        let layers = (0..config.n_layers)
            .map(|i| load_layer(store, &config, i))
            .collect::<Result<Vec<_>, _>>()?;
        let (v, d) = (config.vocab_size, config.dim);
        let output = if store.contains("output.weight") {
            Some(store.matrix("output.weight", v, d)?)
        } else {
            None
        };
        let c = &config;
        let kv = KvPool::new(
            c.n_kv_layers(),
            c.n_kv_heads,
            c.head_dim,
            n_blocks,
            block_size,
            KvType::F32,
        );
        Ok(Self {
            weights: CpuWeights {
                layers,
                embed: store.matrix("token_embd.weight", v, d)?,
                output,
                output_norm: recipes::output_norm(store, &config)?,
                pool: ThreadPool::new(threads),
                path,
                family,
            },
            kv,
            config,
        })
    }

    /// One step over several sequences' new tokens: the logits each asked for, in order.
    pub fn forward(&mut self, seqs: &[SeqStep]) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let bs = self.kv.block_size();
        let (mut tokens, mut positions, mut rows, mut tkv, mut picks) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for s in seqs {
            for (i, &tok) in s.tokens.iter().enumerate() {
                let pos = s.start + i;
                if tok as usize >= cfg.vocab_size {
                    return Err(ModelError::BadToken {
                        id: tok,
                        vocab: cfg.vocab_size,
                    });
                }
                if pos / bs >= s.blocks.len() {
                    return Err(ModelError::ContextFull {
                        needed: pos + 1,
                        capacity: s.blocks.len() * bs,
                    });
                }
                tokens.push(tok);
                positions.push(pos);
                rows.push(row_of(s.blocks, bs, pos));
                tkv.push(TokenKv {
                    pos,
                    blocks: s.blocks,
                    tiled: s.want == WantLogits::Verify,
                });
                if matches!(s.want, WantLogits::All | WantLogits::Verify) {
                    picks.push(tokens.len() - 1);
                }
            }
            if s.want == WantLogits::Last && !s.tokens.is_empty() {
                picks.push(tokens.len() - 1);
            }
        }
        let rope = Rope::new(
            &positions,
            cfg.rope_dim,
            cfg.rope_base,
            cfg.rope_layout == RopeLayout::NeoX,
        );
        let mut step = Step {
            cfg,
            w: &self.weights,
            kv: &mut self.kv,
            tokens,
            rows,
            tkv,
            picks,
            rope,
            bufs: Default::default(),
            routes: Vec::new(),
        };
        match self.weights.family {
            Some(f) => dense::forward(&mut step, cfg, f)?,
            None => moe::forward(&mut step, cfg)?,
        }
        Ok(std::mem::take(&mut step.bufs[slot(Buf::Logits)]))
    }
}

fn slot(b: Buf) -> usize {
    b as usize
}

/// One forward step's state: the step's tokens and the activation buffers.
struct Step<'a> {
    cfg: &'a ModelConfig,
    w: &'a CpuWeights,
    kv: &'a mut KvPool,
    tokens: Vec<u32>,
    rows: Vec<usize>,
    tkv: Vec<TokenKv<'a>>,
    picks: Vec<usize>,
    rope: Rope,
    bufs: [Vec<f32>; Buf::COUNT],
    /// The last `moe_route`'s choices, `n_used` a token.
    routes: Vec<crate::moe::Route>,
}

impl<'a> Step<'a> {
    fn matrix(&self, w: W) -> Result<&Weight, ModelError> {
        let ws = self.w;
        Ok(match w {
            W::Embed => &ws.embed,
            W::Output => ws.output.as_ref().unwrap_or(&ws.embed),
            W::Layer(l, p) => {
                let layer = ws
                    .layers
                    .get(l)
                    .ok_or_else(|| bad(format!("no layer {l}")))?;
                let a = layer.attention(l)?;
                match p {
                    Param::Wq => &a.wq,
                    Param::Wk => &a.wk,
                    Param::Wv => &a.wv,
                    Param::Wo => &a.wo,
                    Param::Gate => &layer.mlp(l)?.gate,
                    Param::Up => &layer.mlp(l)?.up,
                    Param::Down => &layer.mlp(l)?.down,
                    Param::MoeRouter => &self.experts(l)?.router,
                    other => return Err(bad(format!("{other:?} is not a matrix"))),
                }
            }
            W::OutputNorm => return Err(bad("output_norm is not a matrix".into())),
        })
    }

    fn vector(&self, w: W) -> Result<&[f32], ModelError> {
        let ws = self.w;
        let missing = |what: &str| bad(format!("this model has no {what}"));
        Ok(match w {
            W::OutputNorm => &ws.output_norm,
            W::Layer(l, p) => {
                let layer = ws
                    .layers
                    .get(l)
                    .ok_or_else(|| bad(format!("no layer {l}")))?;
                let a = layer.attention(l)?;
                let bias = a.bias.as_ref();
                let qk = a.qk_norm.as_ref();
                match p {
                    Param::AttnNorm => &a.norm,
                    Param::FfnNorm => match &layer.ffn {
                        Ffn::Dense(m) => &m.norm,
                        Ffn::Moe(m) => &m.norm,
                    },
                    Param::BiasQ => &bias.ok_or_else(|| missing("q bias"))?.q,
                    Param::BiasK => &bias.ok_or_else(|| missing("k bias"))?.k,
                    Param::BiasV => &bias.ok_or_else(|| missing("v bias"))?.v,
                    Param::QNorm => &qk.ok_or_else(|| missing("q norm"))?.q,
                    Param::KNorm => &qk.ok_or_else(|| missing("k norm"))?.k,
                    other => return Err(bad(format!("{other:?} is not a vector"))),
                }
            }
            other => return Err(bad(format!("{other:?} is not a vector"))),
        })
    }

    /// Layer `l`'s experts (borrowed from the weights, not the step).
    fn experts(&self, l: usize) -> Result<&'a crate::moe::MoeWeights, ModelError> {
        let w: &'a CpuWeights = self.w;
        match w.layers.get(l).map(|layer| &layer.ffn) {
            Some(Ffn::Moe(m)) => Ok(m),
            _ => Err(bad(format!("layer {l} has no experts"))),
        }
    }

    /// `w · x` for one row `x`.
    fn row_product(&self, w: &Weight, x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; w.rows];
        ops::matmul(&self.w.pool, self.w.path, w, x, &mut out)?;
        Ok(out)
    }

    fn product(&self, w: W, x: Buf) -> Result<Vec<f32>, ModelError> {
        let m = self.matrix(w)?;
        let xs = &self.bufs[slot(x)];
        let mut out = vec![0f32; xs.len() / m.cols.max(1) * m.rows];
        ops::matmul(&self.w.pool, self.w.path, m, xs, &mut out)?;
        Ok(out)
    }
}

fn bad(reason: String) -> ModelError {
    ModelError::BadParam {
        key: "backend step".into(),
        reason,
    }
}

impl Ops for Step<'_> {
    type Error = ModelError;

    fn embed(&mut self, out: Buf) -> Result<(), ModelError> {
        let dim = self.cfg.dim;
        let mut x = vec![0f32; self.tokens.len() * dim];
        for (t, &tok) in self.tokens.iter().enumerate() {
            self.w
                .embed
                .row_f32(tok as usize, &mut x[t * dim..(t + 1) * dim])?;
        }
        self.bufs[slot(out)] = x;
        Ok(())
    }

    fn rms_norm(&mut self, x: Buf, w: W, out: Buf) -> Result<(), ModelError> {
        let mut h = self.bufs[slot(x)].clone();
        ops::rms_norm(&mut h, self.vector(w)?, self.cfg.rms_eps);
        self.bufs[slot(out)] = h;
        Ok(())
    }

    fn head_norm(&mut self, x: Buf, w: W) -> Result<(), ModelError> {
        let mut v = std::mem::take(&mut self.bufs[slot(x)]);
        ops::rms_norm(&mut v, self.vector(w)?, self.cfg.rms_eps);
        self.bufs[slot(x)] = v;
        Ok(())
    }

    fn add_bias(&mut self, x: Buf, b: W) -> Result<(), ModelError> {
        let mut v = std::mem::take(&mut self.bufs[slot(x)]);
        ops::add_bias(&mut v, self.vector(b)?);
        self.bufs[slot(x)] = v;
        Ok(())
    }

    fn matmul(&mut self, w: W, x: Buf, out: Buf) -> Result<(), ModelError> {
        self.bufs[slot(out)] = self.product(w, x)?;
        Ok(())
    }

    fn matmul_add(&mut self, w: W, x: Buf, out: Buf) -> Result<(), ModelError> {
        let y = self.product(w, x)?;
        ops::add_in_place(&mut self.bufs[slot(out)], &y);
        Ok(())
    }

    fn gate_up_swiglu(&mut self, gate: W, up: W, x: Buf, out: Buf) -> Result<(), ModelError> {
        let mut g = self.product(gate, x)?;
        let u = self.product(up, x)?;
        let width = self.matrix(gate)?.rows;
        ops::swiglu(&self.w.pool, &mut g, &u, width);
        self.bufs[slot(out)] = g;
        Ok(())
    }

    fn rope(&mut self, x: Buf) -> Result<(), ModelError> {
        self.rope.apply(&mut self.bufs[slot(x)], self.cfg.head_dim);
        Ok(())
    }

    fn kv_write(&mut self, layer: usize, k: Buf, v: Buf) -> Result<(), ModelError> {
        let kv_dim = self.cfg.kv_dim();
        for (t, &row) in self.rows.iter().enumerate() {
            let span = t * kv_dim..(t + 1) * kv_dim;
            self.kv.write_row(
                layer,
                row,
                &self.bufs[slot(k)][span.clone()],
                &self.bufs[slot(v)][span],
            );
        }
        Ok(())
    }

    fn attention(&mut self, layer: usize, q: Buf, out: Buf) -> Result<(), ModelError> {
        let c = self.cfg;
        let mut att = vec![0f32; self.bufs[slot(q)].len()];
        causal_attention(
            &self.w.pool,
            self.kv,
            layer,
            &self.bufs[slot(q)],
            &self.tkv,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            &mut att,
        );
        self.bufs[slot(out)] = att;
        Ok(())
    }

    fn pick_rows(&mut self, x: Buf, out: Buf) -> Result<(), ModelError> {
        let dim = self.cfg.dim;
        let src = &self.bufs[slot(x)];
        let picked: Vec<f32> = self
            .picks
            .iter()
            .flat_map(|&t| src[t * dim..(t + 1) * dim].iter().copied())
            .collect();
        self.bufs[slot(out)] = picked;
        Ok(())
    }
}

impl MoeOps for Step<'_> {
    fn moe_route(&mut self, layer: usize, logits: Buf) -> Result<(), ModelError> {
        let m = self.experts(layer)?;
        self.routes = crate::moe::route(
            &self.bufs[slot(logits)],
            m.gate.len(),
            m.n_used,
            m.norm_top_k,
        );
        Ok(())
    }

    fn expert_swiglu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<(), ModelError> {
        let m = self.experts(layer)?;
        let (dim, k) = (self.cfg.dim, m.n_used);
        let mut rows = Vec::new();
        for (p, r) in self.routes.iter().enumerate() {
            let xt = &self.bufs[slot(x)][(p / k) * dim..(p / k + 1) * dim];
            let mut g = self.row_product(&m.gate[r.expert], xt)?;
            let u = self.row_product(&m.up[r.expert], xt)?;
            crate::vexp::swiglu_row(&mut g, &u);
            rows.extend(g);
        }
        self.bufs[slot(out)] = rows;
        Ok(())
    }

    fn expert_down_add(&mut self, layer: usize, ffn: Buf, out: Buf) -> Result<(), ModelError> {
        let m = self.experts(layer)?;
        let (dim, k) = (self.cfg.dim, m.n_used);
        let eff = m.down.first().map_or(0, |w| w.cols);
        let mut x = std::mem::take(&mut self.bufs[slot(out)]);
        let mut sum = vec![0f32; dim];
        for (t, xt) in x.chunks_exact_mut(dim).enumerate() {
            sum.fill(0.0);
            for p in t * k..(t + 1) * k {
                let r = *self.routes.get(p).ok_or_else(|| {
                    bad(format!("no route {p}: expert_down_add before moe_route"))
                })?;
                let f = &self.bufs[slot(ffn)][p * eff..(p + 1) * eff];
                let o = self.row_product(&m.down[r.expert], f)?;
                for (s, o) in sum.iter_mut().zip(o) {
                    *s += r.weight * o;
                }
            }
            ops::add_in_place(xt, &sum);
        }
        self.bufs[slot(out)] = x;
        Ok(())
    }
}
