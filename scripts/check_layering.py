#!/usr/bin/env python3
"""The layering check: no #include and no library link goes from a lower module into a higher
one, and nothing escapes the check by living outside the modules it knows.

    /usr/bin/python3 scripts/check_layering.py [--root DIR] [--links FILE]

Exit status 0 when every #include ("..." and <...>) of every C/C++ source under the tree
names a header its module may use, and, with --links, every library link of the build's
targets does too; 1 with one line per offence otherwise (file:line or the CMake target, the
two modules, and what the includer may use). CTest runs it with the link graph CMake writes
at configure time (cmake/LinkGraph.cmake, build/layering/link_graph.tsv), so scripts/test.sh
fails on a bad include or link.

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

Production code may include and link only the modules listed as its dependencies in MAY_USE
(not simply everything lower: cpu and cuda never include each other, serving never names a
concrete backend). Engine modules never include gRPC, protobuf, Boost, Prometheus or an HTTP
library, and no production code includes anything under tests/ but test support where
MAY_USE lists it.

A unit test in tests/unit/<m> tests module <m>: it may include and link <m>, what <m> may use
(MAY_USE, followed transitively), tests/testing, and the few test-only uses UNIT_ALSO names
with its reason. Other tests (integration, fuzz, sanitizers) may include anything.

A private header (named *_impl.h, *_inl.h or *_internal.h, any header extension) belongs to
its folder: only the sources beside it may include it, not other folders of its own module,
not its unit tests, not any other test (they test what the module's public headers offer).

Failing closed: a source in a folder of engine/ or tests/unit/ that is not a module, a
C/C++ source outside the folders above, an include of such a folder, an #include the check
cannot read (#include MACRO) and a target defined in an unknown folder are all offences; add
the new module to ORDER and MAY_USE (and to DESIGN.md) instead.
"""
import argparse
import os
import posixpath
import re
import subprocess
import sys

# Bottom to top, as docs/DESIGN.md lists them (what may be used is MAY_USE, not the order).
ORDER = ["common", "simt", "weights", "tokenizer", "model", "kv", "sampling", "execution",
         "cpu", "cuda", "serving", "backends", "tools", "proto", "rpc", "server", "client",
         "testing", "bench"]

ENGINE = ORDER[:ORDER.index("tools") + 1]
BELOW_EXECUTION = ["common", "weights", "model", "kv", "sampling"]

# What each module's own code may include and link (besides itself).
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

# What the unit tests of a module may use beyond the module's own dependencies, and why.
UNIT_ALSO = {
    # The CUDA kernels are checked against the CPU backend's ops: the oracle.
    "cuda": ["cpu"],
    # The factory's backends are driven by what serves them: SequenceRunner and the engine
    # loop on the real backends (the serving tests themselves run on fakes).
    "backends": ["serving"],
}

# Headers the engine never includes (it stays free of gRPC, protobuf and HTTP; Boost and
# Prometheus are the server's).
FORBIDDEN_IN_ENGINE = re.compile(
    r"^(grpc|grpcpp|grpc\+\+|google/protobuf|boost|prometheus|civetweb|CivetServer|httplib|"
    r"nghttp2|curl|brpc|cpprest)\b|\.pb\.h$")
# Libraries the engine's targets never link.
FORBIDDEN_LIBS_IN_ENGINE = re.compile(
    r"(?i)(grpc|protobuf|boost|prometheus|civetweb|httplib|nghttp2|curl)")

# Folder prefix -> module, longest prefix first (generated proto headers included).
PREFIXES = sorted(
    [("engine/" + m + "/", m) for m in ENGINE] +
    [("proto/", "proto"), ("proto/rpc/", "rpc"), ("dcformer/v1/", "proto"),
     ("grpc/health/v1/", "proto"),
     ("server/", "server"), ("client/", "client"), ("tests/testing/", "testing"),
     ("bench/", "bench")],
    key=lambda p: -len(p[0]))

# Headers private to their folder (the module docstring).
PRIVATE_HEADER = re.compile(r"_(impl|inl|internal)\.(h|hh|hpp|hxx|h\+\+|cuh|inc)$")

SOURCE_EXTS = (".h", ".hh", ".hpp", ".hxx", ".h++", ".c", ".cc", ".cpp", ".cxx", ".c++",
               ".cu", ".cuh", ".inc", ".ipp", ".tcc", ".ixx", ".cppm")
SKIPPED = ("tests/data/",)  # inputs of tests, not code
DIRECTIVE = re.compile(r"^\s*#\s*(include|include_next|import)\b\s*(.*)$")
QUOTED = re.compile(r'^"([^"]+)"')
ANGLED = re.compile(r"^<([^>]+)>")


