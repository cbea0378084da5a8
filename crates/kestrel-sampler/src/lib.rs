//! Token sampling for kestrel: a chain of small logit processors driven by a
//! per-request seeded RNG.
//!
//! Given the logits for the next position and the tokens of the sequence so
//! far, [`Sampler::sample`] runs the same default chain as llama.cpp:
//!
//! ```text
//! logits ─► candidates (id, logit); NaN is treated as -inf
//!        ─► penalties    repeat / presence / frequency over the last `repeat_last_n` tokens
//!        ─► (greedy?)    temperature == 0 or top_k == 1: argmax, ties to the lowest id
//!        ─► top-k        keep the k highest logits (partial select, no full sort)
//!        ─► top-p        keep the smallest prefix whose probability mass reaches p
//!        ─► min-p        drop tokens with p < min_p × p_max
//!        ─► temperature  divide logits by T
//!        ─► dist         draw from the softmax with the request's seeded RNG
//! ```
//!
//! Every stage is a small processor in [`processors`] that works on a
//! [`Candidates`] list and can be used and tested on its own. The RNG is a
//! hand-written xoshiro256** seeded through splitmix64 ([`rng`]), so a seeded
//! request gives the same tokens on every machine, independent of any other crate's version
//! (the draw's arithmetic is kestrel's own: it changed once, when the weights became f32).
//!
//! [`logprobs()`] returns the top-k log-probabilities (log-softmax of the raw
//! logits) for the OpenAI `logprobs` option.
//!
//! Speed: a sampled token must cost little beside a GPU's decode step (~1-2.5 ms). A chain
//! that keeps at most `k` tokens (top-k, or the argmax with penalties) starts from the `k`
//! best unpenalized logits plus the penalized tokens, found in one pass that skips whole
//! chunks by their maximum ([`Candidates::fill_top`]): the same tokens in the same order
//! come out as from the whole vocabulary. A chain that truncates nothing (OpenAI's defaults)
//! draws from the row itself, without a candidate list. Softmax weights use an f32 `exp`
//! polynomial in vector lanes, summed block by block. Qwen's 152k vocabulary on a 2-vCPU
//! Zen 4: 20-60 us a token with a top-k, ~145 us without (BENCHMARKS.md).
//!
//! ```
//! use kestrel_sampler::{Sampler, SamplingParams};
//!
//! let params = SamplingParams { seed: Some(42), ..SamplingParams::default() };
//! let mut sampler = Sampler::new(params, 4).expect("valid params");
//! let token = sampler.sample(&[0.1, 2.0, -1.0, 0.5], &[]);
//! assert!(token < 4);
//! ```

pub mod candidates;
pub mod error;
pub mod logprobs;
pub mod params;
pub mod processors;
pub mod rng;
pub mod sampler;
pub mod speculative;
mod weights;

pub use candidates::{Candidate, Candidates};
pub use error::SamplerError;
pub use logprobs::{logprob_of, logprobs, token_logprobs};
pub use params::SamplingParams;
pub use rng::Xoshiro256StarStar;
pub use sampler::Sampler;
pub use speculative::{Distribution, Verdict};
