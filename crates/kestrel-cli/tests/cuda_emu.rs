//! The CUDA backend where no GPU is: the same binary with `--device cuda` on the CPU emulation
//! of a device (crates/kestrel-cuda/emu, built here by scripts/cuda-emu.sh with g++), which
//! runs every kernel's CUDA C++ on the CPU, warp-wide instructions and barriers included.
//! `gpu-check` runs the op harness (every kernel against the CPU reference) and the tiny
//! models against transformers' logits and the CPU path, as on a GPU host; `run --device cuda`
//! goes through the serving engine. What the kernels compute is checked here; their speed only
//! on a GPU (scripts/gpu/h200.sh).
//!
//! Without g++ the tests say they skipped, unless KESTREL_REQUIRE_CUDA_EMU=1 (scripts/test.sh)
//! makes that a failure; an emulation that does not build or fails its self-test fails them.

mod common;

use common::{reference_ints, root, tiny};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn tiny_gguf(arch: &str) -> PathBuf {
    tiny(arch).join(format!("{arch}-f32.gguf"))
}

/// The emulation's library directory, built once per test binary (with its self-test) and its
/// kernels compiled into the cache there; None (after saying why) when g++ is missing.
fn emulation() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if Command::new("g++").arg("--version").output().is_err() {
            assert!(
                std::env::var("KESTREL_REQUIRE_CUDA_EMU").as_deref() != Ok("1"),
                "the CUDA emulation needs g++"
            );
            eprintln!("skipped: the CUDA emulation needs g++");
            return None;
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda-emu");
        let out = Command::new("bash")
            .arg(root().join("scripts/cuda-emu.sh"))
            .arg(&dir)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "the CUDA emulation did not build or its self-test failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // the kernels compiled once, before tests start servers that would each wait for it
        let warm = kestrel_emulated(&dir, &["gpu-check", "--ops", "none"]);
        let stdout = String::from_utf8_lossy(&warm.stdout);
        assert!(
            warm.status.success() && stdout.contains("kestrel CUDA emulation (CPU)"),
            "the emulated device did not open (another libcuda first?):\n{stdout}\n{}",
            String::from_utf8_lossy(&warm.stderr)
        );
        Some(dir)
    })
    .as_ref()
}

/// `kestrel ARGS` on the emulated device: its libraries first on the library path, compiled
/// kernels cached beside them.
fn kestrel_emulated(dir: &Path, args: &[&str]) -> Output {
    kestrel_emulated_as(dir, "9.0", args)
}

/// As [`kestrel_emulated`] on a device of compute capability `cc` ("8.6": an RTX 30x0).
fn kestrel_emulated_as(dir: &Path, cc: &str, args: &[&str]) -> Output {
    kestrel_emulated_with(dir, &[("KESTREL_CUDA_EMU_CC", cc)], args)
}

/// The arguments of `kestrel run` for 24 greedy tokens after the prompt `ids` (comma-separated)
/// on the CUDA device, printed as JSON.
fn greedy_run_args<'a>(model: &'a str, ids: &'a str) -> [&'a str; 13] {
    [
        "run",
        "-m",
        model,
        "--prompt-ids",
        ids,
        "-n",
        "24",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
        "--device",
        "cuda",
    ]
}

/// As [`kestrel_emulated`] with the variables `env` set too.
fn kestrel_emulated_with(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("KESTREL_CUDA_EMU_CC", "9.0")
        .envs(env.iter().copied())
        .output()
        .expect("kestrel runs")
}

#[test]
fn gpu_check_passes_on_the_emulated_device() {
    let Some(dir) = emulation() else { return };
    let models: Vec<PathBuf> = ["llama", "qwen2", "qwen3", "qwen3_5", "qwen3_moe"]
        .iter()
        .map(|a| tiny_gguf(a))
        .collect();
    let mut args = vec!["gpu-check"];
    for m in &models {
        args.extend(["--model", m.to_str().unwrap()]);
    }
    let out = kestrel_emulated(dir, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        out.status.success() && failures.is_empty(),
        "gpu-check failed on the emulated device:\n{}\n{}",
        failures.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    // the op harness ran (every case passed, above), and each model met both of its references
    let harness = stdout
        .lines()
        .find(|l| l.starts_with("op harness:"))
        .expect("the op harness ran");
    let cases: usize = harness
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .expect("a case count");
    assert!(cases > 1000, "{harness}");
    for m in &models {
        let name = m.display().to_string();
        let ok = |what: &str| {
            stdout
                .lines()
                .filter(|l| l.starts_with("ok") && l.contains(&name) && l.contains(what))
                .count()
        };
        assert_eq!(ok("reference prompt"), 4, "{name}: {stdout}");
        assert_eq!(ok("GPU vs CPU logits"), 1, "{name}: {stdout}");
    }
    // the mixture's fourth prompt crosses a routing near-tie (layer 0, position 173: its 2nd
    // and 3rd experts 2.3e-5 apart in probability on the CPU's f32 path): compared up to it
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("qwen3_moe") && l.contains("up to position 173")),
        "{stdout}"
    );
    // on sm_90 the captured steps' kernel -> kernel edges were made programmatic (graph.rs)
    assert!(
        stdout
            .lines()
            .filter(|l| l.contains("GPU vs CPU logits"))
            .all(|l| !l.contains("(0 programmatic edges")),
        "{stdout}"
    );
}

