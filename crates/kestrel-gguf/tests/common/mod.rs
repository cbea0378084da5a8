//! Test-only helpers: a tiny GGUF writer, a seeded PRNG, and the paths of the test files.
//!
//! The writer is deliberately independent of the reader (it has its own type-size table), so a
//! bug in the reader's size arithmetic cannot hide itself by being shared with the tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Paths

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tiny f32 GGUFs under testdata/tiny/, sorted. These ship with the repo: a missing one fails.
pub fn tiny_ggufs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let dir = repo_root().join("testdata/tiny");
    for model in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let model = model.unwrap().path();
        if !model.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&model).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "gguf") {
                out.push(f);
            }
        }
    }
    out.sort();
    assert!(
        out.len() >= 5,
        "expected the 5 tiny GGUFs under {}",
        dir.display()
    );
    out
}

/// The real models under models/ (fetched by scripts/fetch-models.sh, not in git). When none are
/// there the caller should skip, unless KESTREL_REQUIRE_MODELS=1, in which case this panics.
pub fn real_models(test: &str) -> Vec<PathBuf> {
    let dir = repo_root().join("models");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    if out.is_empty() {
        if std::env::var("KESTREL_REQUIRE_MODELS").as_deref() == Ok("1") {
            panic!(
                "{test}: KESTREL_REQUIRE_MODELS=1 but no models/*.gguf under {} (run scripts/fetch-models.sh)",
                dir.display()
            );
        }
        eprintln!(
            "SKIPPED {test}: no models/*.gguf under {} (run scripts/fetch-models.sh; set KESTREL_REQUIRE_MODELS=1 to make this a failure)",
            dir.display()
        );
    }
    out
}

/// Reads at most `limit` bytes from the start of `path`.
pub fn read_prefix(path: &Path, limit: usize) -> Vec<u8> {
    use std::io::Read;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = Vec::with_capacity(limit);
    f.take(limit as u64).read_to_end(&mut buf).unwrap();
    buf
}

// ---------------------------------------------------------------------------------------------
// PRNG (splitmix64: tiny, good enough, and the same sequence everywhere)

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0), bias negligible for the sizes used here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

// ---------------------------------------------------------------------------------------------
// GGUF writer

/// Value type ids, as in the GGUF spec.
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A metadata value to write. `Raw` writes any type id followed by any bytes (for broken files).
#[derive(Clone, Debug)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and elements (all of that type).
    Arr(u32, Vec<V>),
    /// Array header with a claimed length that need not match the elements that follow.
    ArrClaim {
        elem: u32,
        claimed_len: u64,
        body: Vec<u8>,
    },
    U64(u64),
    I64(i64),
    F64(f64),
    Raw(u32, Vec<u8>),
}

impl V {
    pub fn s(s: &str) -> V {
        V::Str(s.to_string())
    }

    pub fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => ty::U8,
            V::I8(_) => ty::I8,
            V::U16(_) => ty::U16,
            V::I16(_) => ty::I16,
            V::U32(_) => ty::U32,
            V::I32(_) => ty::I32,
            V::F32(_) => ty::F32,
            V::Bool(_) => ty::BOOL,
            V::Str(_) => ty::STRING,
            V::Arr(..) | V::ArrClaim { .. } => ty::ARRAY,
            V::U64(_) => ty::U64,
            V::I64(_) => ty::I64,
            V::F64(_) => ty::F64,
            V::Raw(t, _) => *t,
        }
    }

    /// The encoded value, without its type id.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.push(*v as u8),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(*v as u8),
            V::Str(s) => put_str(out, s),
            V::Arr(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for it in items {
                    assert_eq!(it.type_id(), *elem, "array element of the wrong type");
                    it.encode(out);
                }
            }
            V::ArrClaim {
                elem,
                claimed_len,
                body,
            } => {
                out.extend(elem.to_le_bytes());
                out.extend(claimed_len.to_le_bytes());
                out.extend(body);
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
            V::Raw(_, bytes) => out.extend(bytes),
        }
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// ggml type ids used by the tests.
pub mod gt {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q5_0: u32 = 6;
    pub const Q5_1: u32 = 7;
    pub const Q8_0: u32 = 8;
    pub const Q8_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K: u32 = 11;
    pub const Q4_K: u32 = 12;
    pub const Q5_K: u32 = 13;
    pub const Q6_K: u32 = 14;
    pub const Q8_K: u32 = 15;
    pub const I8: u32 = 24;
    pub const I16: u32 = 25;
    pub const I32: u32 = 26;
    pub const I64: u32 = 27;
    pub const F64: u32 = 28;
    pub const BF16: u32 = 30;
}

