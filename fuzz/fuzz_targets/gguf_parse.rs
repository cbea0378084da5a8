//! Fuzz target: `kestrel_gguf::parse` must return Ok or Err for any bytes, never panic, and what
//! it accepts must satisfy the invariants the rest of the engine relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let header = match kestrel_gguf::parse(data) {
        Ok(h) => h,
        Err(e) => {
            // Rendering the error must not panic either.
            let _ = e.to_string();
            return;
        }
    };
    let len = data.len() as u64;
    assert!(header.version == 2 || header.version == 3);
    assert!(header.alignment.is_power_of_two());
    assert_eq!(header.data_offset % header.alignment, 0);
    if !header.tensors.is_empty() {
        assert!(header.data_offset <= len);
    }
    let _ = header.architecture();
    for (key, value) in &header.metadata {
        assert!(header.get(key).is_some());
        let _ = value.summary();
        let _ = (
            value.as_u64(),
            value.as_i64(),
            value.as_f64(),
            value.as_str(),
        );
    }
    let mut sum = 0u64;
    for t in &header.tensors {
        assert!(std::ptr::eq(header.tensor(&t.name).unwrap(), t));
        assert!(!t.dims.is_empty() && t.dims.len() <= 4);
        assert_eq!(t.offset % header.alignment, 0);
        assert_eq!(t.ggml_type.bytes_for(t.n_elements()), Some(t.n_bytes));
        // What GgufFile::tensor_data would slice must lie inside the file.
        let start = header.data_offset + t.offset;
        let end = start.checked_add(t.n_bytes).expect("tensor end overflows");
        assert!(
            end <= len,
            "tensor {} ends at {end}, file has {len}",
            t.name
        );
        let _ = &data[start as usize..end as usize];
        sum += t.n_bytes;
    }
    assert_eq!(header.tensor_bytes(), sum);
});
