//! Hand-built GGUF files, good and broken: each broken one must give the right error variant with
//! a message that names the problem (and the key or tensor at fault).

mod common;

use common::{gt, tensor, ty, Gguf, V};
use kestrel_gguf::{parse, GgmlType, GgufError, Header, Value};

fn ok(bytes: &[u8]) -> Header {
    parse(bytes).unwrap_or_else(|e| panic!("expected Ok, got {e}"))
}

fn err(bytes: &[u8]) -> (GgufError, String) {
    match parse(bytes) {
        Ok(h) => panic!(
            "expected an error, got Ok with {} tensors / {} keys",
            h.tensors.len(),
            h.metadata.len()
        ),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} should contain {p:?}");
    }
}

// ---- files that must parse --------------------------------------------------------------------

#[test]
fn minimal_file_parses() {
    let g = Gguf::minimal();
    let bytes = g.build();
    let h = ok(&bytes);
    assert_eq!(h.version, 3);
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.alignment, 32);
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.data_offset % 32, 0);
    assert_eq!(
        h.data_offset,
        g.header_bytes().len().div_ceil(32) as u64 * 32
    );
    let t = h.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (t.dims.as_slice(), t.ggml_type, t.offset, t.n_bytes),
        (&[8u64, 4][..], GgmlType::F32, 0, 128)
    );
    let t = h.tensor("output_norm.weight").unwrap();
    assert_eq!((t.offset, t.n_bytes), (128, 32));
    assert_eq!(h.tensor_bytes(), 160);
}

#[test]
fn every_value_type_round_trips_v2_and_v3() {
    for version in [2, 3] {
        let mut g = Gguf::minimal().version(version);
        let kvs = common::every_value_type();
        g.kvs.extend(kvs.iter().cloned());
        let h = ok(&g.build());
        assert_eq!(h.version, version);
        assert_eq!(h.metadata.len(), g.kvs.len());
        // File order is kept.
        for ((k, _), (hk, _)) in g.kvs.iter().zip(&h.metadata) {
            assert_eq!(k, hk);
        }
        assert_eq!(h.get("t.u8"), Some(&Value::U8(200)));
        assert_eq!(h.get("t.i8"), Some(&Value::I8(-100)));
        assert_eq!(h.get("t.u16"), Some(&Value::U16(60000)));
        assert_eq!(h.get("t.i16"), Some(&Value::I16(-30000)));
        assert_eq!(h.get("t.u32"), Some(&Value::U32(4_000_000_000)));
        assert_eq!(h.get("t.i32"), Some(&Value::I32(-2_000_000_000)));
        assert_eq!(h.get("t.f32"), Some(&Value::F32(1.5)));
        assert_eq!(h.get("t.bool"), Some(&Value::Bool(true)));
        assert_eq!(
            h.get("t.string").and_then(Value::as_str),
            Some("héllo, wörld")
        );
        assert_eq!(h.get("t.u64"), Some(&Value::U64(u64::MAX - 1)));
        assert_eq!(h.get("t.i64"), Some(&Value::I64(i64::MIN + 1)));
        assert_eq!(h.get("t.f64"), Some(&Value::F64(-2.25e300)));
        assert_eq!(
            h.get("t.u16.array"),
            Some(&Value::Array(vec![Value::U16(60000); 3]))
        );
        assert_eq!(
            h.get("t.string.array").unwrap().as_array().unwrap()[2].as_str(),
            Some("héllo, wörld")
        );
        assert_eq!(h.get("t.empty_array"), Some(&Value::Array(vec![])));
        assert_eq!(
            h.get("t.nested"),
            Some(&Value::Array(vec![
                Value::Array(vec![Value::U32(1), Value::U32(2)]),
                Value::Array(vec![]),
                Value::Array(vec![Value::U32(3)]),
            ]))
        );
        assert_eq!(
            h.get("t.nested3"),
            Some(&Value::Array(vec![Value::Array(vec![Value::Array(vec![
                Value::F64(0.5),
                Value::F64(-0.5)
            ])])]))
        );
        // Summaries never panic, whatever the value.
        for (_, v) in &h.metadata {
            let _ = v.summary();
        }
    }
}

