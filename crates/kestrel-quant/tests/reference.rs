//! Bit-exact comparisons with data made by the `gguf` Python package (tests/data/gen.py):
//! dequantization of random blocks of every type, the quantizers gguf has (and our numpy ports of
//! llama.cpp's Q8_1 / Q8_K reference quantizers), and dequantized rows of the real models.

mod common;

use common::*;
use kestrel_gguf::GgufFile;
use kestrel_quant::{dequantize_row, quantize_row, row_bytes, GgmlType};

const DEQUANT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn dequant_matches_gguf_bit_for_bit() {
    for ty in DEQUANT_TYPES {
        let dir = data_dir().join("dequant");
        let raw = std::fs::read(dir.join(format!("{ty}.bin"))).unwrap();
        let want = read_f32(&dir.join(format!("{ty}.f32")));
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &raw, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn quantizers_match_reference_bit_for_bit() {
    for ty in [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ] {
        let dir = data_dir().join("quant");
        let x = read_f32(&dir.join(format!("{ty}.in.f32")));
        let want = std::fs::read(dir.join(format!("{ty}.out"))).unwrap();
        let mut got = vec![0u8; row_bytes(ty, x.len()).unwrap()];
        quantize_row(ty, &x, &mut got).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        let bb = ty.block_bytes() as usize;
        for (i, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g, w, "{ty} block {i}");
        }
    }
}

/// 64-bit FNV-1a over the little-endian f32 bits, as gen.py computes it.
fn fnv64(v: &[f32]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for x in v {
        for b in x.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

#[test]
fn real_model_rows_match_gguf() {
    let require = std::env::var("KESTREL_REQUIRE_MODELS").as_deref() == Ok("1");
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let text = std::fs::read_to_string(data_dir().join("models.txt")).unwrap();
    let mut checked = 0;
    let mut open: Option<(String, GgufFile)> = None;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (model, tensor, ty, row, n, hash) = (f[0], f[1], f[2], f[3], f[4], f[5]);
        let path = models.join(model);
        if !path.exists() {
            assert!(
                !require,
                "KESTREL_REQUIRE_MODELS=1 but {} is missing",
                path.display()
            );
            println!("note: skipping {model} (not found at {})", path.display());
            continue;
        }
        if open.as_ref().map(|(m, _)| m.as_str()) != Some(model) {
            open = Some((model.to_string(), GgufFile::open(&path).unwrap()));
        }
        let file = &open.as_ref().unwrap().1;
        let info = file.tensor(tensor).unwrap();
        assert_eq!(info.ggml_type.name(), ty);
        let (row, n): (usize, usize) = (row.parse().unwrap(), n.parse().unwrap());
        let rb = row_bytes(info.ggml_type, n).unwrap();
        let data = file.tensor_data(info);
        let mut out = vec![0f32; n];
        dequantize_row(info.ggml_type, &data[row * rb..(row + 1) * rb], &mut out).unwrap();
        let want_first: Vec<f32> = f[6..].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(&out[..4], &want_first[..], "{model} {tensor} row {row}");
        assert_eq!(
            format!("{:016x}", fnv64(&out)),
            hash,
            "{model} {tensor} row {row}"
        );
        checked += 1;
    }
    println!("checked {checked} real-model rows");
}
