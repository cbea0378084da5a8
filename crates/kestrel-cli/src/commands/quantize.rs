//! `kestrel quantize IN OUT --type T`: an F32/F16/BF16 GGUF or a Hugging Face folder into a
//! quantized GGUF, with llama.cpp's type mixture for the `_m` types.

use super::info::human;
use anyhow::{bail, Context, Result};
use clap::Args;
use kestrel_gguf::{GgmlType, GgufFile};
use kestrel_models::quantize::{self, QuantMix};
use kestrel_models::weights::TensorStore;
use kestrel_models::ModelConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct QuantizeArgs {
    /// An F32/F16/BF16 GGUF file or a Hugging Face folder (config.json + *.safetensors).
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
    /// q8_0, q4_0, q4_k_m, q5_k_m or q6_k (the `_m` types mix in higher types where llama.cpp
    /// does: attention v, ffn_down of some layers, the output).
    #[arg(long = "type", default_value = "q4_k_m")]
    pub ty: String,
    /// Threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
}

pub fn run(args: QuantizeArgs) -> Result<()> {
    let mix = QuantMix::parse(&args.ty)
        .with_context(|| format!("--type {}: one of {}", args.ty, QuantMix::NAMES))?;
    if args.output.exists() && args.output.canonicalize().ok() == args.input.canonicalize().ok() {
        bail!("the output {} is the input", args.output.display());
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let (store, cfg, file) = if args.input.is_dir() {
        let cfg_path = args.input.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("reading {}", cfg_path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", cfg_path.display()))?;
        let cfg = ModelConfig::from_hf_json(&json)?;
        (TensorStore::from_hf_dir(&args.input)?, cfg, None)
    } else {
        let file = GgufFile::open(&args.input)?;
        let cfg = ModelConfig::from_gguf(&file.header)?;
        (TensorStore::from_gguf(&file), cfg, Some(file))
    };
    let plan = quantize::plan(&store, &cfg, file.as_ref().map(|f| &f.header), mix)?;
    let (before, after) = plan.sizes();
    eprintln!(
        "quantizing {} ({} {}, {} tensors, {}) to {} as {}",
        args.input.display(),
        cfg.arch.name(),
        if file.is_some() { "GGUF" } else { "folder" },
        plan.tensors.len(),
        human(before),
        args.output.display(),
        mix.name()
    );
    let bar = indicatif::ProgressBar::new(before);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "quantizing {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let written = quantize::write_gguf(&store, &plan, &args.output, threads, &mut |done, _| {
        bar.set_position(done)
    });
    bar.finish_and_clear();
    if let Err(e) = written {
        // never leave a half-written file behind
        let _ = std::fs::remove_file(&args.output);
        return Err(e.into());
    }
    // summary: what each type took
    let mut by_type: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
    for t in &plan.tensors {
        let e = by_type.entry(t.spec.ty).or_default();
        e.0 += 1;
        e.1 += t.bytes();
    }
    let n = plan.n_elements().max(1) as f64;
    println!(
        "wrote {} in {:.1} s",
        args.output.display(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "size   {} -> {} ({:.1}%), {:.2} -> {:.2} bits per weight",
        human(before),
        human(after),
        100.0 * after as f64 / before.max(1) as f64,
        before as f64 * 8.0 / n,
        after as f64 * 8.0 / n
    );
    for (ty, (count, bytes)) in by_type {
        println!("  {ty:<6} {count:>5} tensors {:>12}", human(bytes));
    }
    Ok(())
}
