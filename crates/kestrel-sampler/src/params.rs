//! Sampling parameters and their validation.

use serde::{Deserialize, Serialize};

use crate::SamplerError;

/// Per-request sampling parameters.
///
/// Defaults follow llama.cpp: `temperature` 0.8, `top_k` 40, `top_p` 0.95,
/// `min_p` 0.05, `repeat_penalty` 1.0 (off), `repeat_last_n` 64,
/// `presence_penalty` 0, `frequency_penalty` 0, `seed` none (random).
/// Missing fields deserialize to these defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax). Must be finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables. `1` means greedy.
    pub top_k: u32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches `top_p`. In `(0, 1]`; `1` disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top probability.
    /// In `[0, 1]`; `0` disables.
    pub min_p: f32,
    /// Repetition penalty (llama.cpp / CTRL style): positive logits of recent
    /// tokens are divided by it, negative ones multiplied. `1` disables; `> 0`.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at. `0` disables
    /// the penalties, `-1` means the whole history.
    pub repeat_last_n: i32,
    /// OpenAI presence penalty: subtracted once from each token that occurs in
    /// the window. In `[-2, 2]`.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per occurrence in the window.
    /// In `[-2, 2]`.
    pub frequency_penalty: f32,
    /// Seed for the request's RNG; `None` picks a random seed.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Deterministic argmax decoding: temperature 0, no truncation, no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Whether these parameters pick the argmax (temperature 0 or top_k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every parameter's range; the error names the first bad one.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplerError::invalid(
                "temperature",
                t,
                "must be a finite number >= 0 (0 = greedy)",
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SamplerError::invalid(
                "top_p",
                p,
                "must be in (0, 1] (1 = disabled)",
            ));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SamplerError::invalid(
                "min_p",
                m,
                "must be in [0, 1] (0 = disabled)",
            ));
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SamplerError::invalid(
                "repeat_penalty",
                r,
                "must be a finite number > 0 (1 = disabled)",
            ));
        }
        if self.repeat_last_n < -1 {
            return Err(SamplerError::invalid(
                "repeat_last_n",
                self.repeat_last_n,
                "must be >= -1 (0 = disabled, -1 = whole history)",
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(SamplerError::invalid(name, v, "must be in [-2, 2]"));
            }
        }
        Ok(())
    }
}
