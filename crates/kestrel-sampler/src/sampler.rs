//! The per-request sampler running the default chain.

use crate::processors::{dist, greedy, MinP, Penalties, Temperature, TopK, TopP};
use crate::rng::{entropy_seed, Xoshiro256StarStar};
use crate::{Candidates, SamplerError, SamplingParams};

/// Samples tokens for one sequence. Holds the request's RNG and reusable
/// buffers, so one `Sampler` per request, called once per generated token.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Xoshiro256StarStar,
    cands: Candidates,
    scratch: Vec<u32>,
    /// The window's tokens with their penalized logits, by id (a step's; reused).
    penalized: Vec<(u32, f32)>,
}

impl Sampler {
    /// Validates `params` and sets up buffers for a vocabulary of
    /// `vocab_size` tokens. Without `params.seed` a random seed is drawn
    /// (see [`Sampler::seed`]).
    pub fn new(params: SamplingParams, vocab_size: usize) -> Result<Self, SamplerError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(entropy_seed);
        Ok(Sampler {
            params,
            seed,
            rng: Xoshiro256StarStar::seed_from_u64(seed),
            cands: Candidates::with_capacity(vocab_size),
            scratch: Vec::new(),
            penalized: Vec::new(),
        })
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed actually in use (the given one, or the random one drawn),
    /// so an unseeded request can be reproduced.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The same chain with a fresh RNG seeded by `seed` (a draft model's draws).
    pub fn reseeded(&self, seed: u64) -> Sampler {
        Sampler {
            seed,
            rng: Xoshiro256StarStar::seed_from_u64(seed),
            ..self.clone()
        }
    }

