//! `kestrel bench`: llama-bench's pp / tg / depth, with every figure kept apart, the physical
//! limit printed beside decode, and the fast path's greedy tokens checked against the
//! reference path.
//!
//! - pp P: time to run P prompt tokens (after D tokens of depth) -> prompt-eval tok/s.
//! - tg N: time to generate N tokens one at a time (after the depth) -> decode tok/s.
//! - e2e: N / (pp time + tg time); ttft: pp time + the first token's sampling.
//! - bandwidth: a multi-threaded streaming read of a buffer 8x the last-level cache (at least
//!   512 MiB), best of 3, measured in the same run; decode's limit is bandwidth / bytes per token.

use crate::commands::info::human;
use crate::source::ModelSource;
use anyhow::{Context, Result};
use kestrel_models::{KvType, LoadOptions, Logits, MatmulPath, Model};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[arg(short, long)]
    pub model: PathBuf,
    /// Prompt lengths (comma-separated); 0 skips the prompt test.
    #[arg(short = 'p', long, default_value = "512")]
    pub prompt: String,
    /// Generation lengths (comma-separated); 0 skips the generation test.
    #[arg(short = 'n', long, default_value = "128")]
    pub gen: String,
    /// Depths: tokens already in the cache before the measurement (comma-separated).
    #[arg(short = 'd', long, default_value = "0")]
    pub depth: String,
    /// Repetitions (after one uncounted warm-up).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Print one JSON object (one combination) or an array of them.
    #[arg(long)]
    pub json: bool,
    /// Draw tok/s against depth as an SVG.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Tokens compared between the fast and the reference path (0 skips the check).
    #[arg(long, default_value_t = 16)]
    pub check_tokens: usize,
    /// Serving scenarios instead of pp/tg: `agent` (multi-turn prefix reuse), `concurrent`, or
    /// `sampling` (the host's cost of picking a token, chain by chain).
    #[arg(long)]
    pub scenario: Option<String>,
    /// Concurrency levels of `--scenario concurrent`.
    #[arg(short = 'c', long, default_value = "1,2,4,8")]
    pub concurrency: String,
    /// cpu, cuda, cuda:N, or auto (the GPU when one is present).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// On the GPU: run decode steps eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    pub no_graphs: bool,
    /// With --spec lookup|draft: the code-editing workload, speculative beside plain decoding
    /// (-n caps the answer, default 2048; -r runs of each).
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Quantize a Hugging Face folder as it loads (see `run --quantize`).
    #[arg(long, value_parser = crate::commands::run::parse_quant_mix)]
    pub quantize: Option<kestrel_models::quantize::QuantMix>,
}

#[derive(Debug, Clone, Copy)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(v: &[f64]) -> Stat {
        if v.is_empty() {
            return Stat {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let mid = s.len() / 2;
        let median = if s.len() % 2 == 1 {
            s[mid]
        } else {
            (s[mid - 1] + s[mid]) / 2.0
        };
        Stat {
            median,
            min: s[0],
            max: s[s.len() - 1],
        }
    }
    fn json(&self) -> serde_json::Value {
        json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

struct Row {
    p: usize,
    n: usize,
    d: usize,
    prompt_tok_s: Stat,
    decode_tok_s: Stat,
    e2e_tok_s: Stat,
    ttft_ms: Stat,
    wall_s: Stat,
    peak_rss: Stat,
    /// The read bandwidth measured right after each decode repetition (bytes/s), and each
    /// repetition's decode rate as a fraction of it; `None` without decode.
    read_bandwidth: Option<Stat>,
    decode_fraction: Option<Stat>,
}

pub fn list(s: &str, what: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| anyhow::anyhow!("-{what}: '{x}' is not a number"))
        })
        .collect()
}

/// Deterministic pseudo-random prompt tokens (xorshift), avoiding the top of the vocabulary
/// where special tokens live.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (vocab as u64 * 9 / 10).max(1)) as u32
        })
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Peak resident set (VmHWM) of this process, in bytes.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let kb: u64 = l
                    .strip_prefix("VmHWM:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()?;
                Some(kb * 1024)
            })
        })
        .unwrap_or(0)
}

