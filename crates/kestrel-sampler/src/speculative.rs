//! Speculative sampling: checking a proposed token against the target model's distribution so
//! that the tokens kept are distributed exactly as plain sampling would give them
//! (Leviathan et al. 2023, Chen et al. 2023).
//!
//! For a proposal `x` drawn from a draft distribution `q` and the target's distribution `p`
//! (both after the whole sampling chain): keep `x` with probability `min(1, p(x) / q(x))`;
//! otherwise draw the replacement from `max(0, p - q)`, normalized. A proposal that was not
//! drawn (prompt lookup) has `q` one-hot at `x`: keep it with probability `p(x)`, else draw
//! from `p` without `x`. Greedy sampling keeps `x` exactly when it is the argmax, so greedy
//! speculative decoding gives plain greedy decoding's tokens.

use crate::processors::greedy;
use crate::weights::weight;
use crate::Sampler;

/// A next-token distribution after the sampling chain: `(id, probability)` pairs with
/// probability > 0, summing to 1. Greedy sampling gives one pair (the argmax, 1.0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Distribution {
    pub probs: Vec<(u32, f64)>,
}

impl Distribution {
    /// The probability of `id` (0 when absent).
    pub fn prob(&self, id: u32) -> f64 {
        self.probs
            .iter()
            .find(|&&(i, _)| i == id)
            .map_or(0.0, |&(_, p)| p)
    }
}

/// What became of a proposed token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The proposal stands.
    Accepted,
    /// The proposal is replaced by this token (and the proposals after it are dropped).
    Rejected(u32),
}

impl Sampler {
    /// The distribution [`Sampler::sample`] would draw from for these logits.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Distribution {
        let greedy = self.process(logits, history);
        let cands = self.candidates();
        if greedy {
            return Distribution {
                probs: greedy::argmax(cands)
                    .map(|id| (id, 1.0))
                    .into_iter()
                    .collect(),
            };
        }
        let max = cands.max_logit();
        if max == f32::NEG_INFINITY {
            return Distribution {
                probs: greedy::argmax(cands)
                    .map(|id| (id, 1.0))
                    .into_iter()
                    .collect(),
            };
        }
        let weights: Vec<(u32, f64)> = cands
            .as_slice()
            .iter()
            .map(|c| (c.id, weight(c.logit, max)))
            .filter(|&(_, w)| w > 0.0)
            .collect();
        let total: f64 = weights.iter().map(|&(_, w)| w).sum();
        Distribution {
            probs: weights.into_iter().map(|(id, w)| (id, w / total)).collect(),
        }
    }

    /// Draws a token from `d` with this sampler's RNG (a draft model's proposal).
    pub fn draw(&mut self, d: &Distribution) -> u32 {
        draw_weighted(d.probs.iter().copied(), self.rng()).unwrap_or(0)
    }

    /// Checks `proposed` against the target distribution of `logits` (`history`: the sequence
    /// before the proposed position). `draft` is the distribution the proposal was drawn from,
    /// `None` for a proposal that was not drawn (one-hot). Consumes the RNG only when sampling.
    pub fn verify(
        &mut self,
        logits: &[f32],
        history: &[u32],
        proposed: u32,
        draft: Option<&Distribution>,
    ) -> Verdict {
        let p = self.distribution(logits, history);
        if self.params().is_greedy() {
            let best = p.probs.first().map_or(0, |&(id, _)| id);
            return if best == proposed {
                Verdict::Accepted
            } else {
                Verdict::Rejected(best)
            };
        }
        let px = p.prob(proposed);
        let qx = draft.map_or(1.0, |q| q.prob(proposed));
        let u = self.rng().next_f64();
        if qx > 0.0 && u < (px / qx).min(1.0) {
            return Verdict::Accepted;
        }
        let q = |id: u32| match draft {
            Some(q) => q.prob(id),
            None => f64::from(u8::from(id == proposed)),
        };
        let residual = p.probs.iter().map(|&(id, pi)| (id, (pi - q(id)).max(0.0)));
        let replacement = draw_weighted(residual, self.rng())
            // p == q leaves nothing to correct: a draw from p is then exact.
            .or_else(|| draw_weighted(p.probs.iter().copied(), self.rng()))
            .unwrap_or(proposed);
        Verdict::Rejected(replacement)
    }
}

