//! `--device cpu|cuda[:N]|auto`: which backend runs the model, and the GPU's own commands
//! (`bench --device cuda`, the hidden `gpu-check`).

use crate::commands::info::human;
use crate::source::ModelSource;
use anyhow::{anyhow, Result};
use kestrel_cuda::{plan::GpuPlan, CudaModel, Gpu, GpuShape, SeqIn};
use kestrel_engine::{PoolPlan, StepModel};
use kestrel_models::{KvType, LoadOptions, PagedModel};
use std::time::Instant;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    /// The GPU when one is present and the plan fits there, else the CPU.
    Auto,
}

impl Device {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "auto" => Ok(Self::Auto),
            d => kestrel_cuda::parse_ordinal(d)
                .map(Self::Cuda)
                .ok_or_else(|| anyhow!("unknown --device '{d}' (cpu, cuda, cuda:N or auto)")),
        }
    }
}

/// Tokens per forward pass on the GPU (prefill chunks): each pass dequantizes every weight to
/// f16 once, so longer passes amortize that (the serving engine's own steps stay at its
/// token budget).
const GPU_MAX_BATCH: usize = 2048;

/// Plans (printing the plan unless `quiet`) and loads the model on the GPU.
pub fn open_cuda(
    src: &ModelSource,
    ordinal: usize,
    ctx: usize,
    parallel: usize,
    block_size: usize,
    max_memory: Option<u64>,
    quiet: bool,
) -> Result<(CudaModel, GpuPlan)> {
    let gpu = Gpu::open(ordinal)?;
    let (free, _) = gpu.memory()?;
    let plan = kestrel_cuda::plan::plan(
        &src.config,
        src.tensor_bytes(),
        ctx,
        parallel,
        block_size,
        GPU_MAX_BATCH,
        free as u64,
        max_memory,
    )?;
    if !quiet {
        eprintln!(
            "device: {} ({}), kernels {} in {:.0} ms",
            gpu.name,
            gpu.arch,
            if gpu.kernels_cached {
                "from the cache"
            } else {
                "compiled by NVRTC"
            },
            gpu.kernels_ms
        );
        eprintln!("{plan}");
    }
    let store = src.tensor_store()?;
    let shape = GpuShape {
        n_blocks: plan.n_blocks,
        block_size,
        max_batch: GPU_MAX_BATCH,
        max_context: ctx,
        state_slots: plan.running_slots + plan.snapshot_slots,
    };
    let model = CudaModel::load(gpu, src.config.clone(), &store, &shape)?;
    Ok((model, plan))
}

