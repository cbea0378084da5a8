//! Truncated and bit-flipped copies of real files: `parse` must return an error (or, for harmless
//! changes, Ok with a consistent header), never panic, and truncation errors must say where.

mod common;

use common::{read_prefix, real_models, tiny_ggufs, Rng};
use kestrel_gguf::{parse, GgufError, GgufFile, Header, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Parses `bytes`, turning a panic into a test failure that says which input caused it.
fn parse_no_panic(bytes: &[u8], what: &dyn Fn() -> String) -> Result<Header, GgufError> {
    match catch_unwind(AssertUnwindSafe(|| parse(bytes))) {
        Ok(r) => r,
        Err(_) => panic!("parse panicked on {}", what()),
    }
}

/// What an accepted header must satisfy: every tensor inside the file, aligned, sizes summed.
fn check_invariants(h: &Header, len: usize, what: &dyn Fn() -> String) {
    assert!(h.alignment.is_power_of_two(), "{}", what());
    let mut sum = 0u64;
    for t in &h.tensors {
        let end = h.data_offset + t.offset + t.n_bytes;
        assert!(
            end <= len as u64,
            "{}: tensor {} ends at {end} > {len}",
            what(),
            t.name
        );
        assert_eq!(t.offset % h.alignment, 0, "{}", what());
        assert_eq!(
            t.n_bytes,
            common::tensor_size(t.ggml_type.id(), &t.dims),
            "{}",
            what()
        );
        sum += t.n_bytes;
    }
    assert_eq!(h.tensor_bytes(), sum, "{}", what());
    for (_, v) in &h.metadata {
        let _ = v.summary();
    }
}

/// Checks the error for `full` cut to `cut` bytes, where `full` parses to `h` and its header
/// (magic through the last tensor info) ends at `header_end`.
/// Returns the error's message (empty when the cut was harmless).
fn check_truncation(full: &[u8], h: &Header, header_end: u64, cut: usize, label: &str) -> String {
    let cut64 = cut as u64;
    let what = || {
        format!(
            "{label} cut at {cut} (header ends {header_end}, data at {})",
            h.data_offset
        )
    };
    let first_past_end = h
        .tensors
        .iter()
        .find(|t| h.data_offset + t.offset + t.n_bytes > cut64);
    let result = parse_no_panic(&full[..cut], &what);
    let msg = result
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    match result {
        Ok(got) => {
            // Only the padding after the last tensor may be cut without harm.
            assert!(
                first_past_end.is_none() && cut64 >= h.data_offset,
                "{}: parsed",
                what()
            );
            assert_eq!(got.tensors, h.tensors, "{}", what());
        }
        Err(GgufError::Truncated {
            len,
            offset,
            needed,
            what: w,
        }) => {
            assert_eq!(len, cut64, "{}", what());
            assert!(
                offset + needed > cut64,
                "{}: {w} at {offset}+{needed}",
                what()
            );
            assert!(cut64 < h.data_offset, "{}: {w}", what());
            if cut64 >= header_end {
                assert_eq!(w, "data section", "{}", what());
            }
        }
        Err(GgufError::Invalid {
            reason, what: w, ..
        }) => {
            // A count (tensors, keys, array length) checked against the bytes left.
            assert!(cut64 < header_end, "{}: {w}: {reason}", what());
            assert!(reason.contains("cannot fit"), "{}: {w}: {reason}", what());
        }
        Err(GgufError::BadTensor { name, reason }) => {
            // Data section cut: the first tensor (in index order) that no longer fits is named.
            assert!(cut64 >= h.data_offset, "{}: {name}: {reason}", what());
            let want = first_past_end.unwrap_or_else(|| panic!("{}: no tensor past end", what()));
            assert_eq!(name, want.name, "{}: {reason}", what());
            assert!(reason.contains("past the end"), "{}: {reason}", what());
        }
        Err(e) => panic!("{}: unexpected error {e}", what()),
    }
    msg
}

/// Where the header (magic through the last tensor info) ends, computed from the parsed header's
/// contents and the GGUF encoding, independently of the reader's cursor.
fn header_end(h: &Header) -> u64 {
    fn value_len(v: &Value) -> u64 {
        match v {
            Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
            Value::U16(_) | Value::I16(_) => 2,
            Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
            Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
            Value::String(s) => 8 + s.len() as u64,
            Value::Array(items) => 4 + 8 + items.iter().map(value_len).sum::<u64>(),
        }
    }
    let kvs: u64 = h
        .metadata
        .iter()
        .map(|(k, v)| 8 + k.len() as u64 + 4 + value_len(v))
        .sum();
    let infos: u64 = h
        .tensors
        .iter()
        .map(|t| 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8)
        .sum();
    let end = 4 + 4 + 8 + 8 + kvs + infos;
    assert_eq!(end.div_ceil(h.alignment) * h.alignment, h.data_offset);
    end
}

fn flip_bits(rng: &mut Rng, buf: &mut [u8], region: usize) -> String {
    let mut log = String::new();
    let n = 1 + rng.below(4);
    for _ in 0..n {
        let pos = rng.below(region as u64) as usize;
        match rng.below(4) {
            0 => {
                // An "interesting" byte: often turns lengths and counts absurd.
                let v = [0x00, 0xff, 0x7f, 0x80, 0x01, 0x20][rng.below(6) as usize];
                buf[pos] = v;
                log += &format!(" set[{pos}]={v:#x}");
            }
            _ => {
                let bit = rng.below(8);
                buf[pos] ^= 1 << bit;
                log += &format!(" flip[{pos}]^={}", 1 << bit);
            }
        }
    }
    log
}

#[test]
fn tiny_ggufs_truncated_at_every_header_offset_and_through_the_data() {
    for path in tiny_ggufs() {
        let full = std::fs::read(&path).unwrap();
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        let h = parse(&full).unwrap();
        let hend = header_end(&h);
        let mut cuts: Vec<usize> = (0..=h.data_offset as usize + 64).collect();
        cuts.extend((h.data_offset as usize..full.len()).step_by(1021));
        for t in &h.tensors {
            let start = (h.data_offset + t.offset) as usize;
            let end = start + t.n_bytes as usize;
            cuts.extend([start, start + 1, end - 1, end, end + 1]);
        }
        cuts.extend([full.len() - 1, full.len()]);
        for cut in cuts.into_iter().filter(|&c| c <= full.len()) {
            check_truncation(&full, &h, hend, cut, &label);
        }
    }
}

#[test]
fn tiny_ggufs_bit_flipped() {
    for (i, path) in tiny_ggufs().into_iter().enumerate() {
        let full = std::fs::read(&path).unwrap();
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        let h = parse(&full).unwrap();
        let header_len = h.data_offset as usize;
        let mut rng = Rng::new(0x6b65_7374_7265_6c00 + i as u64);
        let (mut ok, mut err) = (0, 0);
        for round in 0..3000 {
            // Mostly in the header, where it matters; sometimes anywhere.
            let region = if round % 10 == 0 {
                full.len()
            } else {
                header_len
            };
            let mut buf = full.clone();
            let log = flip_bits(&mut rng, &mut buf, region);
            let what = || format!("{label} round {round}:{log}");
            match parse_no_panic(&buf, &what) {
                Ok(h2) => {
                    check_invariants(&h2, buf.len(), &what);
                    ok += 1;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    err += 1;
                }
            }
        }
        eprintln!("{label}: 3000 mutants, {ok} parsed, {err} rejected");
        assert!(err > 0, "{label}: no mutant was rejected");
    }
}

/// Tiny files with a truncation *and* bit flips: errors still never panic.
#[test]
fn tiny_ggufs_flipped_and_truncated() {
    let mut rng = Rng::new(42);
    for path in tiny_ggufs() {
        let full = std::fs::read(&path).unwrap();
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        let h = parse(&full).unwrap();
        for round in 0..500 {
            let mut buf = full[..h.data_offset as usize].to_vec();
            let log = flip_bits(&mut rng, &mut buf, h.data_offset as usize);
            let cut = rng.below(buf.len() as u64 + 1) as usize;
            let what = || format!("{label} round {round}:{log} cut {cut}");
            if let Ok(h2) = parse_no_panic(&buf[..cut], &what) {
                check_invariants(&h2, cut, &what);
            }
        }
    }
}

const PREFIX: usize = 8 << 20;

#[test]
fn real_model_headers_truncated() {
    for path in real_models("real_model_headers_truncated") {
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        // The full header, from the mapped file (only the header pages are touched).
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{label}: {e}"));
        let h = &file.header;
        let prefix = read_prefix(&path, PREFIX);
        assert!(
            h.data_offset as usize <= prefix.len(),
            "{label}: header over 8 MB"
        );
        let hend = header_end(h);
        let mut rng = Rng::new(7);
        // Every offset in the first 4 KB (magic, counts, first keys), the tensor index's end,
        // and random offsets through the rest of the header (the big token arrays included).
        let mut cuts: Vec<usize> = (0..4096).collect();
        cuts.extend(h.data_offset as usize - 16..=h.data_offset as usize);
        cuts.extend((0..50).map(|_| rng.below(h.data_offset) as usize));
        for cut in cuts {
            check_truncation(&prefix, h, hend, cut, &label);
        }
    }
}

#[test]
fn real_models_truncated_inside_the_data_section() {
    for path in real_models("real_models_truncated_inside_the_data_section") {
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{label}: {e}"));
        let full = file.bytes();
        let h = &file.header;
        let hend = header_end(h);
        let mut rng = Rng::new(11);
        let mut cuts = vec![h.data_offset as usize, full.len() - 1];
        // Inside a sample of tensors (first, last, random ones), and just past some of them.
        let n = h.tensors.len();
        let picks = [0, 1, n / 2, n - 1]
            .into_iter()
            .chain((0..12).map(|_| rng.below(n as u64) as usize))
            .collect::<Vec<_>>();
        for i in picks {
            let t = &h.tensors[i];
            let start = h.data_offset + t.offset;
            cuts.push((start + 1 + rng.below(t.n_bytes - 1)) as usize);
            cuts.push((start + t.n_bytes - 1) as usize);
        }
        for cut in cuts {
            // The message names the tensor, for the user.
            let msg = check_truncation(full, h, hend, cut, &label);
            assert!(
                msg.contains("tensor '") && msg.contains("past the end"),
                "{label}: {msg}"
            );
        }
    }
}

#[test]
fn real_model_headers_bit_flipped() {
    for (i, path) in real_models("real_model_headers_bit_flipped")
        .into_iter()
        .enumerate()
    {
        let label = path.file_name().unwrap().to_string_lossy().to_string();
        let prefix = read_prefix(&path, PREFIX);
        // Learn where the header ends from the 8 MB prefix alone: it fails on the first tensor.
        let file = GgufFile::open(&path).unwrap();
        let header_len = file.header.data_offset as usize;
        drop(file);
        let mut rng = Rng::new(0xf11b + i as u64);
        for round in 0..60 {
            let mut buf = prefix.clone();
            // Half the flips in the tensor index at the end (small region, many fields), half
            // anywhere in the header.
            let log = if round % 2 == 0 {
                let tail = (24 * 1024).min(header_len);
                let mut sub = buf[header_len - tail..header_len].to_vec();
                let l = flip_bits(&mut rng, &mut sub, tail);
                buf[header_len - tail..header_len].copy_from_slice(&sub);
                format!("(in last {tail} bytes){l}")
            } else {
                flip_bits(&mut rng, &mut buf, header_len)
            };
            let what = || format!("{label} round {round}:{log}");
            if let Ok(h2) = parse_no_panic(&buf, &what) {
                // Only possible if a flip made every tensor fit in the 8 MB prefix.
                check_invariants(&h2, buf.len(), &what);
            }
        }
    }
}