/// (elements per block, bytes per block) for a ggml type id, from ggml's type traits table.
/// Written out here independently of the reader's own table.
pub fn ggml_block(type_id: u32) -> Option<(u64, u64)> {
    Some(match type_id {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0: f16 d + 16 nibble bytes
        3 => (32, 20),    // Q4_1: f16 d, m + 16
        6 => (32, 22),    // Q5_0: f16 d + 4 qh + 16
        7 => (32, 24),    // Q5_1: f16 d, m + 4 + 16
        8 => (32, 34),    // Q8_0: f16 d + 32
        9 => (32, 36),    // Q8_1: f16 d, s + 32
        10 => (256, 84),  // Q2_K: 16 scales + 64 qs + f16 d, dmin
        11 => (256, 110), // Q3_K: 32 hmask + 64 qs + 12 scales + f16 d
        12 => (256, 144), // Q4_K: f16 d, dmin + 12 scales + 128 qs
        13 => (256, 176), // Q5_K: f16 d, dmin + 12 scales + 32 qh + 128 qs
        14 => (256, 210), // Q6_K: 128 ql + 64 qh + 16 scales + f16 d
        15 => (256, 292), // Q8_K: f32 d + 256 qs + 16 i16 bsums
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

/// Bytes of a tensor of type `type_id` and shape `dims`, computed independently of the reader.
pub fn tensor_size(type_id: u32, dims: &[u64]) -> u64 {
    let (blk, bytes) = ggml_block(type_id).expect("known ggml type");
    let n: u64 = dims.iter().product();
    assert_eq!(n % blk, 0, "not a whole number of blocks");
    n / blk * bytes
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset relative to the data section. None: placed after the previous tensor, aligned.
    pub offset: Option<u64>,
}

pub fn tensor(name: &str, dims: &[u64], ggml_type: u32) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        dims: dims.to_vec(),
        ggml_type,
        offset: None,
    }
}

/// Builds a GGUF file in memory.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub magic: [u8; 4],
    pub version: u32,
    pub kvs: Vec<(String, V)>,
    pub tensors: Vec<TensorSpec>,
    /// Override the tensor / metadata counts written in the header.
    pub n_tensors_claim: Option<u64>,
    pub n_kv_claim: Option<u64>,
    /// Data section length; None: exactly the end of the last tensor.
    pub data_len: Option<u64>,
}

impl Default for Gguf {
    fn default() -> Self {
        Gguf {
            magic: *b"GGUF",
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            n_tensors_claim: None,
            n_kv_claim: None,
            data_len: None,
        }
    }
}

impl Gguf {
    pub fn new() -> Self {
        Self::default()
    }