/// The engine's model on the chosen device, with the pool plan the engine is configured by.
#[allow(clippy::too_many_arguments)]
pub fn step_model(
    src: &ModelSource,
    draft: Option<&ModelSource>,
    device: Device,
    opts: LoadOptions,
    ctx: usize,
    parallel: usize,
    kv_type: KvType,
    max_memory: Option<u64>,
    quiet_plan: bool,
    quiet_load: bool,
) -> Result<Loaded> {
    let quiet = quiet_plan;
    let block_size = crate::generate::BLOCK_SIZE;
    let device = match (device, opts.quantize) {
        (Device::Cuda(_), Some(mix)) => anyhow::bail!(
            "--quantize {} runs on the CPU backend; for the GPU, write a GGUF with `kestrel quantize {} OUT.gguf --type {}` and load that",
            mix.name(),
            src.path.display(),
            mix.name()
        ),
        (Device::Auto, Some(_)) => Device::Cpu,
        (d, _) => d,
    };
    let cuda = match device {
        Device::Cpu => None,
        Device::Cuda(n) => Some(open_cuda(
            src, n, ctx, parallel, block_size, max_memory, quiet,
        )?),
        Device::Auto => match open_cuda(src, 0, ctx, parallel, block_size, max_memory, quiet) {
            Ok(m) => Some(m),
            Err(e) => {
                if !quiet && !e.to_string().contains("no CUDA device found") {
                    eprintln!("device: cpu (the GPU was not used: {e})");
                }
                None
            }
        },
    };
    if let Some((model, plan)) = cuda {
        if kv_type != KvType::F16 && !quiet {
            eprintln!("note: the GPU keeps its KV cache in f16 (--kv-type applies to the CPU)");
        }
        // host memory: the logits row each end-of-prompt snapshot keeps (engine side)
        let snapshot_logits = (plan.snapshot_slots * src.config.vocab_size * 4) as u64;
        if snapshot_logits > 0 && !quiet {
            eprintln!(
                "host memory for the snapshots' last logits: {} x {:.1} MiB = {:.0} MiB",
                plan.snapshot_slots,
                (src.config.vocab_size * 4) as f64 / (1u64 << 20) as f64,
                snapshot_logits as f64 / (1u64 << 20) as f64
            );
        }
        let pool = PoolPlan {
            block_size,
            n_blocks: plan.n_blocks,
            block_bytes: (plan.kv_bytes / plan.n_blocks.max(1) as u64) as usize,
            kv_bytes: plan.kv_bytes,
            tokens: plan.tokens,
            state_slot_bytes: plan.state_slot_bytes as usize,
            running_slots: plan.running_slots,
            snapshot_slots: plan.snapshot_slots,
            snapshots_per_seq: plan.snapshots_per_seq,
            state_bytes: plan.state_bytes,
            snapshot_logits_bytes: snapshot_logits,
            draft_weight_bytes: 0,
            draft_kv_bytes: 0,
            total_bytes: plan.total_bytes,
            limit_bytes: Some(plan.limit_bytes),
        };
        return Ok(Loaded {
            model: Box::new(model),
            draft: None,
            plan: pool,
        });
    }
    let plan = crate::generate::plan(src, draft, ctx, parallel, kv_type, max_memory, quiet_plan)?;
    let model = src.load_model(opts.clone(), quiet_load)?;
    let paged = PagedModel::new(model, plan.n_blocks, plan.block_size, kv_type)
        .with_state_slots(plan.state_slots());
    let draft = match draft {
        Some(d) => {
            // The draft stores its K/V under the same block ids: as many blocks.
            let m = d.load_model(opts, quiet_load)?;
            let m: Box<dyn StepModel> =
                Box::new(PagedModel::new(m, plan.n_blocks, plan.block_size, kv_type));
            Some(m)
        }
        None => None,
    };
    Ok(Loaded {
        model: Box::new(paged),
        draft,
        plan,
    })
}

