//! A mixture-of-experts FFN (Qwen3-MoE): a router scores every expert for each token, the
//! token goes through its top-k SwiGLU experts, and their outputs are summed with the router's
//! (renormalized) weights.
//!
//! Data flow of one step over `T` tokens:
//! `h = norm(x)` -> router logits `[T, n_experts]` -> top-k per token -> tokens grouped by
//! expert -> for every expert hit, its tokens' rows of `h` through gate/up (one pool job for all
//! experts) and down (one more) -> `x[t] += sum_j w_j * out_{e_j}[t]`, in top-k order.
//! Decode (one token) reads only its k experts' rows; prefill reads each expert hit once for
//! all the tokens routed to it, and continuous batching groups tokens of every sequence alike.

use crate::config::{ModelConfig, MoeConfig};
use crate::layers::Ctx;
use crate::ops;
use crate::tap::tap;
use crate::weights::{TensorStore, Weight};
use crate::ModelError;

pub struct MoeWeights {
    pub norm: Vec<f32>,    // (dim)
    pub router: Weight,    // ffn_gate_inp (n_experts, dim)
    pub gate: Vec<Weight>, // ffn_gate_exps, per expert (expert_ffn_dim, dim)
    pub up: Vec<Weight>,   // ffn_up_exps, per expert (expert_ffn_dim, dim)
    pub down: Vec<Weight>, // ffn_down_exps, per expert (dim, expert_ffn_dim)
    pub n_used: usize,
    pub norm_top_k: bool,
}

impl MoeWeights {
    /// Layer `i`'s router and experts, with its input norm `norm` already loaded.
    pub fn load(
        store: &TensorStore,
        cfg: &ModelConfig,
        m: &MoeConfig,
        i: usize,
        norm: Vec<f32>,
    ) -> Result<Self, ModelError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (dim, eff, ne) = (cfg.dim, m.expert_ffn_dim, m.n_experts);
        Ok(Self {
            norm,
            router: store.matrix(&n("ffn_gate_inp.weight"), ne, dim)?,
            gate: store.experts(&n("ffn_gate_exps"), ne, eff, dim)?,
            up: store.experts(&n("ffn_up_exps"), ne, eff, dim)?,
            down: store.experts(&n("ffn_down_exps"), ne, dim, eff)?,
            n_used: m.n_used,
            norm_top_k: m.norm_top_k,
        })
    }

    pub fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        let mut v = vec![&mut self.router];
        v.extend(self.gate.iter_mut());
        v.extend(self.up.iter_mut());
        v.extend(self.down.iter_mut());
        v
    }

    pub fn matrices(&self) -> Vec<&Weight> {
        let mut v = vec![&self.router];
        v.extend(self.gate.iter());
        v.extend(self.up.iter());
        v.extend(self.down.iter());
        v
    }

    /// The router plus `n_used` average experts: what one decoded token reads.
    pub fn bytes_per_token(&self) -> u64 {
        let experts: u64 = [&self.gate, &self.up, &self.down]
            .iter()
            .flat_map(|ws| ws.iter())
            .map(|w| w.bytes().len() as u64)
            .sum();
        let n = self.gate.len().max(1) as u64;
        self.router.bytes().len() as u64 + experts * self.n_used as u64 / n
    }
}

/// One token's choice: expert index and its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// Top-`k` experts of each token from router logits `[T, n_experts]`: softmax over all
/// experts, the `k` largest probabilities (ties to the lower index), renormalized to sum to 1
/// when `norm`. Returns `T * k` routes, each token's in descending order.
pub fn route(logits: &[f32], n_experts: usize, k: usize, norm: bool) -> Vec<Route> {
    let mut routes = Vec::with_capacity(logits.len() / n_experts.max(1) * k);
    let mut probs = vec![0f32; n_experts];
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    for row in logits.chunks_exact(n_experts) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        for p in probs.iter_mut() {
            *p /= sum;
        }
        order.clear();
        order.extend(0..n_experts);
        // stable: equal probabilities keep the lower index first
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = &order[..k];
        let total: f32 = top.iter().map(|&e| probs[e]).sum();
        // llama.cpp clamps the sum away from zero before dividing
        let scale = if norm {
            1.0 / total.max(6.103_515_6e-5)
        } else {
            1.0
        };
        routes.extend(top.iter().map(|&e| Route {
            expert: e,
            weight: probs[e] * scale,
        }));
    }
    routes
}