#[test]
fn every_ggml_type_has_the_right_size() {
    let types = [
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
    ];
    let mut g = Gguf::new().kv("general.architecture", V::s("test"));
    for (i, &t) in types.iter().enumerate() {
        g = g.tensor(tensor(&format!("t{i}"), &[512, 3], t));
    }
    let h = ok(&g.build());
    let mut sum = 0;
    for (i, &t) in types.iter().enumerate() {
        let info = h.tensor(&format!("t{i}")).unwrap();
        assert_eq!(info.ggml_type.id(), t);
        assert_eq!(
            info.n_bytes,
            common::tensor_size(t, &[512, 3]),
            "type {}",
            info.ggml_type
        );
        sum += info.n_bytes;
    }
    assert_eq!(h.tensor_bytes(), sum);
}

#[test]
fn custom_alignment_is_honoured() {
    let g = Gguf::minimal().kv("general.alignment", V::U32(256));
    let h = ok(&g.build());
    assert_eq!(h.alignment, 256);
    assert_eq!(h.data_offset % 256, 0);
    assert_eq!(h.tensor("output_norm.weight").unwrap().offset, 256);
}

#[test]
fn file_without_tensors_or_metadata_parses() {
    let h = ok(&Gguf::new().build());
    assert!(h.tensors.is_empty() && h.metadata.is_empty());
    assert_eq!(h.tensor_bytes(), 0);
    let h = ok(&Gguf::new().kv("a", V::U8(1)).build());
    assert_eq!(h.metadata.len(), 1);
}

// ---- broken files -----------------------------------------------------------------------------

#[test]
fn tensor_offset_past_the_end() {
    // Aligned, but far beyond the data section.
    let g = Gguf::new()
        .tensor(tensor("a.weight", &[8], gt::F32))
        .tensor_at("far.weight", &[8], gt::F32, 1 << 20)
        .tensor(tensor("c.weight", &[8], gt::F32));
    let mut g2 = g.clone();
    g2.data_len = Some(96);
    let (e, msg) = err(&g2.build());
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "far.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["far.weight", "past the end"]);

    // Offset so large that offset + size overflows u64.
    let g = Gguf::new().tensor_at("huge.weight", &[8], gt::F32, u64::MAX - 31);
    let mut bytes = g.header_bytes();
    bytes.resize(bytes.len().div_ceil(32) * 32 + 64, 0);
    let (e, msg) = err(&bytes);
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "huge.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["huge.weight", "past the end"]);
}

#[test]
fn data_section_cut_short_names_the_tensor() {
    let g = Gguf::minimal();
    let full = g.build();
    // Drop the last 4 bytes: the second tensor no longer fits.
    let (e, msg) = err(&full[..full.len() - 4]);
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "output_norm.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["output_norm.weight", "past the end"]);
    // Cut in the middle of the first tensor: the first one is named.
    let h = ok(&full);
    let cut = h.data_offset as usize + 64;
    let (e, msg) = err(&full[..cut]);
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "token_embd.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["token_embd.weight", "past the end"]);
}

#[test]
fn bad_magic() {
    for magic in [*b"GGML", *b"GGUf", [0; 4], *b"\x7fELF", *b"FUGG"] {
        let mut g = Gguf::minimal();
        g.magic = magic;
        let (e, msg) = err(&g.build());
        assert!(
            matches!(e, GgufError::BadMagic { found } if found == magic),
            "{e:?}"
        );
        assert_contains(&msg, &["not a GGUF file", "magic"]);
    }
    // Text and other random files.
    let (e, _) = err(b"{\"not\": \"a model\"}\n");
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e:?}");
    // Too short to even hold the magic.
    for short in [&b""[..], b"G", b"GGU"] {
        let (e, msg) = err(short);
        assert!(
            matches!(&e, GgufError::Truncated { what, .. } if what == "magic"),
            "{e:?}"
        );
        assert_contains(&msg, &["truncated", "magic"]);
    }
}

#[test]
fn unsupported_version() {
    // 1 (u32 counts, never supported), future versions, and a big-endian v3 file as read LE.
    for v in [0u32, 1, 4, 0x0300_0000, u32::MAX] {
        let (e, msg) = err(&Gguf::minimal().version(v).build());
        assert!(
            matches!(e, GgufError::UnsupportedVersion(found) if found == v),
            "{e:?}"
        );
        assert_contains(&msg, &["unsupported GGUF version", &v.to_string()]);
    }
}

#[test]
fn duplicate_key() {
    let g = Gguf::minimal().kv("llama.block_count", V::U32(2));
    let (e, msg) = err(&g.build());
    assert!(
        matches!(&e, GgufError::BadMetadata { key, reason } if key == "llama.block_count" && reason.contains("duplicate")),
        "{e:?}"
    );
    assert_contains(&msg, &["llama.block_count", "duplicate key"]);
}