/// [`read_bandwidth`] measured now by a child process (`kestrel read-bandwidth`), so that its
/// buffer never counts in this process's peak RSS. Measured after every decode repetition:
/// shared machines change their bandwidth from minute to minute (30–55 GB/s seen on one VM),
/// and a single figure for the whole run made decode fractions from 90% to 123%.
fn read_bandwidth_now(threads: usize) -> Result<f64> {
    let exe = std::env::current_exe().context("locating the kestrel binary")?;
    let out = std::process::Command::new(exe)
        .args(["read-bandwidth", "--threads", &threads.to_string()])
        .output()
        .context("running `kestrel read-bandwidth`")?;
    anyhow::ensure!(
        out.status.success(),
        "`kestrel read-bandwidth` failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<f64>()
        .context("reading the output of `kestrel read-bandwidth`")
}

/// Streaming read bandwidth with `threads` threads, bytes/s: each thread sums its share of a
/// buffer 8x the last-level cache (at least 512 MiB), best of 3 passes plain and 3 with a
/// software prefetch 4 KiB ahead. One Intel core keeps too few lines in flight on its own to
/// reach the memory's bandwidth (the Xeon read 16–18 GB/s plain, while decode with its weight
/// prefetch read more than that), so the limit is the better of the two ways.
pub fn read_bandwidth(threads: usize) -> f64 {
    let llc = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
        .ok()
        .and_then(|s| {
            let s = s.trim();
            let (num, mult) = match s.strip_suffix('K') {
                Some(n) => (n, 1024u64),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1 << 20),
                    None => (s, 1),
                },
            };
            num.parse::<u64>().ok().map(|n| n * mult)
        })
        .unwrap_or(32 << 20);
    let bytes = (llc * 8).max(512 << 20) as usize;
    let words = bytes / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads.max(1)).next_multiple_of(8);
    let mut best = 0f64;
    for prefetch in [false, true] {
        for _ in 0..3 {
            let t0 = Instant::now();
            let total: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = buf
                    .chunks(chunk)
                    .map(|c| s.spawn(move || sum_lines(c, prefetch)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or(0))
                    .fold(0u64, |a, b| a.wrapping_add(b))
            });
            std::hint::black_box(total);
            best = best.max(bytes as f64 / t0.elapsed().as_secs_f64());
        }
    }
    best
}

/// Wrapping sum of `words`, a 64-byte line at a time into 8 lanes (vectorized), optionally
/// prefetching the line 4 KiB ahead.
fn sum_lines(words: &[u64], prefetch: bool) -> u64 {
    const AHEAD_WORDS: usize = 4096 / 8;
    let mut lanes = [0u64; 8];
    let lines = words.chunks_exact(8);
    let tail = lines.remainder();
    for (i, line) in lines.enumerate() {
        #[cfg(target_arch = "x86_64")]
        if prefetch {
            let p = words.as_ptr().wrapping_add(i * 8 + AHEAD_WORDS);
            // SAFETY: a prefetch is a hint and never faults, whatever the address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p as *const i8,
                )
            };
        }
        for (l, w) in lanes.iter_mut().zip(line) {
            *l = l.wrapping_add(*w);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = prefetch;
    lanes
        .iter()
        .chain(tail)
        .fold(0u64, |a, &b| a.wrapping_add(b))
}

/// The prompt of the parity check: ordinary code, where greedy choices are clear.
const PARITY_PROMPT: &str =
    "def quicksort(items):\n    \"\"\"Sort a list of numbers in ascending order.\"\"\"\n";

/// Greedy tokens of the fast and the reference path from the same prompt; (equal, first
/// divergence).
fn check_reference(model: &mut Model, prompt: &[u32], n: usize) -> Result<(bool, Option<usize>)> {
    let run = |model: &Model| -> Result<Vec<u32>> {
        let mut cache = model.new_cache(prompt.len() + n + 1, KvType::F16);
        let mut logits = model.forward(prompt, &mut cache, Logits::Last)?;
        let mut out = Vec::new();
        for _ in 0..n {
            let t = argmax(&logits);
            out.push(t);
            logits = model.forward(&[t], &mut cache, Logits::Last)?;
        }
        Ok(out)
    };
    let fast = run(model)?;
    let before = model.options().matmul;
    model.set_matmul_path(MatmulPath::Reference);
    let reference = run(model);
    model.set_matmul_path(before);
    let reference = reference?;
    let first = fast.iter().zip(&reference).position(|(a, b)| a != b);
    Ok((first.is_none(), first))
}