/// `x += moe(norm(x))` over the step's `T` tokens.
pub fn forward(ctx: &Ctx, m: &MoeWeights, layer: usize, x: &mut [f32]) -> Result<(), ModelError> {
    let dim = ctx.cfg.dim;
    let t_len = x.len() / dim;
    let n_experts = m.gate.len();
    let k = m.n_used;
    let mut h = vec![0f32; x.len()];
    ops::rms_norm_into(x, &m.norm, ctx.cfg.rms_eps, &mut h);
    tap("ffn_norm", layer, &h);
    let logits = ctx.matmul(&m.router, &h)?;
    tap("ffn_moe_logits", layer, &logits);
    let routes = route(&logits, n_experts, k, m.norm_top_k);

    // tokens by expert: `members[e]` lists (token, slot j of its top-k)
    let mut members: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_experts];
    for (i, r) in routes.iter().enumerate() {
        members[r.expert].push((i / k, i % k));
    }
    let hit: Vec<usize> = (0..n_experts).filter(|&e| !members[e].is_empty()).collect();
    let inputs: Vec<Vec<f32>> = hit
        .iter()
        .map(|&e| {
            let rows = members[e].iter();
            rows.flat_map(|&(t, _)| h[t * dim..(t + 1) * dim].iter().copied())
                .collect()
        })
        .collect();

    // gate and up of every expert hit, one job
    let eff = m.gate.first().map_or(0, |w| w.rows);
    let mut gates: Vec<Vec<f32>> = hit
        .iter()
        .map(|&e| vec![0f32; members[e].len() * eff])
        .collect();
    let mut ups = gates.clone();
    {
        let mut jobs = Vec::with_capacity(2 * hit.len());
        for (((&e, x_e), g), u) in hit.iter().zip(&inputs).zip(&mut gates).zip(&mut ups) {
            jobs.push(ops::MatJob {
                w: &m.gate[e],
                x: x_e,
                out: g,
            });
            jobs.push(ops::MatJob {
                w: &m.up[e],
                x: x_e,
                out: u,
            });
        }
        ops::matmul_grouped(ctx.pool, ctx.path, &mut jobs)?;
    }
    for (g, u) in gates.iter_mut().zip(&ups) {
        for (gr, ur) in g.chunks_exact_mut(eff).zip(u.chunks_exact(eff)) {
            crate::vexp::swiglu_row(gr, ur);
        }
    }
    // down of every expert hit, one job
    let mut outs: Vec<Vec<f32>> = hit
        .iter()
        .map(|&e| vec![0f32; members[e].len() * dim])
        .collect();
    {
        let mut jobs: Vec<ops::MatJob> = hit
            .iter()
            .zip(&gates)
            .zip(&mut outs)
            .map(|((&e, g), o)| ops::MatJob {
                w: &m.down[e],
                x: g,
                out: o,
            })
            .collect();
        ops::matmul_grouped(ctx.pool, ctx.path, &mut jobs)?;
    }

    // weighted sum per token in top-k order, then the residual add
    let mut src: Vec<(usize, usize)> = vec![(0, 0); t_len * k]; // (hit index, row) of token t's slot j
    for (hi, &e) in hit.iter().enumerate() {
        for (row, &(t, j)) in members[e].iter().enumerate() {
            src[t * k + j] = (hi, row);
        }
    }
    let mut sum = vec![0f32; dim];
    for t in 0..t_len {
        sum.fill(0.0);
        for j in 0..k {
            let (hi, row) = src[t * k + j];
            let w = routes[t * k + j].weight;
            for (s, &o) in sum.iter_mut().zip(&outs[hi][row * dim..(row + 1) * dim]) {
                *s += w * o;
            }
        }
        ops::add_in_place(&mut x[t * dim..(t + 1) * dim], &sum);
    }
    tap("l_out", layer, x);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_pick_the_top_k_and_renormalize() {
        // token 0 prefers 2 then 0; token 1 prefers 1 then 3
        let logits = [1.0, -1.0, 3.0, 0.0, /**/ 0.0, 2.0, -3.0, 1.5];
        let r = route(&logits, 4, 2, true);
        let picked: Vec<usize> = r.iter().map(|r| r.expert).collect();
        assert_eq!(picked, [2, 0, 1, 3]);
        for pair in r.chunks(2) {
            let s: f32 = pair.iter().map(|r| r.weight).sum();
            assert!((s - 1.0).abs() < 1e-6);
            assert!(pair[0].weight >= pair[1].weight);
        }
        // e^3 / (e^3 + e^1) for token 0's first choice
        let want = 3f32.exp() / (3f32.exp() + 1f32.exp());
        assert!((r[0].weight - want).abs() < 1e-6);
        // without renormalization the weights are the softmax probabilities
        let raw = route(&logits, 4, 2, false);
        let z: f32 = logits[..4].iter().map(|l| l.exp()).sum();
        assert!((raw[0].weight - 3f32.exp() / z).abs() < 1e-6);
    }

    #[test]
    fn equal_scores_go_to_the_lower_index() {
        let r = route(&[0.5, 0.5, 0.5], 3, 2, true);
        assert_eq!((r[0].expert, r[1].expert), (0, 1));
        assert!((r[0].weight - 0.5).abs() < 1e-6);
    }
}