#[test]
fn unknown_value_type() {
    for bad in [13u32, 255, u32::MAX] {
        let g = Gguf::minimal().kv("weird.key", V::Raw(bad, vec![0; 16]));
        let (e, msg) = err(&g.build());
        assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
        assert_contains(&msg, &["weird.key", &format!("unknown value type {bad}")]);
    }
    // Also as an array's element type.
    let g = Gguf::minimal().kv(
        "weird.array",
        V::ArrClaim {
            elem: 42,
            claimed_len: 1,
            body: vec![0; 8],
        },
    );
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["weird.array", "unknown value type 42"]);
}

#[test]
fn absurd_array_length() {
    for (elem, claimed) in [
        (ty::U8, u64::MAX),
        (ty::U32, 1 << 40),
        (ty::STRING, 1 << 62),
        (ty::ARRAY, u64::MAX / 12 + 1),
        (ty::U64, 1_000_000),
    ] {
        let g = Gguf::minimal().kv(
            "tokenizer.ggml.tokens",
            V::ArrClaim {
                elem,
                claimed_len: claimed,
                body: vec![0; 64],
            },
        );
        let (e, msg) = err(&g.build());
        assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
        assert_contains(
            &msg,
            &[
                "tokenizer.ggml.tokens",
                "array length",
                &claimed.to_string(),
                "cannot fit",
            ],
        );
    }
}

#[test]
fn absurd_counts() {
    let mut g = Gguf::minimal();
    g.n_tensors_claim = Some(u64::MAX);
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["tensor count", "cannot fit"]);

    let mut g = Gguf::minimal();
    g.n_kv_claim = Some(1 << 50);
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["metadata count", "cannot fit"]);

    // More tensors claimed than written, but few enough to pass the size bound.
    let mut g = Gguf::minimal();
    g.n_tensors_claim = Some(3);
    assert!(parse(&g.build()).is_err());
}

#[test]
fn absurd_string_length() {
    let mut bytes = Gguf::new().version(3).header_bytes();
    // n_kv = 1, then a key whose length is enormous.
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend((u64::MAX - 3).to_le_bytes());
    bytes.extend(b"general.architecture");
    let (e, msg) = err(&bytes);
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
    assert_contains(&msg, &["truncated", "metadata key #0"]);
}

#[test]
fn misaligned_tensor_offset() {
    let g = Gguf::new()
        .tensor(tensor("a.weight", &[64], gt::F32))
        .tensor_at("b.weight", &[8], gt::F32, 256 + 4);
    let (e, msg) = err(&g.build());
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "b.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["b.weight", "260", "not aligned to 32"]);

    // With a custom alignment, an offset aligned to 32 but not 64 is misaligned.
    let g =
        Gguf::new()
            .kv("general.alignment", V::U32(64))
            .tensor_at("c.weight", &[8], gt::F32, 32);
    let (e, msg) = err(&g.build());
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "c.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["c.weight", "not aligned to 64"]);
}

#[test]
fn overlapping_tensors() {
    // b starts inside a.
    let g = Gguf::new()
        .tensor_at("a.weight", &[64], gt::F32, 0)
        .tensor_at("b.weight", &[64], gt::F32, 128);
    let (e, msg) = err(&g.build());
    assert!(
        matches!(&e, GgufError::BadTensor { name, .. } if name == "b.weight"),
        "{e:?}"
    );
    assert_contains(&msg, &["b.weight", "overlaps", "a.weight"]);
    // Same offset, listed in the other order.
    let g = Gguf::new()
        .tensor_at("y.weight", &[8], gt::F32, 64)
        .tensor_at("x.weight", &[64], gt::F32, 0);
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::BadTensor { .. }), "{e:?}");
    assert_contains(&msg, &["overlaps", "x.weight", "y.weight"]);
    // Touching is fine.
    let g = Gguf::new()
        .tensor_at("a.weight", &[8], gt::F32, 0)
        .tensor_at("b.weight", &[8], gt::F32, 32);
    ok(&g.build());
}

#[test]
fn bad_alignment_value() {
    for v in [V::U32(0), V::U32(48), V::U64(32), V::s("32"), V::I32(32)] {
        let g = Gguf::minimal().kv("general.alignment", v.clone());
        let (e, msg) = err(&g.build());
        assert!(
            matches!(&e, GgufError::BadMetadata { key, .. } if key == "general.alignment"),
            "{v:?}: {e:?}"
        );
        assert_contains(&msg, &["general.alignment", "power-of-two"]);
    }
}

