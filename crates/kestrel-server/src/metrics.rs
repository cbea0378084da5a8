//! Prometheus metrics, hand-written in the text exposition format (version 0.0.4).
//!
//! Counters and histograms live here and are updated by the routes; the KV-pool and
//! scheduler gauges are read from the backend at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::backend::{BackendStats, FinishReason, Usage};

/// Upper bounds (seconds) of the time-to-first-token histogram.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (seconds) of the decode-time histogram (first token to last, per request).
const DECODE_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A cumulative histogram with fixed buckets.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistState>,
}

#[derive(Debug, Default, Clone)]
struct HistState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new(HistState {
                counts: vec![0; bounds.len()],
                ..HistState::default()
            }),
        }
    }

    fn observe(&self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            s.counts[i] += 1;
        }
        s.sum += v;
        s.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&s.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}", s.sum);
        let _ = writeln!(out, "{name}_count {}", s.count);
    }
}

/// All server metrics.
#[derive(Debug)]
pub struct Metrics {
    /// HTTP responses by (route, status).
    http: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    ttft: Histogram,
    decode: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            http: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            decode: Histogram::new(DECODE_BUCKETS),
        }
    }
}

impl Metrics {
    /// Counts one HTTP response.
    pub fn record_http(&self, route: &str, status: u16) {
        let mut m = self.http.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    /// Records a generation that ran to its end, and logs it as one line (`request finished
    /// prompt_tokens=... cached_tokens=... ttft_ms=...`: what an agent's turns cost).
    pub fn record_finished(&self, id: &str, usage: &Usage, finish: FinishReason) {
        tracing::info!(
            id,
            prompt_tokens = usage.prompt_tokens,
            cached_tokens = usage.cached_tokens,
            completion_tokens = usage.completion_tokens,
            ttft_ms = format_args!("{:.0}", usage.ttft_ms),
            decode_ms = format_args!("{:.0}", usage.decode_ms),
            finish = ?finish,
            "request finished"
        );
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(usage.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_prompt_tokens
            .fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(usage.completion_tokens as u64, Ordering::Relaxed);
        self.ttft.observe(usage.ttft_ms / 1000.0);
        self.decode.observe(usage.decode_ms / 1000.0);
    }

    /// Records a generation whose client went away before it finished.
    pub fn record_cancelled(&self, id: &str, elapsed: std::time::Duration) {
        tracing::info!(
            id,
            elapsed_ms = elapsed.as_millis() as u64,
            "request cancelled (client went away)"
        );
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text page.
    pub fn render(&self, stats: &BackendStats) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP kestrel_http_requests_total HTTP responses by route and status.\n# TYPE kestrel_http_requests_total counter"
        );
        for ((route, status), n) in self.http.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "kestrel_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                escape_label(route)
            );
        }
        let counters = [
            (
                "kestrel_requests_finished_total",
                "Generations that ran to their end.",
                &self.finished,
            ),
            (
                "kestrel_requests_cancelled_total",
                "Generations cancelled because the client went away.",
                &self.cancelled,
            ),
            (
                "kestrel_prompt_tokens_total",
                "Prompt tokens of finished generations.",
                &self.prompt_tokens,
            ),
            (
                "kestrel_prompt_cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
                &self.cached_prompt_tokens,
            ),
            (
                "kestrel_generated_tokens_total",
                "Tokens generated by finished generations.",
                &self.generated_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        self.ttft.render(
            &mut out,
            "kestrel_time_to_first_token_seconds",
            "Time from submission to the first generated token.",
        );
        self.decode.render(
            &mut out,
            "kestrel_decode_seconds",
            "Time from the first generated token to the last, per request.",
        );
        let gauges = [
            (
                "kestrel_kv_blocks_used",
                "KV blocks held by running sequences.",
                stats.kv_blocks_used,
            ),
            (
                "kestrel_kv_blocks_cached",
                "KV blocks kept for prefix reuse.",
                stats.kv_blocks_cached,
            ),
            (
                "kestrel_kv_blocks_free",
                "KV blocks free.",
                stats.kv_blocks_free,
            ),
            (
                "kestrel_queue_depth",
                "Requests waiting to be scheduled.",
                stats.queue_depth,
            ),
            (
                "kestrel_running_sequences",
                "Sequences being prefilled or decoded.",
                stats.running,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        // the engine's counters since start (times in seconds)
        let secs = |ns: u64| format!("{:.6}", ns as f64 * 1e-9);
        let engine = [
            (
                "kestrel_spec_proposed_tokens_total",
                "Speculative decoding: tokens proposed (lookup or draft model).",
                stats.spec_proposed.to_string(),
            ),
            (
                "kestrel_spec_accepted_tokens_total",
                "Speculative decoding: proposed tokens kept after verification.",
                stats.spec_accepted.to_string(),
            ),
            (
                "kestrel_spec_redone_tokens_total",
                "Speculative decoding on hybrid models: kept tokens run again to restore the recurrent state after a rejection.",
                stats.spec_redone.to_string(),
            ),
            (
                "kestrel_forward_steps_total",
                "Model forward passes (one per scheduler step).",
                stats.forward_steps.to_string(),
            ),
            (
                "kestrel_forward_seconds_total",
                "Time inside the model's forward passes (logits downloaded included).",
                secs(stats.forward_ns),
            ),
            (
                "kestrel_sample_seconds_total",
                "Time the engine spent on the logits of each step: sampling, indexing, streaming.",
                secs(stats.sample_ns),
            ),
        ];
        for (name, help, v) in engine {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        out
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.record_http("/v1/chat/completions", 200);
        m.record_http("/v1/chat/completions", 200);
        m.record_http("/v1/chat/completions", 400);
        m.record_finished(
            "chatcmpl-x",
            &Usage {
                prompt_tokens: 10,
                cached_tokens: 4,
                completion_tokens: 5,
                ttft_ms: 30.0,
                decode_ms: 200.0,
                ..Default::default()
            },
            FinishReason::Stop,
        );
        m.record_cancelled("chatcmpl-y", std::time::Duration::from_millis(5));
        let stats = BackendStats {
            kv_blocks_used: 3,
            kv_blocks_cached: 2,
            kv_blocks_free: 95,
            queue_depth: 1,
            running: 2,
            spec_proposed: 40,
            spec_accepted: 31,
            spec_redone: 6,
            forward_steps: 7,
            forward_ns: 1_500_000_000,
            sample_ns: 2_000_000,
        };
        let text = m.render(&stats);
        for line in [
            "kestrel_spec_proposed_tokens_total 40",
            "kestrel_spec_accepted_tokens_total 31",
            "kestrel_spec_redone_tokens_total 6",
            "kestrel_forward_steps_total 7",
            "kestrel_forward_seconds_total 1.500000",
            "kestrel_sample_seconds_total 0.002000",
            "kestrel_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2",
            "kestrel_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1",
            "kestrel_prompt_tokens_total 10",
            "kestrel_prompt_cached_tokens_total 4",
            "kestrel_generated_tokens_total 5",
            "kestrel_requests_cancelled_total 1",
            "kestrel_time_to_first_token_seconds_bucket{le=\"0.025\"} 0",
            "kestrel_time_to_first_token_seconds_bucket{le=\"0.05\"} 1",
            "kestrel_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
            "kestrel_time_to_first_token_seconds_count 1",
            "kestrel_decode_seconds_sum 0.2",
            "kestrel_kv_blocks_free 95",
            "kestrel_queue_depth 1",
            "kestrel_running_sequences 2",
            "# TYPE kestrel_decode_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