pub fn run(args: BenchArgs) -> Result<()> {
    let wall0 = Instant::now();
    let ps = list(&args.prompt, "p")?;
    let ns = list(&args.gen, "n")?;
    let ds = list(&args.depth, "d")?;
    anyhow::ensure!(args.reps > 0, "-r must be at least 1");
    let mut opts = LoadOptions {
        quantize: args.quantize,
        ..LoadOptions::default()
    };
    if let Some(t) = args.threads {
        opts.threads = t.max(1);
    }
    if args.spec.spec != kestrel_engine::SpecMode::Off {
        return crate::commands::spec_bench::run(&args, opts);
    }
    match args.scenario.as_deref() {
        None => {}
        Some("agent") => return crate::commands::scenarios::agent(&args, opts),
        Some("concurrent") => return crate::commands::scenarios::concurrent(&args, opts),
        Some("sampling") => return crate::commands::sampling_bench::run(&args, opts),
        Some(other) => {
            anyhow::bail!("unknown --scenario '{other}' (agent, concurrent or sampling)")
        }
    }
    let src = ModelSource::open(&args.model)?;
    if let Some(n) = crate::gpu::bench_device(crate::gpu::Device::parse(&args.device)?)? {
        return crate::gpu::bench(&src, n, &ps, &ns, &ds, args.reps, args.no_graphs);
    }
    let threads = opts.threads;
    let mut model = src.load_model(opts, true)?;
    let vocab = model.config.vocab_size;
    let max_ctx = model.config.max_context;
    let bytes_per_token = model.weight_bytes_per_token();

    let mut rows = Vec::new();
    for &d in &ds {
        for &p in &ps {
            for &n in &ns {
                anyhow::ensure!(
                    d + p + n <= max_ctx,
                    "depth {d} + p {p} + n {n} exceeds the model's context {max_ctx}"
                );
                let mut pp = Vec::new();
                let mut tg = Vec::new();
                let mut e2e = Vec::new();
                let mut ttft = Vec::new();
                let mut wall = Vec::new();
                let mut rss = Vec::new();
                let mut bw = Vec::new();
                let mut frac = Vec::new();
                // The first repetition warms caches and is not counted (as the peer's bench does).
                for rep in 0..=args.reps {
                    let counted = rep > 0;
                    let r0 = Instant::now();
                    let mut cache = model.new_cache(d + p + n + 1, KvType::F16);
                    if d > 0 {
                        model.forward(
                            &tokens(d, vocab, 1000 + rep as u64),
                            &mut cache,
                            Logits::Last,
                        )?;
                    }
                    let mut next = tokens(1, vocab, 3)[0];
                    let mut pp_s = 0.0;
                    if p > 0 {
                        let prompt = tokens(p, vocab, 2000 + rep as u64);
                        let t0 = Instant::now();
                        let logits = model.forward(&prompt, &mut cache, Logits::Last)?;
                        next = argmax(&logits);
                        pp_s = t0.elapsed().as_secs_f64();
                        if counted {
                            pp.push(p as f64 / pp_s);
                            ttft.push(pp_s * 1e3);
                        }
                    }
                    if n > 0 {
                        let t0 = Instant::now();
                        for _ in 0..n {
                            let logits = model.forward(&[next], &mut cache, Logits::Last)?;
                            next = argmax(&logits);
                        }
                        let tg_s = t0.elapsed().as_secs_f64();
                        if counted {
                            tg.push(n as f64 / tg_s);
                            e2e.push(n as f64 / (pp_s + tg_s));
                        }
                    }
                    if counted {
                        wall.push(r0.elapsed().as_secs_f64());
                        rss.push(peak_rss() as f64);
                        // Outside the repetition's wall time.
                        if let (true, Some(&rate)) = (n > 0, tg.last()) {
                            let b = read_bandwidth_now(threads)?;
                            bw.push(b);
                            frac.push(rate * bytes_per_token as f64 / b);
                        }
                    }
                }
                rows.push(Row {
                    p,
                    n,
                    d,
                    prompt_tok_s: Stat::of(&pp),
                    decode_tok_s: Stat::of(&tg),
                    e2e_tok_s: Stat::of(&e2e),
                    ttft_ms: Stat::of(&ttft),
                    wall_s: Stat::of(&wall),
                    peak_rss: Stat::of(&rss),
                    read_bandwidth: (!bw.is_empty()).then(|| Stat::of(&bw)),
                    decode_fraction: (!frac.is_empty()).then(|| Stat::of(&frac)),
                });
            }
        }
    }
    let process_wall = wall0.elapsed().as_secs_f64();
    // After the rows: the reference path reads the raw weights (also of repacked matrices),
    // which must not count in the rows' peak RSS.
    let (matches, first_div) = if args.check_tokens > 0 {
        let prompt = src.tokenizer.encode(PARITY_PROMPT, true, true)?;
        let (m, f) = check_reference(&mut model, &prompt, args.check_tokens)?;
        (Some(m), f)
    } else {
        (None, None)
    };
    // The machine's read bandwidth: what each decode repetition measured after itself, or,
    // for a run without decode, one measurement now.
    let measured: Vec<&Stat> = rows
        .iter()
        .filter_map(|r| r.read_bandwidth.as_ref())
        .collect();
    let overall = if measured.is_empty() {
        let b = read_bandwidth_now(threads)?;
        Stat {
            median: b,
            min: b,
            max: b,
        }
    } else {
        let medians: Vec<f64> = measured.iter().map(|s| s.median).collect();
        Stat {
            median: Stat::of(&medians).median,
            min: measured.iter().map(|s| s.min).fold(f64::INFINITY, f64::min),
            max: measured.iter().map(|s| s.max).fold(0.0, f64::max),
        }
    };

    let row_json = |r: &Row| {
        let bandwidth = r.read_bandwidth.as_ref().unwrap_or(&overall);
        json!({
            "model": args.model.display().to_string(),
            "threads": threads,
            "kernels": kestrel_quant::kernels_summary(),
            "p": r.p, "n": r.n, "depth": r.d, "reps": args.reps,
            "prompt_tok_s": r.prompt_tok_s.json(),
            "decode_tok_s": r.decode_tok_s.json(),
            "e2e_tok_s": r.e2e_tok_s.json(),
            "ttft_ms": r.ttft_ms.json(),
            "wall_s": r.wall_s.json(),
            "peak_rss_bytes": r.peak_rss.json(),
            "process_wall_s": process_wall,
            "tokens_match_reference": matches,
            "first_divergence": first_div,
            "weight_bytes_per_token": bytes_per_token,
            "read_bandwidth_bytes_s": bandwidth.median,
            "read_bandwidth": bandwidth.json(),
            "decode_limit_tok_s": bandwidth.median / bytes_per_token as f64,
            // Zeros for a row without decode, as its decode_tok_s.
            "decode_bandwidth_fraction": r.decode_fraction.as_ref().unwrap_or(&Stat::of(&[])).json(),
        })
    };

    if let Some(path) = &args.chart {
        std::fs::write(path, chart_svg(&rows))?;
        eprintln!("chart written to {}", path.display());
    }
    if args.json {
        let v: Vec<_> = rows.iter().map(row_json).collect();
        if v.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&v[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        return Ok(());
    }

    println!("model     {}  ({} threads)", args.model.display(), threads);
    println!("kernels   {}", kestrel_quant::kernels_summary());
    println!(
        "machine   read bandwidth {:.1} GB/s ({:.1}–{:.1}; {} threads, streaming read, {}); weights read per token {}; decode limit {:.1} tok/s",
        overall.median / 1e9,
        overall.min / 1e9,
        overall.max / 1e9,
        threads,
        if measured.is_empty() {
            "after the rows"
        } else {
            "after each decode repetition"
        },
        human(bytes_per_token),
        overall.median / bytes_per_token as f64
    );
    match matches {
        Some(true) => println!(
            "parity    fast path greedy tokens equal the reference path's ({} tokens)",
            args.check_tokens
        ),
        Some(false) => println!(
            "parity    fast path differs from the reference path at token {}",
            first_div.map_or("?".into(), |d| d.to_string())
        ),
        None => println!("parity    not checked"),
    }
    println!(
        "{:<34} {:>12} {:>12} {:>12}",
        "figure", "median", "min", "max"
    );
    for r in &rows {
        println!("-- pp{} tg{} depth {} ({} reps)", r.p, r.n, r.d, args.reps);
        let line = |name: &str, s: &Stat| {
            println!(
                "{name:<34} {:>12.2} {:>12.2} {:>12.2}",
                s.median, s.min, s.max
            )
        };
        if r.p > 0 {
            line("prompt-eval tok/s", &r.prompt_tok_s);
            line("time to first token ms", &r.ttft_ms);
        }
        if r.n > 0 {
            line("decode tok/s", &r.decode_tok_s);
            if let (Some(bw), Some(f)) = (&r.read_bandwidth, &r.decode_fraction) {
                println!(
                    "{:<34} {:>11.1}% {:>11.1}% {:>11.1}%",
                    "decode % of read bandwidth",
                    100.0 * f.median,
                    100.0 * f.min,
                    100.0 * f.max
                );
                let gb = |x: f64| x / 1e9;
                line(
                    "read bandwidth GB/s (after each)",
                    &Stat {
                        median: gb(bw.median),
                        min: gb(bw.min),
                        max: gb(bw.max),
                    },
                );
            }
            line("generated tok/s incl. prefill", &r.e2e_tok_s);
        }
        line("wall s per repetition", &r.wall_s);
        println!(
            "{:<34} {:>12} {:>12} {:>12}",
            "peak RSS",
            human(r.peak_rss.median as u64),
            human(r.peak_rss.min as u64),
            human(r.peak_rss.max as u64)
        );
    }
    println!("process wall time {:.1} s", process_wall);
    Ok(())
}

/// tok/s (prompt and decode medians) against depth, as a small hand-drawn SVG.
fn chart_svg(rows: &[Row]) -> String {
    let (w, h, m) = (640.0, 400.0, 50.0);
    let max_d = rows.iter().map(|r| r.d).max().unwrap_or(0).max(1) as f64;
    let max_y = rows
        .iter()
        .flat_map(|r| [r.prompt_tok_s.median, r.decode_tok_s.median])
        .fold(1.0, f64::max)
        * 1.1;
    let x = |d: usize| m + (d as f64 / max_d) * (w - 2.0 * m);
    let y = |v: f64| h - m - (v / max_y) * (h - 2.0 * m);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"{cx}\" y=\"{ly}\" text-anchor=\"middle\">depth (tokens in cache)</text>\n\
         <text x=\"12\" y=\"{cy}\" transform=\"rotate(-90 12 {cy})\" text-anchor=\"middle\">tok/s</text>\n",
        b = h - m,
        r = w - m,
        cx = w / 2.0,
        ly = h - 12.0,
        cy = h / 2.0
    );
    for (name, color, pick) in [
        ("prompt-eval", "#1f77b4", 0usize),
        ("decode", "#d62728", 1usize),
    ] {
        let mut pts: Vec<(usize, f64)> = rows
            .iter()
            .map(|r| {
                (
                    r.d,
                    if pick == 0 {
                        r.prompt_tok_s.median
                    } else {
                        r.decode_tok_s.median
                    },
                )
            })
            .filter(|p| p.1 > 0.0)
            .collect();
        pts.sort_by_key(|p| p.0);
        if pts.is_empty() {
            continue;
        }
        let path: Vec<String> = pts
            .iter()
            .map(|(d, v)| format!("{:.1},{:.1}", x(*d), y(*v)))
            .collect();
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        );
        for (d, v) in &pts {
            svg += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{v:.1}</text>\n",
                x(*d),
                y(*v),
                x(*d) + 4.0,
                y(*v) - 4.0
            );
        }
        let ly = if pick == 0 { m - 20.0 } else { m - 6.0 };
        svg += &format!(
            "<text x=\"{}\" y=\"{ly}\" fill=\"{color}\">{name} tok/s</text>\n",
            w - 200.0
        );
    }
    for i in 0..=4 {
        let d = (max_d * i as f64 / 4.0) as usize;
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{d}</text>\n",
            x(d),
            h - m + 16.0
        );
    }
    svg += "</svg>\n";
    svg
}