    /// Picks the next token from `logits` (one per vocabulary entry).
    /// `history` is the sequence so far, prompt plus generated tokens, used
    /// by the penalties.
    ///
    /// Order: penalties, then greedy argmax if temperature is 0 or top_k is
    /// 1, else top-k, top-p, min-p, temperature and a seeded draw. NaN
    /// logits count as `-inf`; empty `logits` give token 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.argmax_suffices() {
            // The chain would change nothing: the argmax straight over the logits, with no
            // candidate list built (a 248k vocabulary costs 2 MB of writes per token).
            return greedy::argmax_logits(logits).unwrap_or(0);
        }
        if self.draws_whole_row() {
            // Nothing truncates: the draw reads the row as the chain would leave it, without
            // a candidate for every entry (the same token, bit for bit; tested below).
            self.penalize(logits, history);
            let t = self.params.temperature;
            let row = dist::Scaled {
                logits,
                penalized: &self.penalized,
                inv_temperature: (t > 0.0 && t != 1.0).then(|| 1.0 / t),
            };
            return dist::sample_scaled(&row, &mut self.rng).unwrap_or(0);
        }
        let picked = if self.process(logits, history) {
            greedy::argmax(&self.cands)
        } else {
            dist::sample(&self.cands, &mut self.rng)
        };
        picked.unwrap_or(0)
    }

    /// Whether the chain keeps every token (no top-k, top-p or min-p; sampled): an OpenAI
    /// client's defaults.
    fn draws_whole_row(&self) -> bool {
        let p = &self.params;
        !p.is_greedy() && p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0
    }

    /// Whether [`Sampler::sample`] is the plain argmax of the logits (greedy, no penalties):
    /// then nothing else is read and no state changes, so the argmax may come from elsewhere
    /// (a GPU's, over the logits it holds).
    pub fn argmax_suffices(&self) -> bool {
        self.params.is_greedy() && !self.penalties().is_active()
    }

    /// Runs the chain up to the draw, leaving the candidates to draw from in `self.cands`;
    /// returns whether the pick is greedy (argmax, no draw).
    ///
    /// Where the chain keeps at most `k` tokens (a top-k, or the argmax), the list starts from
    /// the `k` best unpenalized logits and the penalized tokens ([`Candidates::fill_top`]):
    /// the same tokens in the same order come out of it as out of the whole vocabulary, for a
    /// pass over the logits that skips most of them (a 152k vocabulary: ~0.4 ms a token
    /// through a candidate for every entry).
    pub(crate) fn process(&mut self, logits: &[f32], history: &[u32]) -> bool {
        self.penalize(logits, history);
        let sparse = self
            .keeps_at_most()
            .is_some_and(|k| 4 * (k + self.penalized.len()) < logits.len());
        self.run_chain(logits, sparse)
    }

    /// How many tokens the chain keeps at most, if it truncates (top-k, or 1 for the argmax).
    fn keeps_at_most(&self) -> Option<usize> {
        let p = &self.params;
        match p.top_k {
            _ if p.is_greedy() => Some(1),
            0 => None,
            k => Some(k as usize),
        }
    }

    /// Fills `self.penalized` with the window's tokens and their penalized logits.
    fn penalize(&mut self, logits: &[f32], history: &[u32]) {
        let pen = self.penalties();
        self.penalized.clear();
        for (id, count) in pen.window_counts(history, &mut self.scratch) {
            if let Some(&l) = logits.get(id as usize) {
                let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
                self.penalized.push((id, pen.penalized(l, count)));
            }
        }
    }

    /// The chain after [`Sampler::penalize`], from the `k`-best list (`sparse`: only where
    /// [`Sampler::keeps_at_most`] gives a `k`) or from every token.
    fn run_chain(&mut self, logits: &[f32], sparse: bool) -> bool {
        let p = &self.params;
        if let (true, Some(k)) = (sparse, self.keeps_at_most()) {
            self.cands.fill_top(logits, k, &self.penalized);
        } else {
            self.cands.fill(logits);
            for &(id, l) in &self.penalized {
                if let Some(logit) = self.cands.logit_mut(id) {
                    *logit = l;
                }
            }
        }
        if p.is_greedy() {
            return true;
        }
        TopK(p.top_k as usize).apply(&mut self.cands);
        TopP(p.top_p).apply(&mut self.cands);
        MinP(p.min_p).apply(&mut self.cands);
        Temperature(p.temperature).apply(&mut self.cands);
        false
    }

    fn penalties(&self) -> Penalties {
        let p = &self.params;
        Penalties {
            repeat: p.repeat_penalty,
            last_n: p.repeat_last_n,
            presence: p.presence_penalty,
            frequency: p.frequency_penalty,
        }
    }

    /// The candidates left by [`Sampler::process`].
    pub(crate) fn candidates(&self) -> &Candidates {
        &self.cands
    }

    pub(crate) fn rng(&mut self) -> &mut Xoshiro256StarStar {
        &mut self.rng
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Logits with ties (values on a grid of 0.25), a few NaN and -inf, a peaked top.
    fn logits(n: usize, state: &mut u64) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n)
            .map(|_| (xorshift(state) % 64) as f32 * 0.25 - 8.0)
            .collect();
        for _ in 0..n / 100 {
            let i = xorshift(state) as usize % n;
            v[i] = match xorshift(state) % 3 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                _ => 9.0 + (xorshift(state) % 8) as f32 * 0.5,
            };
        }
        v
    }

    #[test]
    fn an_untruncated_draw_from_the_row_is_the_candidate_lists() {
        let mut state = 0x5151_7e57u64;
        for (i, &(temperature, repeat, presence)) in [
            (1.0, 1.0, 0.0),
            (0.7, 1.0, 0.0),
            (1.3, 1.2, 0.5),
            (1.0, 0.9, -1.0),
        ]
        .iter()
        .enumerate()
        {
            let params = SamplingParams {
                temperature,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                repeat_penalty: repeat,
                presence_penalty: presence,
                seed: Some(40 + i as u64),
                ..SamplingParams::default()
            };
            for n in [1usize, 63, 300, 5000] {
                let v = logits(n, &mut state);
                let history: Vec<u32> = (0..50)
                    .map(|_| (xorshift(&mut state) % n as u64) as u32)
                    .collect();
                let mut fast = Sampler::new(params.clone(), n).unwrap();
                assert!(fast.draws_whole_row());
                let mut slow = fast.clone();
                for round in 0..40 {
                    let a = fast.sample(&v, &history);
                    slow.process(&v, &history);
                    let b = dist::sample(&slow.cands, &mut slow.rng).unwrap_or(0);
                    assert_eq!(a, b, "chain {i}, {n} logits, draw {round}");
                }
            }
        }
        let all_neg_inf = [f32::NEG_INFINITY; 7];
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplingParams::default()
            },
            7,
        )
        .unwrap();
        assert_eq!(s.sample(&all_neg_inf, &[]), 0);
    }

    #[test]
    fn the_k_best_list_gives_what_the_whole_vocabulary_gives() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let chains = [
            (0.8, 40, 0.95, 0.05, 1.0, 64, 0.0, 0.0),
            (0.7, 20, 0.8, 0.0, 1.05, 64, 0.0, 0.0),
            (1.0, 5, 1.0, 0.0, 1.3, -1, 0.5, 0.2),
            (1.2, 64, 0.9, 0.1, 0.8, 64, -1.5, -0.5), // penalties that raise logits
            (0.0, 0, 1.0, 0.0, 1.2, 16, 0.0, 1.0),    // greedy with penalties
            (1.0, 1, 1.0, 0.0, 1.0, 64, 0.0, 0.0),    // top_k 1: greedy
        ];
        for (i, &(temperature, top_k, top_p, min_p, repeat, last_n, presence, frequency)) in
            chains.iter().enumerate()
        {
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty: repeat,
                repeat_last_n: last_n,
                presence_penalty: presence,
                frequency_penalty: frequency,
                seed: Some(i as u64),
            };
            for round in 0..20 {
                let n = 5000;
                let v = logits(n, &mut state);
                // the history repeats some of the best tokens, so penalties move the top
                let mut history: Vec<u32> = (0..300)
                    .map(|_| (xorshift(&mut state) % n as u64) as u32)
                    .collect();
                let best = crate::logprobs(&v, 8);
                history.extend(best.iter().map(|&(id, _)| id));
                let mut whole = Sampler::new(params.clone(), n).unwrap();
                let mut sparse = whole.clone();
                whole.penalize(&v, &history);
                sparse.penalize(&v, &history);
                let g1 = whole.run_chain(&v, false);
                let g2 = sparse.run_chain(&v, true);
                assert_eq!(g1, g2);
                if g1 {
                    assert_eq!(
                        greedy::argmax(&whole.cands),
                        greedy::argmax(&sparse.cands),
                        "chain {i} round {round}"
                    );
                } else {
                    assert_eq!(
                        whole.cands.as_slice(),
                        sparse.cands.as_slice(),
                        "chain {i} round {round}"
                    );
                }
                if g1 {
                    continue; // greedy: nothing is drawn
                }
                let (mut a, mut b) = (whole.clone(), whole.clone());
                let draws_whole: Vec<u32> = (0..16)
                    .map(|_| {
                        a.run_chain(&v, false);
                        dist::sample(&a.cands, &mut a.rng).unwrap()
                    })
                    .collect();
                let draws_sparse: Vec<u32> = (0..16)
                    .map(|_| {
                        b.run_chain(&v, true);
                        dist::sample(&b.cands, &mut b.rng).unwrap()
                    })
                    .collect();
                assert_eq!(draws_whole, draws_sparse, "chain {i} round {round}");
            }
        }
    }
}
