#!/usr/bin/env python3
"""The kernels' machine code without a GPU: compiles kernels/*.cu with NVRTC for an architecture
(default sm_90) and disassembles the cubin (cuobjdump + nvdisasm from PyPI), then per kernel:
instructions, registers, spill stores, or, against a git revision, which kernels' SASS changed.

  python3 scripts/gpu/sass.py [--arch sm_90] [--rev REV] [--show] [PATTERN]

PATTERN (a regex) picks kernels; --rev REV compiles that revision's kernels too and lists each
kernel whose code differs (its instruction encodings, control bits included; instruction counts
old -> new, registers, spills), or says that every kernel's code is identical: a refactor of the kernels can be checked to change nothing
with no GPU at all. --show prints each picked kernel's SASS and its count of instructions by
opcode (what a kernel spends its issue slots on: the dp4a / mma against the unpacking). NVRTC comes from target/nvrtc (scripts/test.sh fetches it); the two
disassembly tools are fetched from PyPI into target/cuda-tools on first use."""
import argparse, ctypes, os, re, subprocess, sys, zipfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
KDIR = "crates/kestrel-cuda/src/kernels/"


def files(compile_rs):
    """The translation unit's files in compile.rs's order (its FILES table)."""
    return re.findall(r'\("([\w.]+)", include_str!', compile_rs)


TOOLS = os.path.join(ROOT, "target", "cuda-tools")
PKGS = ["nvidia-cuda-cuobjdump==13.5.37", "nvidia-cuda-nvdisasm==13.5.37"]


def source(rev):
    """The kernels' one translation unit, as kestrel_cuda::compile::source() joins it (with
    KESTREL_CUDA_TIMELINE set: the time-stamped build)."""
    head = "#define KESTREL_TIMELINE 1\n" if os.environ.get("KESTREL_CUDA_TIMELINE") else ""
    if rev is None:
        names = files(open(os.path.join(ROOT, KDIR, "..", "compile.rs")).read())
        return head + "\n".join(open(os.path.join(ROOT, KDIR, f)).read() for f in names)
    show = lambda path: subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], check=True,
                                       capture_output=True, text=True).stdout
    names = files(show("crates/kestrel-cuda/src/compile.rs"))
    return head + "\n".join(show(KDIR + f) for f in names)


def cubin(src, arch):
    lib = ctypes.CDLL(os.path.join(ROOT, "target", "nvrtc", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kestrel.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--use_fast_math", b"-default-device",
            b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode()
    if rc != 0:
        sys.exit(f"NVRTC failed:\n{log[-3000:]}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    # registers and spills per kernel, from ptxas's report
    res, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res.setdefault(cur, {})["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and cur:
            res.setdefault(cur, {})["spill"] = int(m.group(1))
    return buf.raw, res


def tools():
    exe = os.path.join(TOOLS, "nvidia", "cu13", "bin", "cuobjdump")
    if not os.path.exists(exe):
        os.makedirs(TOOLS, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "-d", TOOLS] + PKGS, check=True)
        for w in os.listdir(TOOLS):
            if w.endswith(".whl"):
                zipfile.ZipFile(os.path.join(TOOLS, w)).extractall(TOOLS)
        for t in ("cuobjdump", "nvdisasm"):
            os.chmod(os.path.join(TOOLS, "nvidia", "cu13", "bin", t), 0o755)
    return os.path.dirname(exe)


def sass(binary, bindir, tag):
    path = os.path.join(TOOLS, f"kernels-{tag}.cubin")
    open(path, "wb").write(binary)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True, env=env).stdout
    # per kernel: its instructions' text, and their encodings (the 128-bit words, control bits
    # included) as cuobjdump prints them in comments
    funcs, words, cur = {}, {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur], words[cur] = [], []
            continue
        if cur is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            funcs[cur].append(m.group(1).strip())
        words[cur] += re.findall(r"/\* (0x[0-9a-f]{16}) \*/", line)
    return funcs, words


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rev")
    ap.add_argument("--show", action="store_true", help="print the picked kernels' SASS and opcode counts")
    ap.add_argument("pattern", nargs="?", default=".")
    a = ap.parse_args()
    if a.show and a.rev:
        sys.exit("sass.py: --show prints this tree's kernels; leave out --rev")
    bindir = tools()
    new_bin, new_info = cubin(source(None), a.arch)
    new, new_words = sass(new_bin, bindir, "new")
    pick = lambda k: re.search(a.pattern, k)
    if a.show:
        for k in sorted(filter(pick, new)):
            ops = {}
            for ins in new[k]:
                op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]
                ops[op] = ops.get(op, 0) + 1
            print(f"== {k}: {len(new[k])} instructions, {new_info.get(k, {}).get('regs', 0)} registers")
            print("\n".join(new[k]))
            print("by opcode: " + ", ".join(f"{o} {n}" for o, n in sorted(ops.items(), key=lambda x: -x[1])))
        return
    if not a.rev:
        print(f"{'kernel':<40} {'instructions':>12} {'registers':>9} {'spill bytes':>11}")
        for k in sorted(filter(pick, new)):
            i = new_info.get(k, {})
            print(f"{k:<40} {len(new[k]):>12} {i.get('regs', 0):>9} {i.get('spill', 0):>11}")
        return
    old_bin, old_info = cubin(source(a.rev), a.arch)
    old, old_words = sass(old_bin, bindir, "old")
    changed = 0
    for k in sorted(filter(pick, set(old) | set(new))):
        if k not in old or k not in new:
            print(f"{k}: {'added' if k in new else 'removed'}")
            changed += 1
        elif old_words[k] != new_words[k]:
            o, n = old_info.get(k, {}), new_info.get(k, {})
            print(f"{k}: {len(old[k])} -> {len(new[k])} instructions, registers {o.get('regs')} -> "
                  f"{n.get('regs')}, spill bytes {o.get('spill', 0)} -> {n.get('spill', 0)}")
            changed += 1
    total = len([k for k in new if pick(k)])
    print(f"{changed} of {total} kernels changed against {a.rev}" if changed else
          f"every kernel's machine code ({total}: instructions and their encodings) is identical to {a.rev}'s")


if __name__ == "__main__":
    main()
