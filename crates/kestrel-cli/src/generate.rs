//! The generation loop shared by `run` and `chat`: prefill what the cache lacks, then sample,
//! stream and stop (end-of-generation token, stop string, or token budget).

use crate::source::ModelSource;
use anyhow::{anyhow, Result};
use kestrel_models::{KvCache, Logits, Model};
use kestrel_sampler::Sampler;
use kestrel_tokenizer::{ChatTemplate, StreamDecoder, Tokenizer};
use std::time::Instant;

pub struct Request<'a> {
    pub prompt: &'a [u32],
    pub max_tokens: usize,
    pub stops: &'a [String],
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndOfGeneration,
    StopString,
    MaxTokens,
    ContextFull,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens actually computed (the rest came from the cache).
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_tok_s: f64,
    /// Decode forward passes (one per generated token after the first).
    pub decode_n: usize,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    /// Generated tokens per second including prefill.
    pub e2e_tok_s: f64,
}

pub struct Output {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Generates after `req.prompt`. The cache may already hold a prefix of the prompt; only the
/// rest is computed. `on_text` receives text as it becomes final (never a split character,
/// never a piece of a stop string).
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    cache: &mut KvCache,
    sampler: &mut Sampler,
    req: &Request,
    on_text: &mut dyn FnMut(&str),
) -> Result<Output> {
    let t0 = Instant::now();
    anyhow::ensure!(!req.prompt.is_empty(), "the prompt is empty");
    // The last prompt token must run to give the first logits.
    cache.truncate(req.prompt.len() - 1);
    let todo = &req.prompt[cache.len()..];
    if req.prompt.len() >= cache.capacity() {
        return Err(anyhow!(
            "the prompt has {} tokens; the context holds {} (raise --ctx-size up to the model's maximum)",
            req.prompt.len(),
            cache.capacity()
        ));
    }
    let mut logits = model.forward(todo, cache, Logits::Last)?;
    let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

    let eog = tok.eog_ids();
    let mut history: Vec<u32> = req.prompt.to_vec();
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut emitted = 0usize;
    let max_stop = req.stops.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut decoder = StreamDecoder::new(tok, false);
    let mut ttft_ms = 0.0;
    let mut decode_n = 0usize;
    let t_decode = Instant::now();
    let mut stop = StopReason::MaxTokens;

    while tokens.len() < req.max_tokens {
        let next = sampler.sample(&logits, &history);
        if tokens.is_empty() {
            ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
        }
        if !req.ignore_eos && eog.contains(&next) {
            stop = StopReason::EndOfGeneration;
            break;
        }
        tokens.push(next);
        history.push(next);
        text.push_str(&decoder.push(next));

        // Stop strings: cut at the first one; otherwise emit all but a possible stop prefix.
        if let Some(at) = first_stop(&text, req.stops, emitted.saturating_sub(max_stop)) {
            text.truncate(at);
            stop = StopReason::StopString;
            break;
        }
        let mut safe = text.len().saturating_sub(max_stop.saturating_sub(1));
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > emitted {
            on_text(&text[emitted..safe]);
            emitted = safe;
        }
        if tokens.len() >= req.max_tokens {
            break;
        }
        if cache.len() + 1 > cache.capacity() {
            stop = StopReason::ContextFull;
            break;
        }
        logits = model.forward(&[next], cache, Logits::Last)?;
        decode_n += 1;
    }
    if stop != StopReason::StopString {
        text.push_str(&decoder.finish());
    }
    if text.len() > emitted {
        on_text(&text[emitted..]);
    }
    let decode_ms = t_decode.elapsed().as_secs_f64() * 1e3;
    let total_s = t0.elapsed().as_secs_f64();
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 / (ms / 1e3) } else { 0.0 };
    Ok(Output {
        timings: Timings {
            prompt_n: todo.len(),
            prompt_ms,
            prompt_tok_s: per_s(todo.len(), prompt_ms),
            decode_n,
            decode_ms,
            decode_tok_s: per_s(decode_n, decode_ms),
            ttft_ms,
            e2e_tok_s: if total_s > 0.0 {
                tokens.len() as f64 / total_s
            } else {
                0.0
            },
        },
        tokens,
        text,
        stop,
    })
}

/// Byte offset of the earliest stop string in `text`, searching from `from`.
fn first_stop(text: &str, stops: &[String], from: usize) -> Option<usize> {
    let mut from = from.min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text[from..].find(s.as_str()).map(|i| i + from))
        .min()
}

/// The model's chat template, or a clear error when it has none.
pub fn chat_template(src: &ModelSource) -> Result<ChatTemplate> {
    src.tokenizer
        .chat_template()?
        .ok_or_else(|| anyhow!("{} has no chat template", src.path.display()))
}

#[cfg(test)]
mod tests {
    use super::first_stop;

    #[test]
    fn finds_the_earliest_stop_string() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(first_stop("abc END x\n\n", &stops, 0), Some(4));
        assert_eq!(first_stop("abc", &stops, 0), None);
        assert_eq!(first_stop("é\n\n", &stops, 1), Some(2));
    }
}
