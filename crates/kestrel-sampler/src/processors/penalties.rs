//! Repetition, presence and frequency penalties.

use crate::Candidates;

/// Penalties for tokens seen in the last `last_n` tokens of the history.
///
/// For a token seen `c > 0` times in the window:
/// * repeat (llama.cpp): `logit / repeat` if the logit is positive, else
///   `logit * repeat`;
/// * then (OpenAI): `logit -= c * frequency + presence`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Repetition penalty; `1` is off.
    pub repeat: f32,
    /// Window size; `0` disables, negative means the whole history.
    pub last_n: i32,
    /// Subtracted once per token present in the window.
    pub presence: f32,
    /// Subtracted once per occurrence in the window.
    pub frequency: f32,
}

impl Penalties {
    /// Whether applying would change anything.
    pub fn is_active(&self) -> bool {
        self.last_n != 0 && (self.repeat != 1.0 || self.presence != 0.0 || self.frequency != 0.0)
    }

    /// Penalizes `cands` for the tokens in the window of `history`.
    /// `scratch` is a reusable buffer; ids not in `cands` are ignored.
    pub fn apply(&self, cands: &mut Candidates, history: &[u32], scratch: &mut Vec<u32>) {
        if !self.is_active() {
            return;
        }
        let window = if self.last_n < 0 {
            history
        } else {
            &history[history.len().saturating_sub(self.last_n as usize)..]
        };
        scratch.clear();
        scratch.extend_from_slice(window);
        scratch.sort_unstable();
        for run in scratch.chunk_by(|a, b| a == b) {
            let count = run.len() as f32;
            if let Some(logit) = cands.logit_mut(run[0]) {
                if *logit <= 0.0 {
                    *logit *= self.repeat;
                } else {
                    *logit /= self.repeat;
                }
                *logit -= count * self.frequency + self.presence;
            }
        }
    }
}
