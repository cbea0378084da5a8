//! The `kestrel` binary as a user meets it: bad files end with one line and exit code 1,
//! `info` plans from tensor sizes, `run` reproduces the transformers greedy references.

mod common;

use common::{reference_ints, root, tiny};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kestrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(args)
        .output()
        .expect("kestrel runs")
}

fn tmp(name: &str) -> PathBuf {
    // Cargo's per-target scratch dir: kept inside target/, not left behind in /tmp.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kestrel-cli-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A failure must be exit code 1 and exactly one line on stderr, without a panic.
fn assert_clean_failure(out: &Output, must_mention: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(must_mention), "'{must_mention}' not in: {err}");
}

#[test]
fn non_gguf_file_is_refused_in_one_line() {
    let p = tmp("not-a-model.gguf");
    std::fs::write(&p, "just some text, not a model\n").unwrap();
    assert_clean_failure(
        &kestrel(&["info", "-m", p.to_str().unwrap()]),
        "not a GGUF file",
    );
}

#[test]
fn truncated_gguf_is_refused_in_one_line() {
    let bytes = std::fs::read(tiny("llama").join("llama-f32.gguf")).unwrap();
    for cut in [10, 3000, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp(&format!("truncated-{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = kestrel(&["info", "-m", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_clean_failure(&out, "");
        assert!(
            err.contains("truncated") || err.contains("past the end"),
            "cut {cut}: {err}"
        );
    }
}

#[test]
fn tensor_offset_past_the_end_is_refused_naming_the_tensor() {
    let mut bytes = std::fs::read(tiny("llama").join("llama-f32.gguf")).unwrap();
    // The tensor info of `output_norm.weight`: name, n_dims (u32), dims (u64 each), type (u32),
    // offset (u64). Point its offset far past the end of the file.
    let name = b"output_norm.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor name in header");
    let n_dims = u32::from_le_bytes(
        bytes[at + name.len()..at + name.len() + 4]
            .try_into()
            .unwrap(),
    ) as usize;
    let off = at + name.len() + 4 + 8 * n_dims + 4;
    bytes[off..off + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let p = tmp("offset-past-end.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let out = kestrel(&["info", "-m", p.to_str().unwrap()]);
    assert_clean_failure(&out, "output_norm.weight");
    assert!(String::from_utf8_lossy(&out.stderr).contains("past the end"));
}

#[test]
fn missing_file_and_bad_ids_are_clear_errors() {
    assert_clean_failure(
        &kestrel(&["info", "-m", "/no/such/model.gguf"]),
        "/no/such/model.gguf",
    );
    let m = tiny("qwen2").join("qwen2-f32.gguf");
    assert_clean_failure(
        &kestrel(&["detokenize", "-m", m.to_str().unwrap(), "1,x,3"]),
        "'x' is not a token id",
    );
    assert_clean_failure(
        &kestrel(&["detokenize", "-m", m.to_str().unwrap(), "99999"]),
        "outside the vocabulary",
    );
}

/// `info --json` plans weight bytes as the sum of every tensor's type x shape, plus, on CPUs
/// whose kernels repack Q4_K / Q6_K at load (AVX-512 VNNI or AVX2), each repacked matrix's
/// padding of its 16-row groups to 64 bytes (embeddings aside unless tied).
fn check_info(model: &Path) {
    let out = kestrel(&["info", "-m", model.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = kestrel_gguf::GgufFile::open(model).unwrap();
    let expected: u64 = file
        .header
        .tensors
        .iter()
        .map(|t| t.ggml_type.bytes_for(t.n_elements()).unwrap())
        .sum();
    // Repacked Q4_K / Q6_K matrices keep their bytes, each 16-row group padded to 64 bytes.
    let tied = !file
        .header
        .tensors
        .iter()
        .any(|t| t.name == "output.weight");
    let repacked: u64 = file
        .header
        .tensors
        .iter()
        .filter(|t| {
            let rows = t.dims.iter().skip(1).product::<u64>();
            matches!(
                t.ggml_type,
                kestrel_gguf::GgmlType::Q4_K | kestrel_gguf::GgmlType::Q6_K
            ) && (tied || t.name != "token_embd.weight")
                && kestrel_quant::repack::Repacked::supports(t.ggml_type, rows as usize)
        })
        .map(|t| {
            let rows = t.dims.iter().skip(1).product::<u64>();
            let group = t.n_bytes / rows * 16;
            rows / 16 * (group.next_multiple_of(64) - group)
        })
        .sum();
    assert_eq!(
        v["memory_plan"]["weight_bytes"].as_u64(),
        Some(expected + repacked)
    );
    assert!(expected < file.file_len());
    assert_eq!(
        v["tensor_count"].as_u64(),
        Some(file.header.tensors.len() as u64)
    );
    let contexts = v["memory_plan"]["contexts"].as_array().unwrap();
    let max = v["hyper_parameters"]["max_context"].as_u64().unwrap();
    assert_eq!(
        contexts.last().unwrap()["context"].as_u64(),
        Some(max),
        "the plan ends at the model's maximum"
    );
    assert!(v["tokenizer"]["vocab_size"].as_u64().unwrap() > 0);
}

#[test]
fn info_plans_weights_from_tensor_sizes() {
    for arch in ["llama", "qwen2", "qwen3"] {
        check_info(&tiny(arch).join(format!("{arch}-f32.gguf")));
    }
    for m in [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ] {
        let p = root().join("models").join(m);
        if p.exists() {
            check_info(&p);
        } else if std::env::var("KESTREL_REQUIRE_MODELS").is_ok_and(|v| v == "1") {
            panic!("{} missing", p.display());
        }
    }
}

#[test]
fn run_reproduces_transformers_greedy_continuations() {
    // qwen3_5: the hybrid model through the serving engine, its recurrent state in a slot;
    // qwen3_moe: the routed experts
    for arch in ["llama", "qwen2", "qwen3", "qwen3_5", "qwen3_moe"] {
        let ints = |name: &str| reference_ints(arch, name);
        for model in [tiny(arch), tiny(arch).join(format!("{arch}-f32.gguf"))] {
            for i in 0..3 {
                let prompt: Vec<String> = ints(&format!("tokens_{i}"))
                    .iter()
                    .map(|t| t.to_string())
                    .collect();
                let (got, v) = run_json(
                    model.to_str().unwrap(),
                    &prompt.join(","),
                    &["--kv-type", "f32"],
                    &[],
                );
                assert_eq!(
                    got,
                    ints(&format!("greedy_{i}")),
                    "{arch} {} case {i}",
                    model.display()
                );
                assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
            }
        }
    }
}

/// `run -m model --prompt-ids ids -n 24` greedy, with `--json`, the `extra` flags and the
/// environment `env`, checked to succeed: its tokens and its timings.
fn run_json(
    model: &str,
    ids: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vec<u32>, serde_json::Value) {
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .expect("kestrel runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (tokens, v["timings"].clone())
}

/// Greedy tokens of `run -m model extra...` on a tiny model's reference prompt `i`.
fn greedy_run(model: &str, arch: &str, i: usize, extra: &[&str]) -> Vec<u32> {
    let prompt: Vec<String> = reference_ints(arch, &format!("tokens_{i}"))
        .iter()
        .map(|t| t.to_string())
        .collect();
    run_json(model, &prompt.join(","), extra, &[]).0
}

/// `kestrel quantize` writes a GGUF that runs exactly as the folder quantized at load
/// (`--quantize`); quantizing a quantized file, or `--quantize` on a GGUF, is refused in one
/// line and leaves nothing behind.
#[test]
fn quantize_writes_what_quantizing_at_load_runs() {
    for arch in ["qwen3", "qwen3_moe"] {
        let folder = tiny(arch);
        let folder = folder.to_str().unwrap();
        for (ty, load) in [("q8_0", "q8_0"), ("q4_k_m", "q4_k")] {
            let out_path = tmp(&format!("{arch}-{ty}.gguf"));
            let out = out_path.to_str().unwrap();
            let q = kestrel(&["quantize", folder, out, "--type", ty, "-t", "2"]);
            assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
            let text = String::from_utf8_lossy(&q.stdout);
            assert!(text.contains("bits per weight"), "{text}");
            for i in 0..3 {
                assert_eq!(
                    greedy_run(out, arch, i, &[]),
                    greedy_run(folder, arch, i, &["--quantize", load]),
                    "{arch} {ty} case {i}"
                );
            }
        }
    }
    let q8 = tmp("qwen3-q8_0.gguf");
    let again = tmp("twice.gguf");
    let out = kestrel(&[
        "quantize",
        q8.to_str().unwrap(),
        again.to_str().unwrap(),
        "--type",
        "q4_0",
    ]);
    assert_clean_failure(&out, "already");
    assert!(
        !again.exists(),
        "a refused quantization left {}",
        again.display()
    );
    let out = kestrel(&[
        "quantize",
        tiny("qwen3").to_str().unwrap(),
        again.to_str().unwrap(),
        "--type",
        "q3",
    ]);
    assert_clean_failure(&out, "q4_k_m");
    let out = kestrel(&[
        "run",
        "-m",
        q8.to_str().unwrap(),
        "--quantize",
        "q8_0",
        "-p",
        "hi",
        "-n",
        "2",
    ]);
    assert_clean_failure(&out, "kestrel quantize");
}

/// `kestrel run` of `model` on the prompt `ids` (24 greedy tokens, f32 KV, the CPU, `--json`)
/// with the `spec` flags and `KESTREL_DRAFT_WEIGHTS=weights`: its tokens and timings.
fn spec_run(model: &str, ids: &str, spec: &[&str], weights: &str) -> (Vec<u32>, serde_json::Value) {
    let mut extra = vec!["--kv-type", "f32", "--device", "cpu"];
    extra.extend_from_slice(spec);
    run_json(model, ids, &extra, &[("KESTREL_DRAFT_WEIGHTS", weights)])
}

/// Speculative decoding (`--spec lookup`, and `--spec draft` with the model as its own draft)
/// keeps the transformers greedy continuations; on the hybrid model too (its recurrent state
/// backed up and restored around rejections), with the dense tiny-qwen2 (same vocabulary) as
/// its draft: nearly every proposal rejected, the tokens still exact. A hybrid draft is
/// refused in one line.
#[test]
fn speculative_run_keeps_the_greedy_continuations() {
    let gguf_of = |arch: &str| {
        let p = tiny(arch).join(format!("{arch}-f32.gguf"));
        p.to_str().unwrap().to_string()
    };
    let (qwen2_gguf, hybrid_gguf) = (gguf_of("qwen2"), gguf_of("qwen3_5"));
    let mut runs = 0;
    for arch in ["llama", "qwen2", "qwen3", "qwen3_5"] {
        let gguf = gguf_of(arch);
        let ints = |name: &str| reference_ints(arch, name);
        // (flags, KESTREL_DRAFT_WEIGHTS): a dense model drafts for itself, its matrices as a
        // draft holds them (4.5 bits), then as stored
        let drafter = if arch == "qwen3_5" {
            &qwen2_gguf
        } else {
            &gguf
        };
        let draft = vec!["--spec", "draft", "--draft-model", drafter, "--spec-k", "4"];
        let mut specs = vec![(vec!["--spec", "lookup"], ""), (draft.clone(), "")];
        if arch != "qwen3_5" {
            specs.push((draft, "stored"));
        }
        for i in 0..3 {
            let prompt: Vec<String> = ints(&format!("tokens_{i}"))
                .iter()
                .map(|t| t.to_string())
                .collect();
            let prompt = prompt.join(",");
            let want = ints(&format!("greedy_{i}"));
            for (spec, weights) in &specs {
                let (got, t) = spec_run(&gguf, &prompt, spec, weights);
                runs += 1;
                assert_eq!(got, want, "{arch} case {i} {spec:?}");
                if spec[1] != "draft" {
                    continue;
                }
                // A model drafting for itself: with its matrices as stored every proposal is
                // kept; held in 4.5 bits (source.rs DRAFT_TYPE) the random f32 weights'
                // near-ties flip many (some are kept), and the tokens above stay the target's
                // either way: every rejection rolled back exactly (the hybrid's state too).
                if arch == "qwen3_5" {
                    assert!(t["spec_proposed"].as_u64().unwrap() > 0, "{t}");
                    continue;
                }
                assert!(t["spec_accepted"].as_u64().unwrap() > 0, "{t}");
                if *weights == "stored" {
                    assert!(t["acceptance_rate"].as_f64().unwrap() > 0.9, "{t}");
                    assert!(t["tokens_per_step"].as_f64().unwrap() > 1.5, "{t}");
                }
            }
        }
    }
    assert_eq!(runs, 3 * (3 * 3 + 2));
    let out = kestrel(&[
        "run",
        "-m",
        &qwen2_gguf,
        "-p",
        "hi",
        "-n",
        "4",
        "--spec",
        "draft",
        "--draft-model",
        &hybrid_gguf,
        "--device",
        "cpu",
    ]);
    assert_clean_failure(&out, "cannot be rolled back");
    let out = kestrel(&["run", "-m", &hybrid_gguf, "-p", "hi", "--spec", "draft"]);
    assert_clean_failure(&out, "--draft-model");
    let out = kestrel(&[
        "run",
        "-m",
        &qwen2_gguf,
        "-p",
        "hi",
        "--spec",
        "lookup",
        "--device",
        "cuda",
    ]);
    assert_clean_failure(&out, "--spec runs on the CPU backend");
}

#[test]
fn tokenize_detokenize_and_template_round_trip() {
    let m = tiny("qwen2").join("qwen2-f32.gguf");
    let m = m.to_str().unwrap();
    let out = kestrel(&["tokenize", "-m", m, "--pieces", "hello world <|im_start|>"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let ids: Vec<u32> = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(
        ids.contains(&1),
        "<|im_start|> is id 1 when special tokens are parsed: {ids:?}"
    );
    let plain = kestrel(&["tokenize", "-m", m, "--no-parse-special", "<|im_start|>"]);
    let plain_ids: Vec<u32> = serde_json::from_str(
        String::from_utf8_lossy(&plain.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert!(!plain_ids.contains(&1));
    let joined: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let back = kestrel(&["detokenize", "-m", m, &joined.join(",")]);
    assert_eq!(
        String::from_utf8_lossy(&back.stdout).trim_end_matches('\n'),
        "hello world <|im_start|>"
    );
}

/// `bench --json`: every figure as median/min/max, and the read bandwidth measured after each
/// decode repetition by a child process, so its buffer (512 MiB or more) stays out of the
/// bench's own peak RSS.
#[test]
fn bench_measures_bandwidth_outside_its_own_memory() {
    let model = tiny("llama").join("llama-f32.gguf");
    let out = kestrel(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--check-tokens",
        "0",
        "--json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    let stat = |key: &str| -> [f64; 3] {
        ["min", "median", "max"].map(|k| v[key][k].as_f64().unwrap_or(-1.0))
    };
    for key in [
        "prompt_tok_s",
        "decode_tok_s",
        "read_bandwidth",
        "decode_bandwidth_fraction",
    ] {
        let [lo, mid, hi] = stat(key);
        assert!(0.0 < lo && lo <= mid && mid <= hi, "{key}: {lo} {mid} {hi}");
    }
    assert_eq!(
        v["read_bandwidth_bytes_s"].as_f64(),
        Some(stat("read_bandwidth")[1])
    );
    let [_, _, rss] = stat("peak_rss_bytes");
    assert!(
        rss < 512.0 * 1024.0 * 1024.0,
        "peak RSS {rss} holds the bandwidth buffer"
    );
}

/// `bench --scenario sampling --json`: every chain timed on the model's own logits and on the
/// same rows flattened.
#[test]
fn sampling_scenario_times_every_chain() {
    let model = tiny("qwen2").join("qwen2-f32.gguf");
    let out = kestrel(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "--scenario",
        "sampling",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["rows"].as_u64(), Some(5), "the prompt's row and 4 steps'");
    let chains = v["chains"].as_array().expect("chains");
    assert_eq!(chains.len(), 12);
    for (i, c) in chains.iter().enumerate() {
        let us = c["us_per_token"].as_f64().unwrap_or(-1.0);
        assert!(us > 0.0, "{c}");
        assert_eq!(c["logits"], ["model", "flat"][i / 6], "{c}");
    }
    assert!(v["floor_us"].as_f64().unwrap_or(-1.0) > 0.0);
}