/// A model loaded for the engine, with its speculative draft model (if any) and the plan.
pub struct Loaded {
    pub model: Box<dyn StepModel>,
    pub draft: Option<Box<dyn StepModel>>,
    pub plan: PoolPlan,
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `tokens` at positions `start..` of the one bench sequence (blocks 0, 1, 2, ...).
fn feed(
    m: &mut CudaModel,
    table: &[u32],
    tokens: &[u32],
    start: usize,
    want: bool,
) -> Result<Option<u32>> {
    let step = SeqIn {
        tokens,
        start,
        blocks: table,
        want_logits: want,
        all_logits: false,
        slot: 0,
        argmax_only: want,
    };
    Ok(m.forward_argmax(&[step])?.first().copied())
}

/// Replays of the last decode step that time the GPU's step alone (bench's tg lines).
const REPLAYS: usize = 32;

/// llama-bench's pp / tg / depth on the GPU: prompt-eval tok/s over P tokens and decode tok/s
/// over N tokens (greedy: the argmax picked on the GPU, one id copied back a step, as the
/// engine does for greedy requests), after D tokens of depth; median of
/// `reps` after one warm-up; decode beside the bandwidth limit (weight bytes per token / the
/// card's bandwidth: `Gpu::mem_bandwidth`, 4.65 TB/s on the H200), prefill beside the tensor
/// cores' peak (the layers' matrix products at ~790 TFLOP/s, the H200's measured bf16 dense rate).
pub fn bench(
    src: &ModelSource,
    ordinal: usize,
    ps: &[usize],
    ns: &[usize],
    ds: &[usize],
    reps: usize,
    no_graphs: bool,
) -> Result<()> {
    let longest = ds.iter().max().unwrap_or(&0)
        + ps.iter()
            .max()
            .unwrap_or(&0)
            .max(ns.iter().max().unwrap_or(&0))
        + 1;
    let (mut m, _) = open_cuda(src, ordinal, longest, 0, 16, None, false)?;
    m.use_graphs = !no_graphs;
    let table: Vec<u32> = (0..longest.div_ceil(16) as u32).collect();
    let vocab = m.config.vocab_size as u64;
    let wbytes = m.weight_bytes_per_token();
    const PEAK: f64 = 790e12;
    let flops = m.layer_matmul_flops_per_token() as f64;
    println!("| model | device | test | tok/s (median of {reps}) | min | max | note |");
    println!("|---|---|---|---:|---:|---:|---|");
    let name = src
        .path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dev = m.gpu().name.clone();
    let bw = m.gpu().mem_bandwidth;
    let prompt = |n: usize, seed: u64| -> Vec<u32> {
        (0..n as u64)
            .map(|i| ((i * 7919 + seed * 104729) % vocab) as u32)
            .collect()
    };
    for &d in ds {
        for &p in ps.iter().filter(|&&p| p > 0) {
            let mut v = Vec::new();
            for r in 0..=reps {
                if d > 0 {
                    feed(&mut m, &table, &prompt(d, 1), 0, false)?;
                }
                let toks = prompt(p, 2 + r as u64);
                let t = Instant::now();
                feed(&mut m, &table, &toks, d, true)?;
                let s = t.elapsed().as_secs_f64();
                if r > 0 {
                    v.push(p as f64 / s);
                }
            }
            let (lo, hi) = (
                v.iter().cloned().fold(f64::MAX, f64::min),
                v.iter().cloned().fold(0.0, f64::max),
            );
            let med = median(&mut v);
            println!(
                "| {name} | {dev} | pp{p}{} | {med:.0} | {lo:.0} | {hi:.0} | layer matmuls {:.0} TFLOP/s: {:.0}% of 790 (attention not counted) |",
                if d > 0 {
                    format!(" @ d{d}")
                } else {
                    String::new()
                },
                med * flops / 1e12,
                100.0 * med * flops / PEAK
            );
        }
        for &n in ns.iter().filter(|&&n| n > 0) {
            let mut v = Vec::new();
            // the GPU's time a step alone (replays back to back), after each counted repetition
            let mut alone = Vec::new();
            for r in 0..=reps {
                if d > 0 {
                    feed(&mut m, &table, &prompt(d, 1), 0, false)?;
                }
                let mut tok = prompt(1, 3 + r as u64)[0];
                let t = Instant::now();
                for i in 0..n {
                    tok = feed(&mut m, &table, &[tok], d + i, true)?
                        .ok_or_else(|| anyhow!("the step gave no token"))?;
                }
                let s = t.elapsed().as_secs_f64();
                if r > 0 {
                    v.push(n as f64 / s);
                    if let Some(a) = m.time_replays(REPLAYS)? {
                        alone.push(a);
                    }
                }
            }
            let (lo, hi) = (
                v.iter().cloned().fold(f64::MAX, f64::min),
                v.iter().cloned().fold(0.0, f64::max),
            );
            let med = median(&mut v);
            let host = if alone.is_empty() {
                String::new()
            } else {
                let a = median(&mut alone);
                format!(
                    "; the step alone {:.0} us (graph replays back to back), {:.1}% of a token's {:.0} us between steps",
                    a * 1e6,
                    100.0 * (1.0 - a * med),
                    1e6 / med
                )
            };
            let limit = match bw {
                Some((bw, from)) => {
                    let limit = bw / wbytes as f64;
                    format!(
                        "limit {limit:.0} tok/s at {:.2} TB/s ({from}): {:.0}%",
                        bw / 1e12,
                        100.0 * med / limit
                    )
                }
                None => "the driver reports no memory bandwidth".into(),
            };
            println!(
                "| {name} | {dev} | tg{n}{} | {med:.0} | {lo:.0} | {hi:.0} | {} per token; {limit}{host} |",
                if d > 0 { format!(" @ d{d}") } else { String::new() },
                human(wbytes),
            );
        }
    }
    Ok(())
}

/// Reads `name` of a safetensors file as f32 (F32) or i32 (I32) values.
fn st_tensor(st: &safetensors::SafeTensors, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let v = st.tensor(name)?;
    let vals = match v.dtype() {
        safetensors::Dtype::F32 => v
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        safetensors::Dtype::I32 => v
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        other => anyhow::bail!("{name}: unexpected dtype {other:?}"),
    };
    Ok((v.shape().to_vec(), vals))
}

/// Greedy continuation of `prompt` on the GPU (the sequence starts at position 0).
fn gpu_greedy(m: &mut CudaModel, table: &[u32], prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let mut next = feed(m, table, prompt, 0, true)?;
    let mut out = Vec::new();
    for i in 0..n {
        let t = next.ok_or_else(|| anyhow!("the step gave no token"))?;
        out.push(t);
        if i + 1 < n {
            next = feed(m, table, &[t], prompt.len() + i, true)?;
        }
    }
    Ok(out)
}

/// Where a mixture's logits leave a reference because of a routing near-tie: the first
/// position over `tol`, the largest error before it, and the GPU's router margin there.
struct RoutingTie {
    pos: usize,
    before: f32,
    margin: f32,
}

/// Whether the first position whose error (`errs`, one a position) passes `tol` is one where
/// two experts were within the GPU's own rounding of each other (a router margin under twice
/// the error before it): the GPU took the other route, which a later position inherits
/// through the cache. None for models without experts (`margins` empty), for agreement, and
/// where the margins are not one a position (a prompt run in more than one pass).
fn routing_tie(errs: &[f32], margins: &[f32], tol: f32) -> Option<RoutingTie> {
    if margins.len() != errs.len() {
        return None;
    }
    let pos = errs.iter().position(|&e| e > tol)?;
    let before = errs[..pos].iter().copied().fold(0f32, f32::max);
    let margin = *margins.get(pos)?;
    (margin < 2.0 * before.max(1e-4)).then_some(RoutingTie {
        pos,
        before,
        margin,
    })
}

/// `kestrel gpu-check`: the op harness, mat-vec speed, and for each model the GPU's logits and
/// greedy tokens against the CPU path of this binary (and against the fixture's reference
/// logits when a `reference.safetensors` sits beside it). `ops`: the op harness's groups
/// (all when empty, none with `none`); `perf`: the speed groups to time (all when empty).
/// Exit status 1 when a check fails.
pub fn check(
    ordinal: usize,
    models: &[std::path::PathBuf],
    prompt_len: usize,
    gen: usize,
    perf: Option<&[String]>,
    ops: &[String],
) -> Result<()> {
    let timed = |group: &str| perf.is_some_and(|g| g.is_empty() || g.iter().any(|n| n == group));
    let mut failed = 0usize;
    {
        let mut gpu = Gpu::open(ordinal)?;
        println!(
            "device: {} ({}, {} SMs), kernels {} in {:.0} ms",
            gpu.name,
            gpu.arch,
            gpu.sms,
            if gpu.kernels_cached {
                "from the cache"
            } else {
                "compiled by NVRTC"
            },
            gpu.kernels_ms
        );
        if ops != ["none"] {
            let t = Instant::now();
            let results = kestrel_cuda::check::run_all(&mut gpu, 1, ops)?;
            for r in &results {
                println!(
                    "{} {:<90} rel err {:.2e} (tol {:.0e})",
                    if r.pass() { "ok  " } else { "FAIL" },
                    r.op,
                    r.err,
                    r.tol
                );
            }
            let bad = results.iter().filter(|r| !r.pass()).count();
            println!(
                "op harness: {} cases, {bad} failed ({:.1} s)",
                results.len(),
                t.elapsed().as_secs_f64()
            );
            failed += bad;
        }
        // a rate in GB/s as a share of the card's bandwidth
        let bw = gpu.mem_bandwidth;
        let share = |gbs: f64| match bw {
            Some((bw, _)) => format!(" ({:.0}% of {:.0})", 1e11 * gbs / bw, bw / 1e9),
            None => String::new(),
        };
        let mut rng = kestrel_cuda::check::Rng::new(7);
        if timed("matvec") {
            for (ty, us, gbs) in kestrel_cuda::check::perf_matvec(&mut gpu, &mut rng)? {
                let shape = if ty.contains(' ') { "" } else { " 12288x4096" };
                println!("perf mat-vec {ty:<5}{shape}, 1 token: {us:7.1} us, {gbs:6.0} GB/s of weights{}", share(gbs));
            }
        }
        if timed("mmq") {
            for (what, us, gbs, tops) in kestrel_cuda::check::perf_mmq(&mut gpu, &mut rng)? {
                println!("perf mat-mat {what}: {us:7.1} us, {gbs:6.0} GB/s of weights{}, {tops:6.1} TOPS", share(gbs));
            }
        }
        if timed("decode") {
            for (what, us, gbs) in kestrel_cuda::check::perf_decode(&mut gpu, &mut rng)? {
                println!(
                    "perf decode attention {what}: {us:7.1} us, {gbs:6.0} GB/s of K/V{}",
                    share(gbs)
                );
            }
        }
        if timed("moe") {
            for (what, us, gbs) in kestrel_cuda::check::perf_moe(&mut gpu, &mut rng)? {
                println!(
                    "perf moe {what}: {us:7.1} us, {gbs:6.0} GB/s of expert weights{}",
                    share(gbs)
                );
            }
        }
        if timed("delta") {
            for (what, us, gbs) in kestrel_cuda::check::perf_delta_rule(&mut gpu, &mut rng)? {
                println!("perf delta rule {what}: {us:7.1} us, {gbs:6.0} GB/s of state");
            }
        }
        if timed("flash") {
            for (what, split, flash, tflops) in kestrel_cuda::check::perf_flash(&mut gpu, &mut rng)?
            {
                println!("perf prompt attention {what}: decode kernel {split:8.1} us, tensor cores {flash:8.1} us ({tflops:.0} TFLOP/s)");
            }
        }
        if timed("download") {
            for (way, ms, gbs) in kestrel_cuda::check::perf_download(&gpu)? {
                println!("perf download {way}: {ms:.2} ms, {gbs:.1} GB/s");
            }
        }
    }
    for path in models {
        let src = ModelSource::open(path)?;
        let name = path.display();
        let vocab = src.config.vocab_size;
        // fixture reference (transformers, f64)
        // beside a GGUF, or inside a Hugging Face folder
        let folder = if path.is_dir() {
            Some(path.as_path())
        } else {
            path.parent()
        };
        let reference = folder
            .map(|d| d.join("reference.safetensors"))
            .filter(|p| p.exists());
        let ctx = (prompt_len + gen + 8).max(400);
        let (mut gm, _) = open_cuda(&src, ordinal, ctx, 0, 16, None, true)?;
        let table: Vec<u32> = (0..ctx.div_ceil(16) as u32).collect();
        if let Some(refp) = reference {
            let bytes = std::fs::read(&refp)?;
            let st = safetensors::SafeTensors::deserialize(&bytes)?;
            for i in 0.. {
                let Ok((_, toks)) = st_tensor(&st, &format!("tokens_{i}")) else {
                    break;
                };
                let toks: Vec<u32> = toks.iter().map(|&t| t as u32).collect();
                let (_, want) = st_tensor(&st, &format!("logits_{i}"))?;
                let got = gm.forward(&[SeqIn {
                    tokens: &toks,
                    start: 0,
                    blocks: &table,
                    want_logits: true,
                    all_logits: true,
                    slot: 0,
                    argmax_only: false,
                }])?;
                let margins = gm.route_margins()?;
                let errs: Vec<f32> = got
                    .chunks_exact(vocab)
                    .zip(want.chunks_exact(vocab))
                    .map(|(a, b)| {
                        a.iter()
                            .zip(b)
                            .map(|(x, y)| (x - y).abs())
                            .fold(0f32, f32::max)
                    })
                    .collect();
                let worst = errs.iter().copied().fold(0f32, f32::max);
                let (_, greedy) = st_tensor(&st, &format!("greedy_{i}"))?;
                let want_g: Vec<u32> = greedy.iter().map(|&t| t as u32).collect();
                let got_g = gpu_greedy(&mut gm, &table, &toks, want_g.len())?;
                let tie = routing_tie(&errs, &margins, 1e-2);
                let ok = (worst <= 1e-2 && got_g == want_g) || tie.is_some();
                failed += !ok as usize;
                let status = if ok { "ok  " } else { "FAIL" };
                if let Some(t) = tie {
                    println!("{status} {name}: reference prompt {i} ({} tokens): max |logit err| {:.2e} (tol 1e-2) up to position {}, where a route meets a near-tie (router margin {:.1e}); not compared past it", toks.len(), t.before, t.pos, t.margin);
                } else {
                    println!("{status} {name}: reference prompt {i} ({} tokens): max |logit err| {worst:.2e} (tol 1e-2), greedy {} of {} equal", toks.len(), got_g.iter().zip(&want_g).take_while(|(a, b)| a == b).count(), want_g.len());
                }
            }
        }
        // CPU path of this binary (quantized kernels) against the GPU
        let mut cpu = src.load_model(LoadOptions::default(), true)?;
        let prompt: Vec<u32> = (0..prompt_len as u64)
            .map(|i| ((i * 7919 + 17) % vocab as u64) as u32)
            .collect();
        let mut cache = cpu.new_cache(ctx, KvType::F16);
        let cpu_logits = cpu.forward(&prompt, &mut cache, kestrel_models::Logits::All)?;
        let gpu_logits = gm.forward(&[SeqIn {
            tokens: &prompt,
            start: 0,
            blocks: &table,
            want_logits: true,
            all_logits: true,
            slot: 0,
            argmax_only: false,
        }])?;
        let route_margins = gm.route_margins()?;
        // each position's largest |a - b| over its row's spread (max - min of b)
        let row_errs = |a: &[f32], b: &[f32]| -> Vec<f32> {
            b.chunks_exact(vocab)
                .zip(a.chunks_exact(vocab))
                .map(|(c, g)| {
                    let spread = c.iter().cloned().fold(f32::MIN, f32::max)
                        - c.iter().cloned().fold(f32::MAX, f32::min);
                    let e = c
                        .iter()
                        .zip(g)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max);
                    e / spread.max(1e-9)
                })
                .collect()
        };
        // a mixture's prompt that meets a routing near-tie is compared up to it (as against the
        // reference above): past it the two paths run different experts
        let errs = row_errs(&gpu_logits, &cpu_logits);
        let tie = routing_tie(&errs, &route_margins, 2e-2);
        let upto = tie.as_ref().map_or(prompt_len, |t| t.pos.max(1)) * vocab;
        // worst |a - b| over each row's spread
        let spread_err = |a: &[f32], b: &[f32]| -> f64 {
            row_errs(a, b).into_iter().fold(0f32, f32::max) as f64
        };
        let worst = errs[..upto / vocab].iter().copied().fold(0f32, f32::max) as f64;
        let max_abs = gpu_logits[..upto]
            .iter()
            .zip(&cpu_logits[..upto])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let rel = kestrel_cuda::check::rel_err(&gpu_logits[..upto], &cpu_logits[..upto]);
        // both against the CPU's f32 reference path on the first positions
        let n_ref = prompt_len.min(16).min(upto / vocab);
        cpu.set_matmul_path(kestrel_models::MatmulPath::Reference);
        let mut ref_cache = cpu.new_cache(ctx, KvType::F32);
        let ref_logits = cpu.forward(
            &prompt[..n_ref],
            &mut ref_cache,
            kestrel_models::Logits::All,
        )?;
        cpu.set_matmul_path(kestrel_models::MatmulPath::Quantized);
        let g_ref = spread_err(&gpu_logits[..n_ref * vocab], &ref_logits);
        let q_ref = spread_err(&cpu_logits[..n_ref * vocab], &ref_logits);
        let g_ref_l2 = kestrel_cuda::check::rel_err(&gpu_logits[..n_ref * vocab], &ref_logits);
        let q_ref_l2 = kestrel_cuda::check::rel_err(&cpu_logits[..n_ref * vocab], &ref_logits);
        println!(
            "     {name}: against the CPU f32 reference path over {n_ref} positions: GPU {g_ref:.2e} of spread (rel L2 {g_ref_l2:.2e}), CPU quantized {q_ref:.2e} (rel L2 {q_ref_l2:.2e})"
        );
        // greedy: each path continues from its own choices
        let mut cpu_toks = Vec::new();
        let mut last = cpu_logits[(prompt_len - 1) * vocab..].to_vec();
        let mut margins = Vec::new();
        for _ in 0..gen {
            let t = argmax(&last);
            cpu_toks.push(t);
            let mut sorted = last.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            margins.push(sorted[0] - sorted[1]);
            last = cpu.forward(&[t], &mut cache, kestrel_models::Logits::Last)?;
        }
        let gpu_toks = gpu_greedy(&mut gm, &table, &prompt, gen)?;
        let same = cpu_toks
            .iter()
            .zip(&gpu_toks)
            .take_while(|(a, b)| a == b)
            .count();
        // a near-tie: the CPU's top two differ by less than twice the largest logit difference
        // (or the prompt met a routing near-tie: the two paths continue from other states)
        let near_tie = same < gen && (margins[same] < 2.0 * max_abs || tie.is_some());
        gm.use_graphs = false;
        let eager = gpu_greedy(&mut gm, &table, &prompt, gen)?;
        gm.use_graphs = true;
        // the GPU may differ from the CPU's quantized path by its own rounding, but must be as
        // close to the f32 reference as that path is (or within 2% of the spread)
        let close = worst <= 2e-2 || g_ref <= 1.5 * q_ref;
        let ok = close && (same == gen || near_tie) && eager == gpu_toks;
        failed += !ok as usize;
        if let Some(t) = &tie {
            println!(
                "     {name}: the prompt meets a routing near-tie at position {} (router margin {:.1e}, largest error before it {:.2e} of the spread): compared up to it",
                t.pos, t.margin, t.before
            );
        }
        println!(
            "{} {name}: GPU vs CPU logits over {} positions: worst |err| / spread {worst:.2e} (max |err| {max_abs:.3}; tol 2e-2 or as close to the f32 reference as the CPU), rel L2 {rel:.2e}; greedy {same} of {gen} equal{}; graph replay = eager: {} ({} programmatic edges in the last graph)",
            if ok { "ok  " } else { "FAIL" },
            upto / vocab,
            if same < gen { format!(" (first difference at {same}: CPU top-2 margin {:.3}{})", margins[same], if near_tie { ", a near-tie" } else { "" }) } else { String::new() },
            eager == gpu_toks,
            gm.programmatic_edges
        );
    }
    anyhow::ensure!(failed == 0, "{failed} GPU check(s) failed");
    Ok(())
}