/// Draws an id with probability proportional to its weight; `None` when all weights are 0.
fn draw_weighted(
    weights: impl Iterator<Item = (u32, f64)> + Clone,
    rng: &mut crate::Xoshiro256StarStar,
) -> Option<u32> {
    let total: f64 = weights.clone().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return None;
    }
    let u = rng.next_f64() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (id, w) in weights {
        if w > 0.0 {
            acc += w;
            last = Some(id);
            if u < acc {
                return last;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;

    const LOGITS: [f32; 6] = [2.0, 1.5, 1.0, 0.2, -0.5, -3.0];

    fn sampler(seed: u64) -> Sampler {
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        Sampler::new(params, LOGITS.len()).expect("valid params")
    }

    fn histogram(draws: impl Iterator<Item = u32>, n: usize) -> Vec<f64> {
        let mut h = vec![0.0; n];
        let mut total = 0.0;
        for d in draws {
            h[d as usize] += 1.0;
            total += 1.0;
        }
        h.iter().map(|c| c / total).collect()
    }

    fn total_variation(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
    }

    #[test]
    fn greedy_keeps_exactly_the_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy(), LOGITS.len()).unwrap();
        assert_eq!(s.verify(&LOGITS, &[], 0, None), Verdict::Accepted);
        assert_eq!(s.verify(&LOGITS, &[], 2, None), Verdict::Rejected(0));
    }

    #[test]
    fn distribution_is_the_softmax_the_sampler_draws_from() {
        let mut s = sampler(1);
        let d = s.distribution(&LOGITS, &[]);
        let sum: f64 = d.probs.iter().map(|&(_, p)| p).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        let expected = (2.0f64 / 0.9).exp()
            / LOGITS
                .iter()
                .map(|&l| (f64::from(l) / 0.9).exp())
                .sum::<f64>();
        assert!(
            (d.prob(0) - expected).abs() < 1e-6,
            "{} vs {expected}",
            d.prob(0)
        );
    }

    /// The statistical check of the rule: over many trials, the token kept (the proposal or
    /// its replacement) is distributed as plain sampling from the target. Bound: total
    /// variation below 0.01 with 200,000 trials (the sampling noise is ~0.003).
    #[test]
    fn kept_tokens_follow_the_target_distribution() {
        const TRIALS: usize = 200_000;
        let mut s = sampler(7);
        let target = s.distribution(&LOGITS, &[]);
        let mut p = vec![0.0; LOGITS.len()];
        for &(id, pr) in &target.probs {
            p[id as usize] = pr;
        }
        // A draft that disagrees with the target: flatter, another favourite.
        let draft = Distribution {
            probs: vec![(0, 0.1), (1, 0.1), (2, 0.4), (3, 0.2), (4, 0.15), (5, 0.05)],
        };
        let mut proposer = sampler(99);
        let drafted = (0..TRIALS).map(|_| {
            let x = proposer.draw(&draft);
            match s.verify(&LOGITS, &[], x, Some(&draft)) {
                Verdict::Accepted => x,
                Verdict::Rejected(r) => r,
            }
        });
        let tv = total_variation(&histogram(drafted, LOGITS.len()), &p);
        assert!(tv < 0.01, "draft-model rule: total variation {tv}");

        // Lookup proposals are fixed tokens (one-hot drafts): always token 2 here.
        let looked_up = (0..TRIALS).map(|_| match s.verify(&LOGITS, &[], 2, None) {
            Verdict::Accepted => 2,
            Verdict::Rejected(r) => r,
        });
        let tv = total_variation(&histogram(looked_up, LOGITS.len()), &p);
        assert!(tv < 0.01, "lookup rule: total variation {tv}");
    }
}