    /// A small valid model-like file: a few metadata keys, two F32 tensors.
    pub fn minimal() -> Self {
        Gguf::new()
            .kv("general.architecture", V::s("llama"))
            .kv("llama.block_count", V::U32(1))
            .tensor(tensor("token_embd.weight", &[8, 4], gt::F32))
            .tensor(tensor("output_norm.weight", &[8], gt::F32))
    }

    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }

    pub fn kv(mut self, key: &str, v: V) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    pub fn tensor(mut self, t: TensorSpec) -> Self {
        self.tensors.push(t);
        self
    }

    pub fn tensor_at(mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Self {
        let mut t = tensor(name, dims, ggml_type);
        t.offset = Some(offset);
        self.tensors.push(t);
        self
    }

    pub fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", V::U32(a)) if a.is_power_of_two() => Some(*a as u64),
                _ => None,
            })
            .unwrap_or(32)
    }

    /// Resolved (offset, size) of each tensor in the data section.
    pub fn layout(&self) -> Vec<(u64, u64)> {
        let align = self.alignment();
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                // Sizes that make no sense (overflow, unknown type) count as 0 here: the file
                // is broken on purpose and the reader must say so.
                let size = ggml_block(t.ggml_type)
                    .and_then(|(blk, bytes)| {
                        let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
                        (n / blk).checked_mul(bytes)
                    })
                    .filter(|&s| s < 1 << 30)
                    .unwrap_or(0);
                let off = t.offset.unwrap_or(next);
                next = off.wrapping_add(size).div_ceil(align).wrapping_mul(align);
                (off, size)
            })
            .collect()
    }

    /// Just the header: magic through the last tensor info (no padding, no data).
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(self.magic);
        out.extend(self.version.to_le_bytes());
        out.extend(
            self.n_tensors_claim
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        out.extend(
            self.n_kv_claim
                .unwrap_or(self.kvs.len() as u64)
                .to_le_bytes(),
        );
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            v.encode(&mut out);
        }
        for (t, (off, _)) in self.tensors.iter().zip(self.layout()) {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(off.to_le_bytes());
        }
        out
    }

    /// The whole file: header, padding to the alignment, data section (a byte pattern).
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header_bytes();
        let align = self.alignment() as usize;
        out.resize(out.len().div_ceil(align) * align, 0);
        let data_len = self.data_len.unwrap_or_else(|| {
            self.layout()
                .iter()
                .map(|&(o, s)| o.saturating_add(s))
                .max()
                .unwrap_or(0)
        });
        let start = out.len();
        out.extend((0..data_len).map(|i| (i as u8).wrapping_mul(31)));
        debug_assert_eq!(out.len() - start, data_len as usize);
        out
    }
}

/// One value of every scalar type, and arrays of each, and nested arrays.
pub fn every_value_type() -> Vec<(String, V)> {
    let scalars = vec![
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(60000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(1.5)),
        ("t.bool", V::Bool(true)),
        ("t.string", V::s("héllo, wörld")),
        ("t.u64", V::U64(u64::MAX - 1)),
        ("t.i64", V::I64(i64::MIN + 1)),
        ("t.f64", V::F64(-2.25e300)),
    ];
    let mut out: Vec<(String, V)> = scalars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    for (k, v) in &scalars {
        out.push((
            format!("{k}.array"),
            V::Arr(v.type_id(), vec![v.clone(); 3]),
        ));
    }
    out.push(("t.empty_array".into(), V::Arr(ty::U32, vec![])));
    out.push((
        "t.nested".into(),
        V::Arr(
            ty::ARRAY,
            vec![
                V::Arr(ty::U32, vec![V::U32(1), V::U32(2)]),
                V::Arr(ty::U32, vec![]),
                V::Arr(ty::U32, vec![V::U32(3)]),
            ],
        ),
    ));
    out.push((
        "t.nested_strings".into(),
        V::Arr(
            ty::ARRAY,
            vec![
                V::Arr(ty::STRING, vec![V::s("a"), V::s("bc")]),
                V::Arr(ty::STRING, vec![V::s("")]),
            ],
        ),
    ));
    // Three levels deep.
    out.push((
        "t.nested3".into(),
        V::Arr(
            ty::ARRAY,
            vec![V::Arr(
                ty::ARRAY,
                vec![V::Arr(ty::F64, vec![V::F64(0.5), V::F64(-0.5)])],
            )],
        ),
    ));
    out
}
