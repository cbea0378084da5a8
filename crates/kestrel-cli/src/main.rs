//! `kestrel`: the command line front end.

mod commands;
mod generate;
mod gpu;
mod source;
mod spec;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kestrel",
    version,
    about = "Local LLM inference for coding agents, shell helpers and chat"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Architecture, hyper-parameters, tensors, tokenizer and the memory plan of a model.
    Info {
        #[arg(short, long)]
        model: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The plan with a folder's weights quantized at load (see `run --quantize`).
        #[arg(long, value_parser = commands::run::parse_quant_mix)]
        quantize: Option<kestrel_models::quantize::QuantMix>,
    },
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        #[arg(short, long)]
        model: PathBuf,
        /// Tokenize special-token strings (e.g. <|im_start|>) as plain text.
        #[arg(long)]
        no_parse_special: bool,
        /// Add the model's BOS token when it asks for one.
        #[arg(long)]
        add_special: bool,
        /// Also print each token's piece.
        #[arg(long)]
        pieces: bool,
        text: String,
    },
    /// Print the text of comma-separated token ids.
    Detokenize {
        #[arg(short, long)]
        model: PathBuf,
        ids: String,
    },
    /// Render a conversation with the model's own chat template.
    Template {
        #[arg(short, long)]
        model: PathBuf,
        /// JSON file with an array of {role, content} messages.
        #[arg(long)]
        messages: PathBuf,
        /// JSON file with an array of OpenAI-style tool definitions.
        #[arg(long)]
        tools: Option<PathBuf>,
        #[arg(long)]
        no_generation_prompt: bool,
    },
    /// Generate a completion, streamed to stdout.
    Run(commands::run::RunArgs),
    /// Measure prompt-eval and decode speed (llama-bench's pp / tg / depth) beside the
    /// machine's read bandwidth, with a parity check against the reference path.
    Bench(commands::bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(commands::serve::ServeArgs),
    /// An interactive conversation that keeps the KV cache between turns.
    Chat(commands::chat::ChatArgs),
    /// Quantize an F32/F16/BF16 GGUF or a Hugging Face folder into a GGUF file.
    Quantize(commands::quantize::QuantizeArgs),
    /// The machine's streaming read bandwidth in bytes/s. `bench` runs it as a child process
    /// next to each decode repetition, so its buffer never counts in the bench's peak RSS.
    #[command(hide = true)]
    ReadBandwidth {
        #[arg(short, long, default_value_t = 1)]
        threads: usize,
    },
    /// Write the logits of every prompt position to a safetensors file.
    Logits {
        #[arg(short, long)]
        model: PathBuf,
        /// Comma-separated token ids.
        #[arg(long)]
        prompt_ids: String,
        #[arg(long)]
        out: PathBuf,
        /// Use the scalar f32 reference kernels instead of the quantized ones.
        #[arg(long)]
        reference: bool,
        #[arg(short, long)]
        threads: Option<usize>,
        /// KV cache element type: f32 (default here, for parity), f16 or q8_0.
        #[arg(long, default_value = "f32")]
        kv_type: String,
        /// cpu, cuda, cuda:N, or auto (the GPU when one is present).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Check the CUDA backend on this machine's GPU: every op against the CPU, mat-vec speed,
    /// and each model's logits and greedy tokens against the CPU path.
    #[command(hide = true)]
    GpuCheck {
        #[arg(long, default_value = "cuda")]
        device: String,
        #[arg(short, long)]
        model: Vec<PathBuf>,
        #[arg(long, default_value_t = 32)]
        prompt_len: usize,
        #[arg(long, default_value_t = 32)]
        gen: usize,
        /// Also time the kernels: every group, or those named, comma-separated (matvec, mmq,
        /// decode, delta, flash, download, moe).
        #[arg(long, num_args = 0.., value_delimiter = ',')]
        perf: Option<Vec<String>>,
        /// The op harness's groups to run, comma-separated (matvec, mvx, mmq, mmq_group, norm,
        /// argmax, epilogue, attention, flash, deltanet, gemm_embed, qkv_rope, moe), or none;
        /// default all.
        #[arg(long, value_delimiter = ',')]
        ops: Vec<String>,
        /// Only compile the kernels with NVRTC for this architecture (needs no GPU).
        #[arg(long)]
        compile_only: Option<String>,
        /// With --compile-only: write the cubin into this directory, under the name a start with
        /// KESTREL_CUDA_CUBINS=DIR loads instead of compiling (scripts/gpu/bundle.sh).
        #[arg(long, requires = "compile_only")]
        out: Option<PathBuf>,
    },
}

/// Keeps freed activation buffers in the heap: glibc would otherwise return every large
/// buffer to the OS and the kernel would zero fresh pages for the next matmul (measured: 11% of
/// prefill time in `clear_page_erms`).
fn keep_freed_memory_in_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: plain glibc tuning calls, made before any other thread exists.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 1 << 30);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

fn main() -> ExitCode {
    keep_freed_memory_in_heap();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info {
            model,
            json,
            quantize,
        } => source::ModelSource::open(&model)
            .and_then(|s| s.quantized(quantize))
            .and_then(|s| commands::info::run(&s, json)),
        Command::Tokenize {
            model,
            no_parse_special,
            add_special,
            pieces,
            text,
        } => commands::tokens::tokenize(&model, &text, add_special, !no_parse_special, pieces),
        Command::Detokenize { model, ids } => commands::tokens::detokenize(&model, &ids),
        Command::Template {
            model,
            messages,
            tools,
            no_generation_prompt,
        } => commands::tokens::template(&model, &messages, tools.as_deref(), !no_generation_prompt),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Quantize(args) => commands::quantize::run(args),
        Command::ReadBandwidth { threads } => {
            println!("{}", commands::bench::read_bandwidth(threads));
            Ok(())
        }
        Command::Logits {
            model,
            prompt_ids,
            out,
            reference,
            threads,
            kv_type,
            device,
        } => gpu::Device::parse(&device).and_then(|d| {
            commands::logits::run(&model, &prompt_ids, &out, reference, threads, &kv_type, d)
        }),
        Command::GpuCheck {
            device,
            model,
            prompt_len,
            gen,
            perf,
            ops,
            compile_only: Some(arch),
            out,
        } => {
            let _ = (device, model, prompt_len, gen, perf, ops);
            gpu::compile_only(&arch, out.as_deref())
        }
        Command::GpuCheck {
            device,
            model,
            prompt_len,
            gen,
            perf,
            ops,
            compile_only: None,
            out: _,
        } => match gpu::Device::parse(&device) {
            Ok(gpu::Device::Cuda(n)) => {
                gpu::check(n, &model, prompt_len, gen, perf.as_deref(), &ops)
            }
            Ok(_) => Err(anyhow::anyhow!("gpu-check needs --device cuda or cuda:N")),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

/// Parses comma-separated token ids ("1,2, 3").
pub fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>().map_err(|_| {
                anyhow::anyhow!(
                    "'{p}' is not a token id (expected comma-separated non-negative integers)"
                )
            })
        })
        .collect()
}
