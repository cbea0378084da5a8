use super::ggml::*;
use super::tile::*;
use super::*;

/// The SIMD kernel against the scalar oracle on random data of several shapes.
#[test]
fn simd_attention_matches_scalar() {
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for (group, d, n_pos, n_kv) in [
        (1usize, 8usize, 1usize, 1usize),
        (7, 64, 37, 2),
        (3, 16, 300, 3),
        (2, 128, 65, 1),
    ] {
        let kv_dim = n_kv * d;
        let k: Vec<f16> = (0..n_pos * kv_dim)
            .map(|_| f16::from_f32(rnd() * 3.0))
            .collect();
        let v: Vec<f16> = (0..n_pos * kv_dim).map(|_| f16::from_f32(rnd())).collect();
        let q: Vec<f32> = (0..group * d).map(|_| rnd() * 2.0).collect();
        // A shuffled block table of 8-row blocks covering n_pos rows.
        let n_blocks = n_pos.div_ceil(8);
        let mut blocks: Vec<u32> = (0..n_blocks as u32).collect();
        blocks.reverse();
        let k: Vec<f16> = (0..n_blocks * 8 * kv_dim)
            .map(|i| k.get(i).copied().unwrap_or(f16::ZERO))
            .collect();
        let v: Vec<f16> = (0..n_blocks * 8 * kv_dim)
            .map(|i| v.get(i).copied().unwrap_or(f16::ZERO))
            .collect();
        let rows = Rows {
            k: &k,
            v: &v,
            kv_dim,
            kv_head: n_kv - 1,
            head_dim: d,
            block_size: 8,
        };
        let span = Span {
            blocks: &blocks,
            block_size: 8,
            n_pos,
            first: 0,
        };
        let mut want = vec![0f32; group * d];
        attend_group_f16_scalar(&q, &rows, &span, 0.125, &mut want);
        let mut got = vec![0f32; group * d];
        attend_group_f16(&q, &rows, &span, 0.125, &mut got);
        let err = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < 2e-3,
            "group {group} d {d} n_pos {n_pos}: max error {err}"
        );
    }
}

