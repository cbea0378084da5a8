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
        for (id, count) in self.window_counts(history, scratch) {
            if let Some(logit) = cands.logit_mut(id) {
                *logit = self.penalized(*logit, count);
            }
        }
    }

    /// The distinct tokens of the window of `history` with their counts, by ascending id
    /// (nothing when inactive). `scratch` holds the sorted window.
    pub fn window_counts<'s>(
        &self,
        history: &[u32],
        scratch: &'s mut Vec<u32>,
    ) -> impl Iterator<Item = (u32, usize)> + 's {
        scratch.clear();
        if self.is_active() {
            let window = if self.last_n < 0 {
                history
            } else {
                &history[history.len().saturating_sub(self.last_n as usize)..]
            };
            scratch.extend_from_slice(window);
            scratch.sort_unstable();
        }
        scratch
            .chunk_by(|a, b| a == b)
            .map(|run| (run[0], run.len()))
    }

    /// `logit` of a token seen `count` times in the window, penalized.
    pub fn penalized(&self, logit: f32, count: usize) -> f32 {
        let l = if logit <= 0.0 {
            logit * self.repeat
        } else {
            logit / self.repeat
        };
        l - (count as f32 * self.frequency + self.presence)
    }
}