def closure(modules):
    """The modules in `modules` and everything they may use, transitively."""
    seen, todo = set(), list(modules)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(MAY_USE[m])
    return seen


def unit_scope(module):
    return closure([module] + UNIT_ALSO.get(module, [])) | {"testing"}


def module_of(path):
    for prefix, module in PREFIXES:
        if path.startswith(prefix):
            return module
    return None


def place_of(path):
    """What the tree path `path` belongs to: ("module", m), ("unit", m) for tests/unit/<m>,
    ("tests", None) for other tests, or ("stray", why) for a place that is not a module."""
    parts = path.split("/")
    if parts[0] == "engine":
        if len(parts) < 3 or parts[1] not in ENGINE:
            return ("stray", f"engine/{parts[1] if len(parts) > 2 else ''} is not a module")
        return ("module", parts[1])
    if parts[0] == "tests":
        if len(parts) > 1 and parts[1] == "unit":
            if len(parts) < 4 or parts[2] not in MAY_USE:
                return ("stray", f"tests/unit/{parts[2] if len(parts) > 3 else ''} "
                                 "tests no module")
            return ("unit", parts[2])
        if len(parts) > 1 and parts[1] == "testing":
            return ("module", "testing")
        return ("tests", None)
    module = module_of(path)
    if module:
        return ("module", module)
    return ("stray", f"{parts[0]}/ is not a module" if len(parts) > 1 else "not in a module")


def normalise(path):
    """posixpath.normpath, or None when the path leaves the tree (or is absolute)."""
    if path.startswith("/"):
        return None
    n = posixpath.normpath(path)
    if n == ".." or n.startswith("../"):
        return None
    return n


def resolve(includer, target, quoted, files):
    """The tree paths an #include may name, as the compiler searches (quoted: the includer's
    folder first; then the repository root, which every target has on its include path).
    The first that exists when one does; otherwise every candidate, so that a header the
    check cannot see is judged by each place it could be."""
    candidates = []
    if quoted:
        candidates.append(normalise(posixpath.join(posixpath.dirname(includer), target)))
    candidates.append(normalise(target))
    candidates = [c for c in candidates if c is not None]
    for c in candidates:
        if c in files:
            return [c], True
    return candidates, False


def tree_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                              "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout.split("\n")
        if not any(out) and not os.path.isdir(os.path.join(root, ".git")):
            raise OSError("not a git tree")
    except (OSError, subprocess.CalledProcessError):
        out = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".git", "node_modules", "build")]
            for f in filenames:
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return {p.replace(os.sep, "/") for p in out
            if p and os.path.isfile(os.path.join(root, p))}


def sources(files):
    return sorted(p for p in files if p.endswith(SOURCE_EXTS) and "/node_modules/" not in p
                  and not p.startswith(SKIPPED))


def may_text(kind, module):
    if kind == "unit":
        return (f"tests/unit/{module} may include "
                + ", ".join(m for m in ORDER if m in unit_scope(module)))
    return f"{module} may include " + (", ".join(MAY_USE[module]) or "nothing") + " besides itself"


def judge(kind, module, place):
    """None when an includer of `kind` ("module" or "unit") and `module` may use what `place`
    (place_of) names, else the name of what it reached."""
    tkind, tmod = place
    if tkind == "stray":
        return tmod
    reached = {"module": tmod, "unit": f"tests/unit/{tmod}", "tests": "tests"}[tkind]
    if kind == "module":
        ok = tkind == "module" and (tmod == module or tmod in MAY_USE[module])
    else:  # a unit test of `module`
        scope = unit_scope(module)
        ok = (tkind == "module" and tmod in scope) or (
            tkind == "unit" and (tmod == module or tmod in scope))
    return None if ok else reached


def in_module_folders(path):
    """Whether `path` lies where modules and tests live (so a header there that the tree
    lacks is still judged by its place, not taken for a system header)."""
    return path.startswith(("engine/", "tests/")) or module_of(path) is not None


