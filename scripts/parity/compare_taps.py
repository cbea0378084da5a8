#!/usr/bin/env python3
"""Compare kestrel's taps (KESTREL_TAP_DIR) with llama.cpp's graph dump, layer by layer:

    python3 scripts/parity/compare_taps.py llama.npz TAPDIR N_LAYERS

`=` means bit-identical; otherwise max |difference| and (count of differing values). Needs numpy
(the peers' venv has it). llama.cpp's node numbering differs for models with q/k/v biases
(Qwen2): there the `Qcur_rope` column compares against the wrong node. See docs/parity.md.
"""
import numpy as np, sys, os
ref = np.load(sys.argv[1]); d = sys.argv[2]; nl = int(sys.argv[3])
pairs = [('attn_norm','attn_norm-{}#0'),('Qcur','Qcur-{}#0'),('Kcur','Kcur-{}#0'),('Vcur','Vcur-{}#0'),
         ('Qcur_rope','Qcur-{}#2'),('Kcur_rope','Kcur-{}#2'),('kqv_out','kqv_out-{}#0'),('attn_out','attn_out-{}#0'),
         ('ffn_inp','ffn_inp-{}#0'),('ffn_norm','ffn_norm-{}#0'),('ffn_gate','ffn_gate-{}#0'),('ffn_up','ffn_up-{}#0'),
         ('ffn_swiglu','ffn_swiglu-{}#0'),('ffn_out','ffn_out-{}#0'),('l_out','l_out-{}#0')]
for l in range(nl):
    row = []
    for ours, theirs in pairs:
        p = f"{d}/{ours}-{l}.f32"
        k = theirs.format(l)
        if not os.path.exists(p) or k not in ref: row.append(f"{ours}:?"); continue
        a = np.fromfile(p, dtype=np.float32); b = ref[k]
        if a.size != b.size: row.append(f"{ours}:size{a.size}/{b.size}"); continue
        diff = np.abs(a-b).max(); neq = (a != b).sum()
        row.append(f"{ours}:{'=' if neq==0 else f'{diff:.1e}({neq})'}")
    print(l, ' '.join(row))