#[test]
fn bad_tensor_infos() {
    let cases: Vec<(Gguf, &str)> = vec![
        (
            Gguf::new().tensor(tensor("t", &[], gt::F32)),
            "0 dimensions",
        ),
        (
            Gguf::new().tensor(tensor("t", &[1, 1, 1, 1, 1], gt::F32)),
            "5 dimensions",
        ),
        (
            Gguf::new().tensor(tensor("t", &[8, 0], gt::F32)),
            "zero dimension",
        ),
        (
            Gguf::new().tensor(tensor("t", &[8], 4)),
            "unknown type id 4",
        ),
        (
            Gguf::new().tensor(tensor("t", &[8], 99)),
            "unknown type id 99",
        ),
        (
            Gguf::new().tensor(tensor("t", &[48], gt::Q4_0)),
            "not a multiple of the Q4_0 block length 32",
        ),
        (
            Gguf::new().tensor(tensor("t", &[32], gt::Q4_K)),
            "not a multiple of the Q4_K block length 256",
        ),
        (
            Gguf::new().tensor(tensor("t", &[1 << 32, 1 << 32], gt::F32)),
            "overflows",
        ),
        (
            Gguf::new().tensor(tensor("t", &[u64::MAX, 2], gt::F32)),
            "overflows",
        ),
        (
            Gguf::new()
                .tensor(tensor("t", &[8], gt::F32))
                .tensor(tensor("t", &[8], gt::F32)),
            "duplicate tensor name",
        ),
    ];
    for (g, want) in cases {
        let (e, msg) = err(&g.build());
        assert!(
            matches!(&e, GgufError::BadTensor { name, .. } if name == "t"),
            "{want}: {e:?}"
        );
        assert_contains(&msg, &["tensor 't'", want]);
    }
}

#[test]
fn bad_scalars_and_strings() {
    // A bool that is neither 0 nor 1.
    let g = Gguf::minimal().kv("flag", V::Raw(ty::BOOL, vec![2]));
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["flag", "bool byte is 2"]);

    // A string value that is not UTF-8.
    let mut raw = 2u64.to_le_bytes().to_vec();
    raw.extend([0xff, 0xfe]);
    let g = Gguf::minimal().kv("general.name", V::Raw(ty::STRING, raw));
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["general.name", "not UTF-8"]);

    // A tensor name that is not UTF-8.
    let mut bytes = Gguf::new().tensor(tensor("abc", &[8], gt::F32)).build();
    let at = 24 + 8; // after the fixed header, past the name length
    bytes[at] = 0xc3;
    bytes[at + 1] = 0x28;
    let (e, msg) = err(&bytes);
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["tensor #0 name", "not UTF-8"]);
}

#[test]
fn arrays_nested_too_deep() {
    let mut v = V::Arr(ty::U8, vec![V::U8(1)]);
    for _ in 0..12 {
        v = V::Arr(ty::ARRAY, vec![v]);
    }
    let g = Gguf::minimal().kv("deep", v);
    let (e, msg) = err(&g.build());
    assert!(matches!(e, GgufError::Invalid { .. }), "{e:?}");
    assert_contains(&msg, &["deep", "nested deeper"]);
}

#[test]
fn hand_built_file_truncated_everywhere() {
    let mut g = Gguf::minimal();
    g.kvs.extend(common::every_value_type());
    let full = g.build();
    let header_end = g.header_bytes().len();
    ok(&full);
    for cut in 0..full.len() {
        match parse(&full[..cut]) {
            Ok(_) => panic!("truncation at {cut} of {} parsed", full.len()),
            Err(GgufError::Truncated { len, .. }) => assert_eq!(len, cut as u64),
            // A count can be refused as impossible before the bytes run out.
            Err(GgufError::Invalid { reason, .. }) if cut < header_end => {
                assert!(reason.contains("cannot fit"), "cut {cut}: {reason}")
            }
            Err(GgufError::BadTensor { name, reason }) if cut >= header_end => {
                assert!(
                    g.tensors.iter().any(|t| t.name == name),
                    "cut {cut}: {name}"
                );
                assert!(reason.contains("past the end"), "cut {cut}: {reason}");
            }
            Err(e) => panic!("cut {cut} (header ends at {header_end}): unexpected {e}"),
        }
    }
}