/// Which GPU `bench` runs on, if any: `cuda[:N]` must open; `auto` takes GPU 0 when it opens.
pub fn bench_device(device: Device) -> Result<Option<usize>> {
    Ok(match device {
        Device::Cpu => None,
        Device::Cuda(n) => {
            Gpu::open(n)?;
            Some(n)
        }
        Device::Auto => Gpu::open(0).ok().map(|_| 0),
    })
}

/// `kestrel logits` on the GPU: every position's logits, or None when the CPU should run
/// (`--device cpu`, `--reference`, or `auto` without a GPU).
pub fn logits(
    src: &ModelSource,
    ids: &[u32],
    device: Device,
    reference: bool,
) -> Result<Option<Vec<f32>>> {
    let ordinal = match (device, reference) {
        (_, true) | (Device::Cpu, _) => return Ok(None),
        (Device::Cuda(n), _) => n,
        (Device::Auto, _) => match Gpu::open(0) {
            Ok(_) => 0,
            Err(_) => return Ok(None),
        },
    };
    let (mut m, _) = open_cuda(src, ordinal, ids.len(), 0, 16, None, true)?;
    let table: Vec<u32> = (0..ids.len().div_ceil(16) as u32).collect();
    Ok(Some(m.forward(&[SeqIn {
        tokens: ids,
        start: 0,
        blocks: &table,
        want_logits: true,
        all_logits: true,
        slot: 0,
        argmax_only: false,
    }])?))
}

