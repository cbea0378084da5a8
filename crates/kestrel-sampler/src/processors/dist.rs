//! The final draw from the softmax.

use crate::processors::greedy;
use crate::weights::{sum_weights, weight};
use crate::{Candidates, Xoshiro256StarStar};

/// Candidates a partial sum covers: the draw sums chunks, then walks one.
const CHUNK: usize = 256;

/// Draws a token from the softmax of the candidates' logits: `u` uniform in the total
/// weight, the first candidate (in list order) whose running sum passes it. The running sum
/// goes chunk by chunk (each chunk's weights summed as [`sum_weights`] does), then token by
/// token inside the chunk it falls in: a 152k list costs one vectorized pass, not two exps a
/// token.
///
/// Returns `None` only for an empty list. If every logit is `-inf` the
/// lowest id among the candidates is returned.
pub fn sample(cands: &Candidates, rng: &mut Xoshiro256StarStar) -> Option<u32> {
    let max = cands.max_logit();
    if max == f32::NEG_INFINITY {
        return greedy::argmax(cands);
    }
    let slice = cands.as_slice();
    let sums: Vec<f64> = slice.chunks(CHUNK).map(|c| sum_weights(c, max)).collect();
    let total: f64 = sums.iter().sum();
    let u = rng.next_f64() * total;
    let mut acc = 0.0f64;
    let mut last = None;
    for (chunk, &s) in slice.chunks(CHUNK).zip(&sums) {
        if s == 0.0 {
            continue;
        }
        if u < acc + s {
            for c in chunk {
                let w = weight(c.logit, max);
                if w > 0.0 {
                    acc += w;
                    last = Some(c.id);
                    if u < acc {
                        return last;
                    }
                }
            }
            // Rounding: the chunk's token-by-token sum fell a hair short of its lane sum;
            // its last token of any weight is where `u` lies.
            return last;
        }
        acc += s;
        last = chunk
            .iter()
            .rev()
            .find(|c| weight(c.logit, max) > 0.0)
            .map(|c| c.id);
    }
    // Only reachable through rounding; the last possible token is correct.
    last
}