def check_includes(root):
    """Returns (problems, number of sources scanned)."""
    files = tree_files(root)
    srcs = sources(files)
    problems = []
    for path in srcs:
        kind, module = place_of(path)
        if kind == "stray":
            problems.append(f"{path}: {module} (scripts/check_layering.py lists the modules; "
                            "add a new one there and to docs/DESIGN.md)")
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = list(enumerate(f, 1))
        for lineno, line in lines:
            d = DIRECTIVE.match(line)
            if not d:
                continue
            arg = d.group(2).strip()
            q, a = QUOTED.match(arg), ANGLED.match(arg)
            if not q and not a:
                if kind == "tests":  # integration, fuzz, sanitizer tests: anything
                    continue
                problems.append(f"{path}:{lineno}: #{d.group(1)} {arg}: the check cannot "
                                "follow a computed include; name the header")
                continue
            target = (q or a).group(1)
            candidates, exists = resolve(path, target, q is not None, files)
            if not candidates:
                if kind == "tests":
                    continue
                problems.append(f"{path}:{lineno}: includes {target}: a path outside the "
                                "repository")
                continue
            private = [c for c in candidates if PRIVATE_HEADER.search(c)
                       and in_module_folders(c)
                       and posixpath.dirname(c) != posixpath.dirname(path)]
            if private:
                problems.append(f"{path}:{lineno}: includes {target}: {private[0]} is private "
                                f"to {posixpath.dirname(private[0])}/ (only the sources "
                                "beside it may include it)")
                continue
            if kind == "tests":  # integration, fuzz, sanitizer tests: anything else
                continue
            for c in candidates:
                if not exists and not in_module_folders(c):  # a system or library header
                    if (kind == "module" and module in ENGINE
                            and FORBIDDEN_IN_ENGINE.search(c)):
                        problems.append(f"{path}:{lineno}: includes {target}: the engine "
                                        f"({module}) stays free of gRPC, protobuf, Boost, "
                                        "Prometheus and HTTP libraries")
                        break
                    continue
                bad = judge(kind, module, place_of(c))
                if bad is not None:
                    problems.append(f"{path}:{lineno}: includes {target}: "
                                    f"{kind_name(kind, module)} -> {bad} goes up or sideways "
                                    f"({may_text(kind, module)})")
                    break
    return problems, len(srcs)


def kind_name(kind, module):
    return f"tests/unit/{module}" if kind == "unit" else module


# The link graph (cmake/LinkGraph.cmake): tab-separated lines
#   target <name> <type> <folder relative to the root, "" for the root>
#   link <name> <what it links, as CMake holds it>
GENEX_LINK_ONLY = re.compile(r"^\$<LINK_ONLY:([^<>]+)>$")
NAME = re.compile(r"[A-Za-z0-9_.+-]+(?:::[A-Za-z0-9_.+-]+)*")


def read_link_graph(path):
    targets, links = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "target" and len(fields) == 4:
                targets[fields[1]] = fields[3].strip("/")
            elif fields[0] == "link" and len(fields) == 3:
                links.append((fields[1], fields[2]))
    return targets, links


def check_links(path):
    """Returns (problems, number of links checked)."""
    targets, links = read_link_graph(path)
    problems, seen = [], set()

    def place_of_target(name):
        folder = targets[name]
        if folder in ("", "cmake"):  # third-party wrappers (dcf_blas, the TSan annotations)
            return ("external", None)
        return place_of(folder + "/CMakeLists.txt")

    for name, folder in sorted(targets.items()):
        place = place_of_target(name)
        if place[0] == "stray":
            problems.append(f"target {name} (in {folder}/): {place[1]} (scripts/"
                            "check_layering.py lists the modules)")
    for name, lib in links:
        if (name, lib) in seen or lib.startswith("::@"):
            continue
        seen.add((name, lib))
        kind, module = place_of_target(name)
        if kind in ("stray", "external", "tests"):
            continue
        m = GENEX_LINK_ONLY.match(lib)
        names = [m.group(1)] if m else (
            [t for t in NAME.findall(lib) if t in targets] if "$<" in lib else [lib])
        for dep in names:
            if dep in targets:
                dplace = place_of_target(dep)
                if dplace[0] == "external":
                    continue
                bad = judge(kind, module, dplace)
                if bad is not None:
                    problems.append(f"target {name} links {dep}: {kind_name(kind, module)} -> "
                                    f"{bad} goes up or sideways ({may_text(kind, module)})"
                                    .replace(" may include ", " may link "))
            elif kind == "module" and module in ENGINE and FORBIDDEN_LIBS_IN_ENGINE.search(dep):
                problems.append(f"target {name} links {dep}: the engine ({module}) stays free "
                                "of gRPC, protobuf, Boost, Prometheus and HTTP libraries")
            elif dep.startswith("dcformer_") or dep.startswith("dcf_"):
                problems.append(f"target {name} links {dep}: not a target of this build "
                                "(a misspelt library links as -l<name>)")
    return problems, len(seen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="source tree to check (default: this repository)")
    parser.add_argument("--links", help="the build's link graph (build/layering/"
                        "link_graph.tsv, written when CMake configures)")
    args = parser.parse_args()
    problems, n_sources = check_includes(args.root)
    n_links = 0
    if args.links:
        link_problems, n_links = check_links(args.links)
        problems += link_problems
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} include(s) or link(s) break the layering "
              "(scripts/check_layering.py lists the modules and what each may use)")
        return 1
    print(f"check_layering: {n_sources} sources" +
          (f" and {n_links} links" if args.links else "") + ", every include goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