/// Compiles the kernels with NVRTC for `arch` and reports the time (no GPU needed); with
/// `out`, writes the cubin there for `KESTREL_CUDA_CUBINS`.
pub fn compile_only(arch: &str, out: Option<&std::path::Path>) -> Result<()> {
    kestrel_cuda::probe::nvrtc()?;
    let t = Instant::now();
    let (what, bytes) = match out {
        Some(dir) => {
            let (path, n) = kestrel_cuda::compile::write_shipped(arch, dir)?;
            (format!(" into {}", path.display()), n)
        }
        None => {
            let src = kestrel_cuda::compile::source()?;
            (
                String::new(),
                kestrel_cuda::compile::compile(&src, arch)?.len(),
            )
        }
    };
    println!(
        "kernels compiled for {arch}{what}: {bytes} bytes in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::routing_tie;

    #[test]
    fn a_routing_tie_explains_only_a_break_at_a_thin_margin() {
        let errs = [1e-3, 2e-3, 0.5, 0.01];
        // the first position over 1e-2 is 2; its margin is under twice the 2e-3 before it
        let tie = routing_tie(&errs, &[1.0, 1.0, 1e-6, 1.0], 1e-2).expect("a tie");
        assert_eq!((tie.pos, tie.before), (2, 2e-3));
        // a wide margin there: a real difference, not explained
        assert!(routing_tie(&errs, &[1e-6, 1e-6, 0.5, 1e-6], 1e-2).is_none());
        // agreement, a model without experts, margins of another pass
        assert!(routing_tie(&[1e-3, 2e-3], &[1e-6, 1e-6], 1e-2).is_none());
        assert!(routing_tie(&errs, &[], 1e-2).is_none());
        assert!(routing_tie(&errs, &[1.0, 1.0, 1e-6], 1e-2).is_none());
    }
}