/// Q5_K_M files (the tiny models' rows are no multiple of 256, so their tensors are Q5_1 and
/// Q8_0, as llama.cpp's quantizer falls back for them) run on the GPU as on the CPU, dense,
/// hybrid and mixture (its expert stacks quantized): the GPU read only Q4_K_M-style types before; the op harness checks the Q5_K kernels
/// themselves.
#[test]
fn q5_k_m_files_run_on_the_emulated_device() {
    let Some(dir) = emulation() else { return };
    let mut args = vec!["gpu-check".to_string(), "--ops".into(), "none".into()];
    for arch in ["qwen3", "qwen3_5", "qwen3_moe"] {
        let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tiny-{arch}-q5_k_m.gguf"));
        let q = Command::new(env!("CARGO_BIN_EXE_kestrel"))
            .arg("quantize")
            .arg(tiny_gguf(arch))
            .arg(&file)
            .args(["--type", "q5_k_m"])
            .output()
            .expect("kestrel runs");
        let listing = String::from_utf8_lossy(&q.stdout);
        assert!(
            q.status.success() && listing.contains("Q5_1"),
            "{listing}{}",
            String::from_utf8_lossy(&q.stderr)
        );
        args.extend(["--model".into(), file.to_str().unwrap().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kestrel_emulated(dir, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let checked = stdout
        .lines()
        .filter(|l| l.starts_with("ok") && l.contains("GPU vs CPU logits"))
        .count();
    assert!(
        out.status.success() && checked == 3,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The q/k/v products of one token with their epilogue in the same kernel, and the RMSNorm
/// before them too (`mvx_1_norm_rope` / `mvx_1_rope`, taken by families without per-head norms
/// over 8-bit activation types): a quantized tiny qwen2 decodes the same greedy tokens with
/// both folds, with the epilogue's alone (`KESTREL_CUDA_NORM_FOLD=0`) and with neither
/// (`KESTREL_CUDA_QKV_FOLD=0`), its step graph one kernel shorter a layer for each fold.
#[test]
fn the_folded_qkv_epilogue_decodes_as_the_two_kernels() {
    let Some(dir) = emulation() else { return };
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tiny-qwen2-q8_0.gguf");
    let q = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .arg("quantize")
        .arg(tiny_gguf("qwen2"))
        .arg(&file)
        .args(["--type", "q8_0"])
        .output()
        .expect("kestrel runs");
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let model = file.to_str().unwrap();
    let ids: Vec<String> = reference_ints("qwen2", "tokens_0")
        .iter()
        .map(|t| t.to_string())
        .collect();
    let ids = ids.join(",");
    let run = |fold: &str, norm: &str| -> (serde_json::Value, usize) {
        let env = [
            ("KESTREL_CUDA_QKV_FOLD", fold),
            ("KESTREL_CUDA_NORM_FOLD", norm),
        ];
        let out = kestrel_emulated_with(dir, &env, &greedy_run_args(model, &ids));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let check =
            kestrel_emulated_with(dir, &env, &["gpu-check", "--ops", "none", "--model", model]);
        let stdout = String::from_utf8_lossy(&check.stdout).into_owned();
        let edges = stdout
            .split("programmatic edges")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no edge count in {stdout}"));
        (v["tokens"].clone(), edges)
    };
    let (both, both_edges) = run("1", "1");
    let (epilogue, epilogue_edges) = run("1", "0");
    let (apart, apart_edges) = run("0", "1");
    assert!(both.as_array().is_some_and(|t| t.len() == 24), "{both}");
    assert_eq!(both, apart, "greedy tokens with both folds and without");
    assert_eq!(
        epilogue, apart,
        "greedy tokens with the epilogue's fold and without"
    );
    assert_eq!(
        both_edges + 4,
        epilogue_edges,
        "the norm: one kernel fewer a layer"
    );
    assert_eq!(
        epilogue_edges + 4,
        apart_edges,
        "the epilogue: one kernel fewer a layer"
    );
}

#[test]
fn run_on_the_emulated_device_reproduces_transformers_greedy() {
    let Some(dir) = emulation() else { return };
    // through the serving engine: paged KV, the step graphs, Qwen3.5's state slots, Qwen3-MoE's
    // routes
    for arch in ["llama", "qwen3_5", "qwen3_moe"] {
        let model = tiny_gguf(arch);
        for i in 0..3 {
            let ids: Vec<String> = reference_ints(arch, &format!("tokens_{i}"))
                .iter()
                .map(|t| t.to_string())
                .collect();
            let ids = ids.join(",");
            let out = kestrel_emulated(dir, &greedy_run_args(model.to_str().unwrap(), &ids));
            assert!(
                out.status.success(),
                "{arch} case {i}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            let got: Vec<u32> = v["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("a token id") as u32)
                .collect();
            assert_eq!(
                got,
                reference_ints(arch, &format!("greedy_{i}")),
                "{arch} case {i} on the emulated GPU"
            );
        }
    }
}

#[test]
fn serve_on_the_emulated_device_answers_as_the_cpu_server() {
    let Some(dir) = emulation() else { return };
    // scripts/gpu/serve-check.py, as the GPU host runs it: 16 concurrent greedy completions
    // equal between `serve --device cuda` and `--device cpu`, a stream, cached_tokens on a
    // repeated prompt, clients walking away mid-stream (counted cancelled, their blocks freed,
    // a cached request answered as before). The mixture's texts are not compared
    // (SERVE_EXACT=0): its seventh prompt's 15th greedy pick is a near-tie (top two 6.0e-4
    // apart on the CPU, the GPU 4.2e-4 off it), so only whole answers are asked of it.
    for (arch, exact) in [("qwen2", "1"), ("qwen3_5", "1"), ("qwen3_moe", "0")] {
        let out = Command::new("python3")
            .arg(root().join("scripts/gpu/serve-check.py"))
            .arg(env!("CARGO_BIN_EXE_kestrel"))
            .arg(tiny_gguf(arch))
            .env("SERVE_EXACT", exact)
            .env("LD_LIBRARY_PATH", dir)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("serve check: ok"),
            "{arch}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn other_gpu_generations_on_the_emulated_device() {
    let Some(dir) = emulation() else { return };
    let model = tiny_gguf("qwen3_5");
    let run = |cc: &str, device: &str| {
        kestrel_emulated_as(
            dir,
            cc,
            &[
                "run",
                "-m",
                model.to_str().unwrap(),
                "--prompt-ids",
                "1,2,3",
                "-n",
                "4",
                "--temp",
                "0",
                "--device",
                device,
            ],
        )
    };
    // Turing (7.5) lacks the mat-mats' int8 mma and cp.async: one line, exit 1, no NVRTC log;
    // `auto` runs on the CPU instead
    let out = run("7.5", "cuda");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("compute capability 7.5")
            && err.contains("8.0 or newer")
            && err.lines().count() == 1,
        "{err}"
    );
    let out = run("7.5", "auto");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Ampere / Ada (8.6: 99 KiB of shared memory a block, no programmatic launches): the
    // models' paths, and the decode-attention kernels whose shared memory fits, against their
    // references
    let models = [tiny_gguf("qwen3"), model.clone()];
    let mut args = vec!["gpu-check", "--ops", "attention"];
    for m in &models {
        args.extend(["--model", m.to_str().unwrap()]);
    }
    let out = kestrel_emulated_as(dir, "8.6", &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("(sm_86,")
            && stdout.contains("(0 programmatic edges in the last graph)"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("ok") && l.contains("reference prompt"))
            .count(),
        8,
        "{stdout}"
    );
}

#[test]
fn timeline_of_a_replayed_step_on_the_emulated_device() {
    let Some(dir) = emulation() else { return };
    // KESTREL_CUDA_TIMELINE: the stamped kernels (another build of the source) give the same
    // tokens, and one replayed step's launches come out named in the graph's order
    let arch = "llama";
    let csv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("timeline-llama.csv");
    let _ = std::fs::remove_file(&csv);
    let ids: Vec<String> = reference_ints(arch, "tokens_1")
        .iter()
        .map(|t| t.to_string())
        .collect();
    let model = tiny_gguf(arch);
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["run", "-m", model.to_str().unwrap(), "--prompt-ids"])
        .arg(ids.join(","))
        .args(["-n", "24", "--temp", "0", "--ignore-eos", "--json"])
        .args(["--device", "cuda"])
        .env("LD_LIBRARY_PATH", dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("KESTREL_CUDA_TIMELINE", &csv)
        .output()
        .expect("kestrel runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let got: Vec<u64> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("a token id"))
        .collect();
    let want: Vec<u64> = reference_ints(arch, "greedy_1")
        .iter()
        .map(|&t| t as u64)
        .collect();
    assert_eq!(got, want, "greedy tokens with the stamped kernels");
    let table = std::fs::read_to_string(&csv).expect("the timeline's CSV");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let summary = format!("one replayed decode step, {} launches", rows.len());
    assert!(
        rows.len() > 10 && stderr.contains(&summary) && !stderr.contains("may be off"),
        "{stderr}\n{table}"
    );
    // a step starts with the embedding; every launch has its kernel's name, a block at least,
    // and ends after its first block got past the wait
    assert_eq!(rows[0][1], "embed_rows", "{table}");
    for r in &rows {
        let n = |i: usize| r[i].parse::<i64>().unwrap_or(-1);
        assert!(
            r.len() == 10 && r[1] != "?" && n(2) >= 1 && n(7) >= n(5) && n(8) >= 0,
            "{table}"
        );
    }
}
