//! The final draw from the softmax.

use crate::candidates::max_ignoring_nan;
use crate::weights::{sum_values, weight};
use crate::{Candidate, Candidates, Xoshiro256StarStar};

/// Positions a partial sum covers: the draw sums chunks, then walks one.
const CHUNK: usize = 256;

/// What a draw reads: a list's values (logits as the chain left them), and its ids.
trait DrawList {
    fn count(&self) -> usize;
    fn id(&self, i: usize) -> u32;
    fn value(&self, i: usize) -> f32;
    /// Positions `range` as values: the list's own memory where it can be, else `buf`.
    fn values<'a>(&'a self, range: std::ops::Range<usize>, buf: &'a mut Vec<f32>) -> &'a [f32];
    /// The largest value (`-inf` for none).
    fn max(&self) -> f32;
}

impl DrawList for [Candidate] {
    fn count(&self) -> usize {
        self.len()
    }
    fn id(&self, i: usize) -> u32 {
        self[i].id
    }
    fn value(&self, i: usize) -> f32 {
        self[i].logit
    }
    fn values<'a>(&'a self, range: std::ops::Range<usize>, buf: &'a mut Vec<f32>) -> &'a [f32] {
        buf.clear();
        buf.extend(self[range].iter().map(|c| c.logit));
        buf
    }
    fn max(&self) -> f32 {
        crate::candidates::max_of(self)
    }
}

/// Draws a token from the softmax of the candidates' logits: `u` uniform in the total
/// weight, the first candidate (in list order) whose running sum passes it. The running sum
/// goes chunk by chunk (each chunk's weights summed block by block, vectorized), then token
/// by token inside the chunk it falls in: a 152k list costs one vectorized pass, not two exps
/// a token.
///
/// Returns `None` only for an empty list. If every logit is `-inf` the
/// lowest id among the candidates is returned.
pub fn sample(cands: &Candidates, rng: &mut Xoshiro256StarStar) -> Option<u32> {
    draw(cands.as_slice(), rng)
}

/// A whole vocabulary's row as the chain leaves it where it truncates nothing (no top-k,
/// top-p or min-p): each logit NaN-cleaned, replaced where penalized, times `1 / T`. Drawing
/// from it is [`sample`] over the candidate list the chain would build, bit for bit, without
/// building it (a candidate for each of 152k entries, then a pass to scale them): where
/// nothing is penalized or scaled, the weights are summed straight from the row.
pub(crate) struct Scaled<'a> {
    pub logits: &'a [f32],
    /// `(id, logit)` by ascending id: the penalized tokens' logits.
    pub penalized: &'a [(u32, f32)],
    /// `1 / T` where the temperature applies (not 1, not 0).
    pub inv_temperature: Option<f32>,
}

impl DrawList for Scaled<'_> {
    fn count(&self) -> usize {
        self.logits.len()
    }
    fn id(&self, i: usize) -> u32 {
        i as u32
    }
    fn value(&self, i: usize) -> f32 {
        let l = self.logits[i];
        let mut v = if l.is_nan() { f32::NEG_INFINITY } else { l };
        if let Ok(j) = self.penalized.binary_search_by_key(&(i as u32), |p| p.0) {
            v = self.penalized[j].1;
        }
        self.inv_temperature.map_or(v, |inv| v * inv)
    }
    fn values<'a>(&'a self, range: std::ops::Range<usize>, buf: &'a mut Vec<f32>) -> &'a [f32] {
        // a NaN weighs nothing, as the -inf it stands for: the row itself serves
        if self.penalized.is_empty() && self.inv_temperature.is_none() {
            return &self.logits[range];
        }
        let start = range.start;
        buf.clear();
        buf.extend(self.logits[range.clone()].iter().map(|&l| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l
            }
        }));
        let first = self.penalized.partition_point(|p| (p.0 as usize) < start);
        for &(id, l) in self.penalized[first..]
            .iter()
            .take_while(|p| (p.0 as usize) < range.end)
        {
            buf[id as usize - start] = l;
        }
        if let Some(inv) = self.inv_temperature {
            for b in buf.iter_mut() {
                *b *= inv;
            }
        }
        buf
    }
    fn max(&self) -> f32 {
        if self.penalized.is_empty() {
            // scaling by a positive 1 / T keeps the order, so the max scales with it
            let m = max_ignoring_nan(self.logits);
            return self.inv_temperature.map_or(m, |inv| m * inv);
        }
        let mut buf = Vec::with_capacity(CHUNK);
        (0..self.count())
            .step_by(CHUNK)
            .map(|s| max_ignoring_nan(self.values(s..(s + CHUNK).min(self.count()), &mut buf)))
            .fold(f32::NEG_INFINITY, f32::max)
    }
}

/// [`sample`] over a whole row without a candidate list (see [`Scaled`]).
pub(crate) fn sample_scaled(row: &Scaled<'_>, rng: &mut Xoshiro256StarStar) -> Option<u32> {
    draw(row, rng)
}

fn draw<L: DrawList + ?Sized>(list: &L, rng: &mut Xoshiro256StarStar) -> Option<u32> {
    let n = list.count();
    if n == 0 {
        return None;
    }
    let max = list.max();
    if max == f32::NEG_INFINITY {
        // every weight is 0: the lowest id, as the argmax's tie rule
        return (0..n).map(|i| list.id(i)).min();
    }
    let chunks = (0..n).step_by(CHUNK).map(|s| s..(s + CHUNK).min(n));
    let mut buf = Vec::with_capacity(CHUNK);
    let sums: Vec<f64> = chunks
        .clone()
        .map(|r| sum_values(list.values(r, &mut buf), max))
        .collect();
    let total: f64 = sums.iter().sum();
    let u = rng.next_f64() * total;
    let mut acc = 0.0f64;
    let mut last = None;
    for (range, &s) in chunks.zip(&sums) {
        if s == 0.0 {
            continue;
        }
        if u < acc + s {
            for i in range {
                let w = weight(list.value(i), max);
                if w > 0.0 {
                    acc += w;
                    last = Some(list.id(i));
                    if u < acc {
                        return last;
                    }
                }
            }
            // Rounding: the chunk's token-by-token sum fell a hair short of its block sums;
            // its last token of any weight is where `u` lies.
            return last;
        }
        acc += s;
        last = range
            .rev()
            .find(|&i| weight(list.value(i), max) > 0.0)
            .map(|i| list.id(i));
    }
    // Only reachable through rounding; the last possible token is correct.
    last
}
