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
        let picked = if self.process(logits, history) {
            greedy::argmax(&self.cands)
        } else {
            dist::sample(&self.cands, &mut self.rng)
        };
        picked.unwrap_or(0)
    }

    /// Whether [`Sampler::sample`] is the plain argmax of the logits (greedy, no penalties):
    /// then nothing else is read and no state changes, so the argmax may come from elsewhere
    /// (a GPU's, over the logits it holds).
    pub fn argmax_suffices(&self) -> bool {
        self.params.is_greedy() && !self.penalties().is_active()
    }

    /// Runs the chain up to the draw, leaving the candidates to draw from in `self.cands`;
    /// returns whether the pick is greedy (argmax, no draw).
    pub(crate) fn process(&mut self, logits: &[f32], history: &[u32]) -> bool {
        let p = &self.params;
        self.cands.fill(logits);
        self.penalties()
            .apply(&mut self.cands, history, &mut self.scratch);
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
