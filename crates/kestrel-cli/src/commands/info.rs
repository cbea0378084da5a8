//! `kestrel info`: what a model file holds and what it will cost to run.

use crate::source::ModelSource;
use anyhow::Result;
use kestrel_models::plan::MemoryPlan;
use serde_json::json;
use std::collections::BTreeMap;

pub fn run(source: &ModelSource, as_json: bool) -> Result<()> {
    let cfg = &source.config;
    let tok = &source.tokenizer;
    let plan = MemoryPlan::new(cfg, source.weight_bytes);

    let mut hist: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for (ty, bytes) in &source.tensor_types {
        let e = hist.entry(ty.clone()).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    let specials: Vec<(String, u32)> = tok
        .special_tokens()
        .into_iter()
        .map(|s| (format!("{}:{}", s.name, s.text), s.id))
        .collect();

    if as_json {
        let rows: Vec<_> = plan
            .rows
            .iter()
            .map(|r| {
                json!({
                    "context": r.context,
                    "kv_bytes_f16": r.kv_f16,
                    "kv_bytes_q8_0": r.kv_q8_0,
                    "total_bytes_f16": r.total_f16,
                    "total_bytes_q8_0": r.total_q8_0,
                    "fits_f16": plan.fits(r.total_f16),
                    "fits_q8_0": plan.fits(r.total_q8_0),
                })
            })
            .collect();
        let out = json!({
            "path": source.path.display().to_string(),
            "format": source.format,
            "file_bytes": source.file_bytes,
            "architecture": cfg.arch.name(),
            "name": source.name,
            "hyper_parameters": {
                "n_layers": cfg.n_layers,
                "dim": cfg.dim,
                "ffn_dim": cfg.ffn_dim,
                "n_heads": cfg.n_heads,
                "n_kv_heads": cfg.n_kv_heads,
                "head_dim": cfg.head_dim,
                "vocab_size": cfg.vocab_size,
                "max_context": cfg.max_context,
                "rope_base": cfg.rope_base,
                "rope_dim": cfg.rope_dim,
                "rms_eps": cfg.rms_eps,
                "experts": cfg.moe.as_ref().map(|m| json!({
                    "count": m.n_experts,
                    "used_per_token": m.n_used,
                    "expert_ffn_dim": m.expert_ffn_dim,
                    "normalized_weights": m.norm_top_k,
                    "dense_layers": m.dense_layers.iter().filter(|&&d| d).count(),
                })),
                "recurrent": cfg.hybrid.as_ref().map(|h| json!({
                    "layers": h.n_recurrent(),
                    "conv_kernel": h.conv_kernel,
                    "n_k_heads": h.n_k_heads,
                    "n_v_heads": h.n_v_heads,
                    "head_k_dim": h.head_k_dim,
                    "head_v_dim": h.head_v_dim,
                })),
            },
            "tensor_count": source.tensor_types.len(),
            "tensor_types": hist.iter().map(|(k, (n, b))| (k.clone(), json!({"count": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "tokenizer": {
                "kind": tok.kind(),
                "vocab_size": tok.vocab_size(),
                "special_tokens": specials.iter().map(|(s, id)| json!({"text": s, "id": id})).collect::<Vec<_>>(),
                "eog_ids": tok.eog_ids(),
            },
            "chat_template": source.chat_template.is_some(),
            "memory_plan": {
                "weight_bytes": plan.weight_bytes,
                "read_bytes_per_token": source.read_bytes_per_token,
                "kv_bytes_per_token_f16": plan.kv_bytes_per_token_f16,
                "kv_bytes_per_token_q8_0": plan.kv_bytes_per_token_q8_0,
                "scratch_bytes": plan.scratch_bytes,
                "state_bytes_per_sequence": plan.state_bytes_per_sequence,
                "snapshots_per_sequence": if plan.state_bytes_per_sequence > 0 { kestrel_engine::SNAPSHOTS_PER_SEQUENCE } else { 0 },
                "available_bytes": plan.available_bytes,
                "contexts": rows,
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    println!("model         {}", source.path.display());
    println!(
        "format        {} ({})",
        source.format,
        human(source.file_bytes)
    );
    if let Some(name) = &source.name {
        println!("name          {name}");
    }
    println!("architecture  {}", cfg.arch.name());
    println!(
        "shape         {} layers, dim {}, ffn {}, heads {} (kv {}), head_dim {}",
        cfg.n_layers, cfg.dim, cfg.ffn_dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    );
    if let Some(m) = &cfg.moe {
        let dense = m.dense_layers.iter().filter(|&&d| d).count();
        println!(
            "experts       {} per layer, {} used per token ({}), expert ffn {}{}",
            m.n_experts,
            m.n_used,
            if m.norm_top_k {
                "weights renormalized"
            } else {
                "softmax weights"
            },
            m.expert_ffn_dim,
            if dense > 0 {
                format!("; {dense} dense layers")
            } else {
                String::new()
            }
        );
    }
    if let Some(h) = &cfg.hybrid {
        println!(
            "recurrent     {} gated-DeltaNet layers of {} (conv {}, {} key heads x {}, {} value heads x {}); state {} per sequence (f32)",
            h.n_recurrent(),
            cfg.n_layers,
            h.conv_kernel,
            h.n_k_heads,
            h.head_k_dim,
            h.n_v_heads,
            h.head_v_dim,
            human(h.state_bytes() as u64)
        );
    }
    println!(
        "rope          base {}, dim {}, {:?}; rms eps {:e}; context {}",
        cfg.rope_base, cfg.rope_dim, cfg.rope_layout, cfg.rms_eps, cfg.max_context
    );
    println!("tensors       {}", source.tensor_types.len());
    for (ty, (n, b)) in &hist {
        println!("  {ty:<6} {n:>5} tensors {:>12}", human(*b));
    }
    println!(
        "tokenizer     {}, vocabulary {}",
        tok.kind(),
        tok.vocab_size()
    );
    let shown: Vec<String> = specials
        .iter()
        .take(12)
        .map(|(s, id)| format!("{s}={id}"))
        .collect();
    println!(
        "specials      {}{}",
        shown.join(" "),
        if specials.len() > 12 {
            format!(" … ({} in all)", specials.len())
        } else {
            String::new()
        }
    );
    println!("end of gen    {:?}", tok.eog_ids());
    println!(
        "chat template {}",
        if source.chat_template.is_some() {
            "yes"
        } else {
            "no"
        }
    );
    println!("CPU kernels   {}", kestrel_quant::kernels_summary());
    println!();
    println!(
        "memory plan (weights + KV + scratch of a {}-token step)",
        kestrel_models::model::DEFAULT_MAX_BATCH
    );
    println!(
        "  weights      {:>12}  (sum of every tensor's type x shape)",
        human(plan.weight_bytes)
    );
    if cfg.moe.is_some() {
        println!(
            "  read/token   {:>12}  (decode: attention, router and the experts a token is routed to)",
            human(source.read_bytes_per_token)
        );
    }
    println!(
        "  KV per token {:>12} f16, {} q8_0",
        human(plan.kv_bytes_per_token_f16 as u64),
        human(plan.kv_bytes_per_token_q8_0 as u64)
    );
    println!("  scratch      {:>12}", human(plan.scratch_bytes));
    if plan.state_bytes_per_sequence > 0 {
        println!(
            "  state        {:>12}  (recurrent, per sequence)",
            human(plan.state_bytes_per_sequence)
        );
        let per_seq = kestrel_engine::SNAPSHOTS_PER_SEQUENCE;
        println!(
            "  snapshots    {:>12}  (state snapshots in the prefix cache: at most {per_seq} per sequence, {per_seq} x (parallel + 1) in all: {} for run/chat)",
            human(plan.state_bytes_per_sequence),
            human(plan.state_bytes_per_sequence * 2 * per_seq as u64)
        );
    }
    match plan.available_bytes {
        Some(a) => println!("  available    {:>12}  (MemAvailable)", human(a)),
        None => println!("  available    unknown"),
    }
    println!(
        "  {:>8}  {:>12} {:>12}  {:>12} {:>12}",
        "context", "KV f16", "total f16", "KV q8_0", "total q8_0"
    );
    for r in &plan.rows {
        let mark = |b: u64| match plan.fits(b) {
            Some(true) => "fits",
            Some(false) => "TOO BIG",
            None => "?",
        };
        println!(
            "  {:>8}  {:>12} {:>12} {:<7} {:>12} {:>12} {}",
            r.context,
            human(r.kv_f16),
            human(r.total_f16),
            mark(r.total_f16),
            human(r.kv_q8_0),
            human(r.total_q8_0),
            mark(r.total_q8_0)
        );
    }
    Ok(())
}

pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
