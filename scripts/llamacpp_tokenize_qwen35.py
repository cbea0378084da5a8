#!/usr/bin/env python3
"""llama.cpp's tokenization under the qwen35 pre-tokenizer, as a test fixture.

Qwen3.5 GGUFs name the pre-tokenizer `qwen35` (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35: combining
marks \\p{M} join the letters of a word, where qwen2's split cuts them off). This writes a
vocab-only GGUF with the tokenizer of MODEL (a Qwen2.5 GGUF: the same byte-level BPE family) and
`tokenizer.ggml.pre = qwen35`, has the peer package (llama-cpp-python, vocab_only) tokenize the
texts below with it, and writes what llama.cpp returned as JSON. The test
(crates/kestrel-tokenizer/tests/it/llamacpp_tokenize.rs) loads MODEL's tokenizer with the same
pre-tokenizer and compares.

    ~/.cache/kestrel-peers/venv/bin/python3 scripts/llamacpp_tokenize_qwen35.py \\
        models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf testdata/llamacpp/tokenize_qwen35.json
"""
import json
import sys
import tempfile
from pathlib import Path

import gguf  # PyPI "gguf" (>= 0.19)
import llama_cpp

TEXTS = {
    "accents_precomposed": "Café, naïve résumé, São Paulo, Ångström, façade, jalapeño.",
    "accents_combining": "Cafe\u0301, nai\u0308ve re\u0301sume\u0301, Sa\u0303o Paulo, A\u030angstro\u0308m.",
    "vietnamese": "Tiếng Việt có dấu: người, được, những; Tie\u0302\u0301ng Vie\u0323\u0302t.",
    "hindi": "नमस्ते दुनिया! यह एक परीक्षण है। हिन्दी में मात्राएँ और संयुक्ताक्षर: क्षत्रिय, श्रद्धा।",
    "tamil_bengali": "வணக்கம் உலகம்; আমি বাংলায় গান গাই।",
    "arabic": "مرحبا بالعالم، هذا اختبار. مَرْحَبًا بِكُمْ فِي الْعَالَمِ ١٢٣٤",
    "hebrew": "שָׁלוֹם עוֹלָם, זֶה מִבְחָן.",
    "code": "fn main() {\n    let café = vec![1, 2, 3];\n    println!(\"{:?} -> {}\", café, café.len()); // naïve\n}\n",
    "python": "def résumé(x: int) -> str:\n\treturn f\"{x:08.3f}\"  # 3.14159\n",
    "numbers": "3.14159 1234567 12,345.67 0x1F 1e-9 -42 ٣٫١٤ १२३४",
    "mixed": "Emoji 👍🏽 and flags 🇫🇷; ZWJ 👨‍👩‍👧; marks alone: \u0301\u0308 after space \u0301x",
    "whitespace": "  leading spaces\n\n\ttabs\r\nand trailing   ",
}


def vocab_only(model: str, out: Path) -> None:
    r = gguf.GGUFReader(model)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "tokenizer.ggml.pre":
            w.add_tokenizer_pre("qwen35")
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    with tempfile.TemporaryDirectory() as d:
        voc = Path(d) / "vocab-qwen35.gguf"
        vocab_only(model, voc)
        llm = llama_cpp.Llama(model_path=str(voc), vocab_only=True, verbose=False)
        cases = []
        for name, text in TEXTS.items():
            ids = llm.tokenize(text.encode(), add_bos=False, special=False)
            cases.append({"name": name, "text": text, "ids": ids})
    meta = {
        "what": "llama.cpp token ids with tokenizer.ggml.pre = qwen35 over the tokenizer of the file below",
        "model_file": Path(model).name,
        "llama_cpp_python": llama_cpp.__version__,
        "made_by": "scripts/llamacpp_tokenize_qwen35.py",
    }
    out.write_text(json.dumps({"meta": meta, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
