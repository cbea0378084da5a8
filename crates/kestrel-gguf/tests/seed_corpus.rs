//! Writes the fuzzer's seed inputs into fuzz/corpus/gguf_parse/ (run by hand, see fuzz/README.md):
//! `cargo test -p kestrel-gguf --test seed_corpus -- --ignored`.

mod common;

use common::{gt, tensor, ty, Gguf, V};

#[test]
#[ignore = "writes fuzz/corpus/gguf_parse/; run by hand when re-seeding the fuzzer"]
fn write_seed_corpus() {
    let dir = common::repo_root().join("fuzz/corpus/gguf_parse");
    std::fs::create_dir_all(&dir).unwrap();
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();

    // The tiny models' first 4 KB, and their whole headers (up to the data section).
    for path in common::tiny_ggufs() {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let full = std::fs::read(&path).unwrap();
        let h = kestrel_gguf::parse(&full).unwrap();
        seeds.push((format!("tiny-{stem}-4k"), full[..4096].to_vec()));
        seeds.push((
            format!("tiny-{stem}-header"),
            full[..h.data_offset as usize].to_vec(),
        ));
    }

    // Hand-made valid files.
    for v in [2, 3] {
        seeds.push((format!("minimal-v{v}"), Gguf::minimal().version(v).build()));
        let mut g = Gguf::minimal().version(v);
        g.kvs.extend(common::every_value_type());
        seeds.push((format!("every-value-type-v{v}"), g.build()));
    }
    let mut g = Gguf::new().kv("general.architecture", V::s("test"));
    for (i, t) in [
        gt::F32,
        gt::F16,
        gt::Q4_0,
        gt::Q4_1,
        gt::Q5_0,
        gt::Q5_1,
        gt::Q8_0,
        gt::Q8_1,
        gt::Q2_K,
        gt::Q3_K,
        gt::Q4_K,
        gt::Q5_K,
        gt::Q6_K,
        gt::Q8_K,
        gt::I8,
        gt::I16,
        gt::I32,
        gt::I64,
        gt::F64,
        gt::BF16,
    ]
    .into_iter()
    .enumerate()
    {
        g = g.tensor(tensor(&format!("t{i}"), &[256], t));
    }
    seeds.push(("every-ggml-type".into(), g.build()));
    seeds.push((
        "four-dims-align64".into(),
        Gguf::new()
            .kv("general.alignment", V::U32(64))
            .tensor(tensor("a", &[32, 2, 2, 2], gt::Q8_0))
            .tensor(tensor("b", &[4, 3, 2], gt::F16))
            .build(),
    ));
    seeds.push(("empty".into(), Gguf::new().build()));
    seeds.push((
        "kv-only".into(),
        Gguf::new().kv("a", V::Bool(false)).build(),
    ));
    seeds.push((
        "nested-arrays".into(),
        Gguf::new()
            .kv(
                "n",
                common::every_value_type()
                    .into_iter()
                    .find(|(k, _)| k == "t.nested3")
                    .unwrap()
                    .1,
            )
            .kv(
                "s",
                V::Arr(ty::ARRAY, vec![V::Arr(ty::STRING, vec![V::s("x")])]),
            )
            .build(),
    ));

    // Hand-made broken files, one per error path.
    let mut bad_magic = Gguf::minimal();
    bad_magic.magic = *b"GGML";
    seeds.push(("bad-magic".into(), bad_magic.build()));
    seeds.push(("bad-version".into(), Gguf::minimal().version(4).build()));
    seeds.push((
        "dup-key".into(),
        Gguf::minimal().kv("llama.block_count", V::U32(2)).build(),
    ));
    seeds.push((
        "unknown-value-type".into(),
        Gguf::minimal().kv("k", V::Raw(13, vec![0; 8])).build(),
    ));
    seeds.push((
        "absurd-array".into(),
        Gguf::minimal()
            .kv(
                "k",
                V::ArrClaim {
                    elem: ty::U32,
                    claimed_len: 1 << 40,
                    body: vec![0; 16],
                },
            )
            .build(),
    ));
    seeds.push((
        "bad-bool".into(),
        Gguf::minimal().kv("b", V::Raw(ty::BOOL, vec![2])).build(),
    ));
    seeds.push((
        "bad-alignment".into(),
        Gguf::minimal().kv("general.alignment", V::U32(48)).build(),
    ));
    seeds.push((
        "misaligned".into(),
        Gguf::new().tensor_at("a", &[8], gt::F32, 4).build(),
    ));
    seeds.push((
        "overlap".into(),
        Gguf::new()
            .tensor_at("a", &[64], gt::F32, 0)
            .tensor_at("b", &[8], gt::F32, 32)
            .build(),
    ));
    let mut past = Gguf::new().tensor_at("far", &[8], gt::F32, 1 << 20);
    past.data_len = Some(64);
    seeds.push(("past-end".into(), past.build()));
    seeds.push((
        "bad-block-len".into(),
        Gguf::new().tensor(tensor("q", &[48], gt::Q4_0)).build(),
    ));
    seeds.push((
        "dup-tensor".into(),
        Gguf::new()
            .tensor(tensor("t", &[8], gt::F32))
            .tensor(tensor("t", &[8], gt::F32))
            .build(),
    ));

    let mut total = 0;
    for (name, bytes) in &seeds {
        total += bytes.len();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
    eprintln!(
        "wrote {} seeds, {total} bytes, to {}",
        seeds.len(),
        dir.display()
    );
}