/// llama.cpp's one-query kernel (with and without the two-way split past 256 positions)
/// and its tiled kernel: near the scalar oracle, and the AVX-512 forms equal the portable
/// bodies bit for bit.
#[test]
fn ggml_order_kernels_match_the_oracle_and_their_portable_forms() {
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let (group, d, n_pos, n_kv, bs) = (3usize, 64usize, 600usize, 2usize, 16usize);
    let kv_dim = n_kv * d;
    let n_blocks = n_pos.div_ceil(bs);
    let mut blocks: Vec<u32> = (0..n_blocks as u32).collect();
    blocks.reverse();
    let k: Vec<f16> = (0..n_blocks * bs * kv_dim)
        .map(|_| f16::from_f32(rnd() * 2.0))
        .collect();
    let v: Vec<f16> = (0..n_blocks * bs * kv_dim)
        .map(|_| f16::from_f32(rnd()))
        .collect();
    let rows = Rows {
        k: &k,
        v: &v,
        kv_dim,
        kv_head: 1,
        head_dim: d,
        block_size: bs,
    };
    let scale = 0.125;
    // One query at the last position: split (single) and unsplit.
    let q: Vec<f32> = (0..group * d).map(|_| rnd() * 2.0).collect();
    let span = Span {
        blocks: &blocks,
        block_size: bs,
        n_pos,
        first: 0,
    };
    let mut want = vec![0f32; group * d];
    attend_group_f16_scalar(&q, &rows, &span, scale, &mut want);
    for single in [false, true] {
        let mut got = vec![0f32; group * d];
        attend_group_f16_ggml(&q, &rows, &span, scale, &mut got, single);
        let err = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 5e-3, "one-query (single {single}): max error {err}");
    }
    // The block-at-a-time SIMD form equals the portable body bit for bit: head_dim 64,
    // 128 and 256, groups of 3, 7 and 2, whole spans and the upper half of a split one (first > 0,
    // not on a block boundary).
    for (d, group, first) in [
        (64, 3, 0),
        (64, 3, 300),
        (128, 7, 0),
        (128, 7, 259),
        (256, 2, 17),
    ] {
        let kv_dim = n_kv * d;
        let k: Vec<f16> = (0..n_blocks * bs * kv_dim)
            .map(|_| f16::from_f32(rnd() * 2.0))
            .collect();
        let v: Vec<f16> = (0..n_blocks * bs * kv_dim)
            .map(|_| f16::from_f32(rnd()))
            .collect();
        let rows = Rows {
            k: &k,
            v: &v,
            kv_dim,
            kv_head: 1,
            head_dim: d,
            block_size: bs,
        };
        let q: Vec<f32> = (0..group * d).map(|_| rnd() * 4.0).collect();
        let span = Span { first, ..span };
        let mut portable = Partial {
            max: vec![0.0; group],
            sum: vec![0.0; group],
            acc: vec![0.0; group * d],
        };
        attend_ggml_body(&q, &rows, &span, scale, &mut portable);
        let simd = ggml_partial(&q, &rows, &span, scale);
        assert_eq!(portable.acc, simd.acc, "d {d} group {group} first {first}");
        assert_eq!(portable.sum, simd.sum);
        assert_eq!(portable.max, simd.max);
        #[cfg(target_arch = "x86_64")]
        if has_f16c() {
            let mut avx2 = Partial {
                max: vec![0.0; group],
                sum: vec![0.0; group],
                acc: vec![0.0; group * d],
            };
            // SAFETY: AVX2, FMA and F16C are available.
            unsafe { attend_ggml_avx2(&q, &rows, &span, scale, &mut avx2) };
            assert_eq!(
                portable.acc, avx2.acc,
                "AVX2: d {d} group {group} first {first}"
            );
            assert_eq!(portable.sum, avx2.sum);
            assert_eq!(portable.max, avx2.max);
        }
    }

    // A tile of 70 queries at positions 500..570 (two tiles of 64 + 6 in the engine).
    let nq = 64;
    let positions: Vec<usize> = (500..500 + nq).collect();
    let toks: Vec<TokenKv> = positions
        .iter()
        .map(|&pos| TokenKv {
            tiled: false,
            pos,
            blocks: &blocks,
        })
        .collect();
    let q_dim = 2 * group * d;
    let qs: Vec<f32> = (0..nq * q_dim).map(|_| rnd() * 2.0).collect();
    let tile = QueryTile {
        tokens: &toks,
        q: &qs,
        q_off: group * d,
        q_dim,
        group,
        block_size: bs,
    };
    let mut out_simd = vec![0f32; nq * q_dim];
    let mut out_body = vec![0f32; nq * q_dim];
    {
        let ptr = SharedMut::new(&mut out_simd);
        // SAFETY: each query's slice is distinct.
        attend_tile_ggml(&tile, &rows, scale, |i| unsafe {
            ptr.slice(i * q_dim + group * d, group * d)
        });
        let ptr = SharedMut::new(&mut out_body);
        // SAFETY: as above.
        attend_tile_body(&tile, &rows, scale, &|i| unsafe {
            ptr.slice(i * q_dim + group * d, group * d)
        });
    }
    assert_eq!(out_simd, out_body);
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        let mut out_avx2 = vec![0f32; nq * q_dim];
        let ptr = SharedMut::new(&mut out_avx2);
        // SAFETY: AVX2, FMA and F16C are available; each query's slice is distinct.
        unsafe {
            super::tile::attend_tile_avx2(&tile, &rows, scale, &|i| {
                ptr.slice(i * q_dim + group * d, group * d)
            })
        };
        assert_eq!(out_avx2, out_body, "the AVX2 tile kernel equals the body");
    } else {
        eprintln!("skipped the AVX2 tile kernel: this CPU lacks AVX2/FMA/F16C");
    }
    for (i, &pos) in positions.iter().enumerate() {
        let span = Span {
            blocks: &blocks,
            block_size: bs,
            n_pos: pos + 1,
            first: 0,
        };
        let qg = &qs[i * q_dim + group * d..][..group * d];
        let mut want = vec![0f32; group * d];
        attend_group_f16_scalar(qg, &rows, &span, scale, &mut want);
        let got = &out_simd[i * q_dim + group * d..][..group * d];
        let err = want
            .iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 5e-3, "tiled, query {i}: max error {err}");
    }
}
