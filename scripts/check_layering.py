#!/usr/bin/env python3
"""The layering check: no #include goes from a lower module into a higher one.

    /usr/bin/python3 scripts/check_layering.py [--root DIR]

Exit status 0 when every quoted #include of a tracked source (.h .cc .cu .cuh .inc under
engine/, proto/, server/, client/, bench/, tests/) names a header its module may use; 1 with one
line per offending include otherwise (file:line, the two modules, and what the includer may use).
CTest runs it (tests/layering), so scripts/test.sh fails on a bad include.

The modules, bottom to top (each one a CMake library; docs/DESIGN.md, "Modules"):

  common     engine/common     Status macros, logging, files, flags helpers (dcformer_common)
  simt       engine/simt       the SIMT emulator: a platform, not part of any backend
  weights    engine/weights    checkpoint readers/writers, dtypes, tensors
  tokenizer  engine/tokenizer  byte-level BPE, streaming detokenizer
  model      engine/model      ModelConfig, ModelWeights, the random-model writer
  kv         engine/kv         paged KV-cache bookkeeping
  sampling   engine/sampling   sampling parameters, host token sampler, Philox
  execution  engine/execution  the Backend interface, StepBatch, the host-side step plan
  cpu        engine/cpu        the CPU backend
  cuda       engine/cuda       the CUDA backend (kernels, device sampler, plugin)
  serving    engine/serving    engine loop, scheduler, output processor, SequenceRunner
  backends   engine/backends   the backend factory: the one place that knows every backend
  tools      engine/tools      dcformer-generate, -make-model, -decode-bench
  proto      proto/            the public API (generated dcformer/v1/*.pb.h)
  rpc        proto/rpc/        gRPC support the server and the clients share (the log sink)
  server     server/           the gRPC process
  client     client/           dcformer-cli and the shared client channel
  testing    tests/testing     test support (references, fakes, subprocess and temp dirs)
  bench      bench/            benchmarks and dcformer-loadgen

Production code may include only the modules listed as its dependencies in MAY_USE (not
simply everything lower: cpu and cuda never include each other, serving never names a
concrete backend). A unit test in tests/unit/<m> tests module <m>: it may include <m>,
anything ranked below <m> (a backend's kernels are checked against the CPU oracle, the engine
runs on real backends) and tests/testing. Other tests (integration, fuzz, tools) may include
anything.
"""
import argparse
import os
import re
import subprocess
import sys

# Bottom to top. A module's rank is its index.
ORDER = ["common", "simt", "weights", "tokenizer", "model", "kv", "sampling", "execution",
         "cpu", "cuda", "serving", "backends", "tools", "proto", "rpc", "server", "client",
         "testing", "bench"]
RANK = {m: i for i, m in enumerate(ORDER)}

ENGINE = ORDER[:ORDER.index("tools") + 1]
BELOW_EXECUTION = ["common", "weights", "model", "kv", "sampling"]

# What each module's own code may include (besides itself).
MAY_USE = {
    "common": [],
    "simt": [],
    "weights": ["common"],
    "tokenizer": ["common"],
    "model": ["common", "weights"],
    "kv": ["common", "weights", "model"],
    "sampling": ["common"],
    "execution": BELOW_EXECUTION,
    "cpu": BELOW_EXECUTION + ["execution"],
    "cuda": BELOW_EXECUTION + ["execution", "simt"],
    "serving": BELOW_EXECUTION + ["execution", "tokenizer"],
    "backends": BELOW_EXECUTION + ["execution", "cpu", "cuda"],
    "tools": [m for m in ENGINE if m != "tools"],
    "proto": [],
    "rpc": ["common"],
    "server": BELOW_EXECUTION + ["execution", "tokenizer", "serving", "backends", "proto",
               "rpc"],
    "client": ["common", "proto", "rpc"],
    "testing": [m for m in ENGINE if m != "tools"],
    "bench": [m for m in ENGINE if m != "tools"] + ["proto", "rpc", "client", "testing"],
}

# Folder prefix -> module, longest prefix first.
PREFIXES = sorted(
    [("engine/" + m + "/", m) for m in ENGINE] +
    [("proto/", "proto"), ("dcformer/v1/", "proto"), ("proto/rpc/", "rpc"), ("server/", "server"),
     ("client/", "client"), ("tests/testing/", "testing"), ("bench/", "bench")],
    key=lambda p: -len(p[0]))

SOURCE_DIRS = ("engine/", "proto/", "server/", "client/", "bench/", "tests/")
SOURCE_EXTS = (".h", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path):
    for prefix, module in PREFIXES:
        if path.startswith(prefix):
            return module
    return None


def includer_kind(path):
    """(kind, module): ("code", m) for module code, ("unit", m) for tests/unit/<m>, or
    ("free", None) for tests that may include anything."""
    m = re.match(r"tests/unit/([a-z_]+)/", path)
    if m:
        tested = m.group(1)
        return ("unit", tested) if tested in RANK else ("free", None)
    if path.startswith("tests/") and not path.startswith("tests/testing/"):
        return ("free", None)
    module = module_of(path)
    return ("code", module) if module else ("free", None)


def allowed(kind, module, target_path, target_module):
    if kind == "free":
        return True
    if kind == "unit":
        unit = re.match(r"tests/unit/([a-z_]+)/", target_path)
        if unit:  # another module's test helpers: only of a module at or below
            return unit.group(1) in RANK and RANK[unit.group(1)] <= RANK[module]
        if target_module is None:
            return True
        return target_module == "testing" or RANK[target_module] <= RANK[module]
    if target_module is None or target_module == module:
        return True
    return target_module in MAY_USE[module]


def tracked_sources(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                              "--exclude-standard", *SOURCE_DIRS],
                             check=True, capture_output=True, text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = []
        for top in SOURCE_DIRS:
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
                dirnames[:] = [d for d in dirnames if d not in ("data", "node_modules")]
                for f in filenames:
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(p for p in out if p.endswith(SOURCE_EXTS) and "/data/" not in p
                  and os.path.isfile(os.path.join(root, p)))


def check(root):
    """Returns the list of violations, one message each."""
    problems = []
    for path in tracked_sources(root):
        kind, module = includer_kind(path)
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if "/" not in target:  # a file beside the includer
                    continue
                target_module = module_of(target)
                if allowed(kind, module, target, target_module):
                    continue
                if kind == "unit":
                    may = f"tests/unit/{module} may include {module}, what is below it, testing"
                else:
                    may = (f"{module} may include " + (", ".join(MAY_USE[module]) or "nothing")
                           + " besides itself")
                problems.append(f"{path}:{lineno}: includes {target}: "
                                f"{kind_name(kind, module)} -> {target_module or 'tests'} "
                                f"goes up or sideways ({may})")
    return problems


def kind_name(kind, module):
    return f"tests/unit/{module}" if kind == "unit" else module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="source tree to check (default: this repository)")
    args = parser.parse_args()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} include(s) break the layering "
              "(scripts/check_layering.py lists the modules and what each may use)")
        return 1
    print(f"check_layering: {len(tracked_sources(args.root))} sources, every include goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
