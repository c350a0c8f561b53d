#!/usr/bin/env python3
"""The GPU check, run from the bundle that scripts/gpu-check.sh builds (docs/GPU_CHECK.md).

  run.sh OUTDIR          every part below, within TOTAL_BUDGET_S; log + JSON summary in OUTDIR
  run.sh --self-check    only check that the bundle is self-contained (any machine)

Parts and their time caps (seconds; a part past its cap is stopped and marked "timeout"):
  self_check  10+2/bin every binary finds its libraries in the bundle and starts (--help)
  gpu_tests       50  the gpu-label test binaries (GoogleTest XML in OUTDIR/tests/)
  golden          40  dcformer-generate --backend cuda vs the golden outputs and the CPU
                      backend: float32 (also chunked prefill) and bfloat16, every golden case
  memcheck        40  compute-sanitizer --tool memcheck on a short generation (chunked
                      prefill + decode) and on the DCMHA kernel tests
  racecheck       50  compute-sanitizer --tool racecheck on the same, fewer kernel tests
  attention       45  dcformer-attention-bench, the standard table (batch 32, dim 512, 8 heads,
                      128..2048, MHA vs DCMHA, global and window 256)
  attention_decode 20 the DCMHA decode kernels alone at the DCFormer-2.8B shape (N 32,
                      hd 80), 2048 cached keys, batch 1 and 64: KV bytes/s vs peak
  make_model      60  a random DCFormer-2.8B-shape bf16 checkpoint in WORK_DIR (not shipped)
  model_dcmha     90  dcformer-model-bench: decode batch 1 and 64 at context 2048, and 64
                      requests x (512 prompt + 256 new) through the serving engine
  model_mha       50  the same decode runs with compose off (plain multi-head attention)
  model_dcmha_nographs 40  the decode runs of model_dcmha issued call by call
  model_int8      45  the decode runs with --weight-dtype int8 (per-channel scales)
  model_fp8       45  the decode runs with --weight-dtype fp8 (E4M3, per-channel scales)
  model_fp8_act   40  the same with --activation-dtype fp8 (batch 64: cuBLASLt's FP8 GEMM)
Exit status: 0 every part passed, 1 a part failed or timed out, 3 no GPU (only the
self-check ran), 2 bad usage.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "bin")
LIB = os.path.join(HERE, "lib")
FALLBACK = os.path.join(LIB, "fallback")
DATA = os.path.join(HERE, "data")
TOTAL_BUDGET_S = 560
PEAK_GBPS = float(os.environ.get("DCF_PEAK_GBPS", "4800"))  # H200 HBM3e
TOOLS = ["dcformer-generate", "dcformer-make-model", "dcformer-model-bench",
         "dcformer-attention-bench", "dcformer-decode-bench"]
# What the GPU machine provides (deploy/docker/runtime-libs.sh, runtime_provided with CUDA on).
BASE_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|"
                       r"librt\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|"
                       r"libnvidia|libutil\.so|libcudart\.so)")


class Checker:
    def __init__(self, out_dir):
        self.out = out_dir
        self.start = time.monotonic()
        self.log_file = None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            self.log_file = open(os.path.join(out_dir, "gpu-check.log"), "a", buffering=1)
        self.parts = []
        self.summary = {"bundle": self.manifest().get("commit", "unknown"), "parts": self.parts}
        self.env = dict(os.environ)
        self.toolkit_dir = self.find_toolkit_libs()
        paths = [LIB] + ([self.toolkit_dir] if self.toolkit_dir else [])
        self.env["LD_LIBRARY_PATH"] = ":".join(paths)
        self.env["DCF_TEST_DATA_DIR"] = DATA

    # ---- plumbing ---------------------------------------------------------------------
    def log(self, msg):
        line = f"[{time.monotonic() - self.start:6.1f}s] {msg}"
        print(line, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")

    def manifest(self):
        try:
            with open(os.path.join(HERE, "MANIFEST.json")) as f:
                return json.load(f)
        except OSError:
            return {}

    def run(self, cmd, timeout, env=None):
        """Runs cmd with its output into the log. Returns (rc, text); rc None on timeout."""
        self.log("$ " + " ".join(cmd))
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env or self.env, timeout=max(1, timeout))
            rc, text = p.returncode, p.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            rc, text = None, (e.stdout or b"").decode("utf-8", "replace") + "\n[timed out]"
        except OSError as e:
            rc, text = 127, str(e)
        if self.log_file:
            self.log_file.write(text if text.endswith("\n") else text + "\n")
        return rc, text

    def left(self):
        return TOTAL_BUDGET_S - (time.monotonic() - self.start)

    def part(self, name, cap, fn):
        budget = min(cap, self.left())
        entry = {"part": name, "cap_s": cap}
        if budget < 3:
            entry.update(status="skip", detail="no time left in the 10-minute budget")
            self.parts.append(entry)
            self.log(f"== {name}: skipped (no time left)")
            return entry
        self.log(f"== {name} (cap {budget:.0f} s)")
        t0 = time.monotonic()
        deadline = t0 + budget
        try:
            status, detail = fn(deadline)
        except Exception as e:  # a bug in this script must not hide the other parts
            status, detail = "fail", f"check script error: {e!r}"
        entry.update(status=status, seconds=round(time.monotonic() - t0, 1), detail=detail)
        self.parts.append(entry)
        self.log(f"== {name}: {status} in {entry['seconds']} s")
        self.write_summary()
        return entry

    def write_summary(self):
        if self.out:
            with open(os.path.join(self.out, "gpu-check.json"), "w") as f:
                json.dump(self.summary, f, indent=1)

    # ---- libraries ----------------------------------------------------------------------
    def find_toolkit_libs(self):
        """The directory holding the CUDA toolkit libraries the bundle needs (cuBLAS)."""
        need = self.manifest().get("needs_from_cuda_toolkit", [])
        if not need:
            return None
        cands = []
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                cands.append(os.path.join(os.environ[var], "lib64"))
        nvcc = shutil.which("nvcc")
        if nvcc:
            cands.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "lib64"))
        cands += ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                  "/usr/lib/x86_64-linux-gnu"]
        try:
            out = subprocess.run(["ldconfig", "-p"], stdout=subprocess.PIPE, text=True).stdout
            for line in out.splitlines():
                if need[0] in line and "=>" in line:
                    cands.append(os.path.dirname(line.split("=>")[1].strip()))
        except OSError:
            pass
        for d in cands:
            if all(os.path.exists(os.path.join(d, n)) for n in need):
                return d
        return None

    def self_check(self, deadline):
        problems, notes = [], []
        need = self.manifest().get("needs_from_cuda_toolkit", [])
        if need and not self.toolkit_dir:
            notes.append(f"{', '.join(need)} not found on this machine (the GPU machine's CUDA "
                         "toolkit provides it): binaries needing it are checked with ldd only")
        env = {"PATH": "/usr/bin:/bin",
               "LD_LIBRARY_PATH": self.toolkit_dir or "",
               "DCF_TEST_DATA_DIR": DATA}
        fallback_used = False
        for exe in sorted(os.listdir(BIN)):
            path = os.path.join(BIN, exe)
            out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=env).stdout
            missing_toolkit = False
            for line in out.splitlines():
                m = re.match(r"\s*(\S+) => (.*)", line)
                if not m:
                    continue
                name, where = m.group(1), m.group(2)
                if "not found" in where:
                    if name in need and not self.toolkit_dir:
                        missing_toolkit = True
                        continue
                    problems.append(f"{exe}: {name} not found")
                    continue
                real = os.path.realpath(where.split(" (")[0].strip())
                if real.startswith(os.path.realpath(LIB) + "/") or BASE_LIBS.match(name):
                    continue
                if name in need and self.toolkit_dir and \
                        real.startswith(os.path.realpath(self.toolkit_dir)):
                    continue
                problems.append(f"{exe}: {name} resolves outside the bundle ({real})")
            if missing_toolkit:
                continue
            args = ["--gtest_list_tests"] if not exe.startswith("dcformer-") else ["--help"]
            rc, text = self.run_quiet([path] + args, env)
            if "version `" in text and "not found" in text:  # too old libstdc++ / libgcc_s
                env_fb = dict(env, LD_LIBRARY_PATH=":".join(x for x in (FALLBACK, env["LD_LIBRARY_PATH"]) if x))
                rc, text = self.run_quiet([path] + args, env_fb)
                fallback_used = True
            if rc not in (0, 1) or "error while loading shared libraries" in text:
                problems.append(f"{exe} {' '.join(args)}: exit {rc}: {text.strip()[-300:]}")
        if fallback_used:
            notes.append("the machine's libstdc++/libgcc_s are too old: using lib/fallback")
            self.env["LD_LIBRARY_PATH"] = FALLBACK + ":" + self.env["LD_LIBRARY_PATH"]
        for n in notes:
            self.log("note: " + n)
        for p in problems:
            self.log("problem: " + p)
        detail = {"binaries": len(os.listdir(BIN)), "problems": problems, "notes": notes}
        return ("pass" if not problems else "fail"), detail

    @staticmethod
    def run_quiet(cmd, env):
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               timeout=20)
            return p.returncode, p.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None, "timed out"

    # ---- the GPU ------------------------------------------------------------------------
    def detect_gpu(self):
        smi = shutil.which("nvidia-smi")
        if smi:
            rc, text = self.run([smi, "-L"], 20)
            gpus = [l for l in text.splitlines() if l.startswith("GPU ")]
            if rc == 0 and gpus:
                return gpus[0]
        rc, text = self.run([os.path.join(BIN, "dcformer-attention-bench"), "--backend", "cuda",
                             "--batch", "1", "--dim", "64", "--n-head", "1", "--seq-lens", "4",
                             "--windows", "0", "--variants", "mha", "--warmup", "0",
                             "--iters", "1"], 60)
        m = re.search(r"on (.+?), ", text)
        if rc == 0 and m:
            return m.group(1)
        return None

    def gpu_tests(self, deadline):
        tests_dir = os.path.join(self.out, "tests")
        os.makedirs(tests_dir, exist_ok=True)
        totals = {"tests": 0, "failures": 0, "skipped": 0, "binaries": {}}
        status = "pass"
        for exe in sorted(os.listdir(BIN)):
            if exe.startswith("dcformer-"):
                continue
            xml = os.path.join(tests_dir, exe + ".xml")
            rc, _ = self.run([os.path.join(BIN, exe), f"--gtest_output=xml:{xml}"],
                             deadline - time.monotonic())
            counts = {"rc": rc}
            try:
                root = ET.parse(xml).getroot()
                for k in ("tests", "failures", "errors"):
                    counts[k] = int(root.get(k, "0"))
                counts["skipped"] = sum(1 for tc in root.iter("testcase")
                                        if tc.get("result") == "skipped" or
                                        tc.find("skipped") is not None)
            except (OSError, ET.ParseError):
                counts["error"] = "no XML report"
            totals["binaries"][exe] = counts
            for k in ("tests", "failures", "skipped"):
                totals[k] += counts.get(k, 0)
            if rc is None:
                return "timeout", totals
            if rc != 0 or counts.get("failures", 0) or "error" in counts:
                status = "fail"
        if totals["tests"] == 0 or totals["skipped"] == totals["tests"]:
            status = "fail"  # nothing ran: the tests skip when CUDA sees no device
        return status, totals

    def generate(self, case, backend, dtype, chunk, deadline, new_tokens=None):
        with open(os.path.join(DATA, "golden", case, "golden.json")) as f:
            g = json.load(f)
        n = new_tokens or len(g["greedy"])
        cmd = [os.path.join(BIN, "dcformer-generate"), "--backend", backend, "--dtype", dtype,
               "--model", os.path.join(DATA, "golden", case), "--prompt-ids",
               ",".join(str(t) for t in g["prompt"]), "--max-new-tokens", str(n),
               "--prefill-chunk", str(chunk), "--ignore-eos", "--json"]
        rc, text = self.run(cmd, deadline - time.monotonic())
        if rc != 0:
            return g, None, f"exit {rc}: {text.strip()[-300:]}"
        for line in reversed(text.strip().splitlines()):
            if line.startswith("{"):
                return g, json.loads(line), None
        return g, None, "no JSON output"

    def golden(self, deadline):
        cases = sorted(d for d in os.listdir(os.path.join(DATA, "golden"))
                       if os.path.isdir(os.path.join(DATA, "golden", d)))
        results, status = [], "pass"
        for case in cases:
            g, cpu, err = self.generate(case, "cpu", "float32", 512, deadline)
            if err:
                results.append({"case": case, "backend": "cpu", "error": err})
                status = "fail"
                continue
            for dtype, chunk in (("float32", 512), ("float32", 3), ("bfloat16", 512)):
                _, r, err = self.generate(case, "cuda", dtype, chunk, deadline)
                entry = {"case": case, "dtype": dtype, "prefill_chunk": chunk}
                if err:
                    entry["error"] = err
                    status = "fail"
                    results.append(entry)
                    continue
                same = 0
                for a, b in zip(r["tokens"], g["greedy"]):
                    if a != b:
                        break
                    same += 1
                entry["tokens_matching_golden"] = f"{same}/{len(g['greedy'])}"
                k = min(same, len(r["logprobs"]), len(cpu["logprobs"]))
                entry["max_logprob_diff_vs_cpu"] = max(
                    [abs(a - b) for a, b in zip(r["logprobs"][:k], cpu["logprobs"][:k])] or [0.0])
                entry["max_logprob_diff_vs_golden"] = max(
                    [abs(a - b) for a, b in zip(r["logprobs"][:k], g["greedy_logprobs"][:k])] or [0.0])
                if dtype == "float32" and (same != len(g["greedy"]) or
                                           entry["max_logprob_diff_vs_golden"] >= 1e-3):
                    status = "fail"
                results.append(entry)
                self.log(f"golden {case} {dtype} chunk {chunk}: {entry}")
        return status, results

    def sanitizer(self, tool, deadline):
        cs = shutil.which("compute-sanitizer")
        for d in ([self.toolkit_dir] if self.toolkit_dir else []) + ["/usr/local/cuda/lib64"]:
            for rel in ("bin/compute-sanitizer", "compute-sanitizer/compute-sanitizer"):
                cand = os.path.join(os.path.dirname(d), rel)
                if not cs and os.path.exists(cand):
                    cs = cand
        if not cs:
            return "fail", "compute-sanitizer not found"
        case = "dcformer-f32-long-prompt"
        with open(os.path.join(DATA, "golden", case, "golden.json")) as f:
            prompt = ",".join(str(t) for t in json.load(f)["prompt"])
        runs = [[os.path.join(BIN, "dcformer-generate"), "--backend", "cuda", "--model",
                 os.path.join(DATA, "golden", case), "--prompt-ids", prompt,
                 "--max-new-tokens", "4", "--prefill-chunk", "8", "--ignore-eos", "--json"]]
        kernels = os.path.join(BIN, "dcmha_kernels_test_gpu")
        if os.path.exists(kernels):  # decode splits + reduce, prefill groups, mixed, 2.8B shape
            filt = ("*Decode*:*Prefill*:*KvWrite*:*28B*" if tool == "memcheck" else
                    "DcmhaPrefill.MixedDecodeAndChunks:DcmhaShapes.DcFormer28BShape:"
                    "*ctx300_B16_global_dcmha*")
            runs.append([kernels, "--gtest_filter=" + filt])
        detail, status = [], "pass"
        for i, cmd in enumerate(runs):
            rc, text = self.run([cs, "--tool", tool, "--error-exitcode", "9"] + cmd,
                                deadline - time.monotonic())
            m = re.search(r"SUMMARY: .*?(\d+) error", text)
            detail.append({"command": os.path.basename(cmd[0]), "rc": rc,
                           "errors": int(m.group(1)) if m else None})
            if rc is None:
                return "timeout", detail
            if rc != 0:
                status = "fail"
        return status, detail

    def attention(self, deadline):
        out = os.path.join(self.out, "attention_prefill.json")
        rc, _ = self.run([os.path.join(BIN, "dcformer-attention-bench"), "--backend", "cuda",
                          "--json-out", out], deadline - time.monotonic())
        if rc is None:
            return "timeout", None
        return ("pass" if rc == 0 else "fail"), {"json": os.path.basename(out)}

    def attention_decode(self, deadline):
        detail, status = {}, "pass"
        for batch in (1, 64):
            out = os.path.join(self.out, f"attention_decode_b{batch}.json")
            rc, _ = self.run([os.path.join(BIN, "dcformer-attention-bench"), "--backend", "cuda",
                              "--mode", "decode", "--batch", str(batch), "--dim", "2560",
                              "--n-head", "32", "--seq-lens", "2048", "--windows", "0,256",
                              "--variants", "mha,dcmha", "--json-out", out],
                             deadline - time.monotonic())
            if rc is None:
                return "timeout", detail
            if rc != 0:
                status = "fail"
                continue
            with open(out) as f:
                rows = json.load(f)["rows"]
            for r in rows:
                key = f"b{batch}_{r['variant']}_{'w' + str(r['window']) if r['window'] else 'global'}"
                detail[key] = {"ms": r["ms_per_forward"], "kv_gb_per_s": r["kv_gb_per_s"],
                               "share_of_peak": r["kv_gb_per_s"] / PEAK_GBPS}
            ms = {(r["variant"], r["window"]): r["ms_per_forward"] for r in rows}
            for w in (0, 256):
                if ("mha", w) in ms and ("dcmha", w) in ms and ms[("mha", w)] > 0:
                    detail[f"b{batch}_dcmha_over_mha_{'w' + str(w) if w else 'global'}"] = \
                        ms[("dcmha", w)] / ms[("mha", w)]
        return status, detail

    def make_model(self, deadline):
        rc, text = self.run([os.path.join(BIN, "dcformer-make-model"), "--out", self.model_dir,
                             "--dim", "2560", "--n-layer", "32", "--n-head", "32", "--ffn", "6912",
                             "--vocab", "50257", "--context", "4096", "--window", "256",
                             "--dtype", "BF16", "--seed", "1", "--init", "fast"],
                            deadline - time.monotonic())
        if rc is None:
            return "timeout", None
        return ("pass" if rc == 0 else "fail"), {"dir": self.model_dir}

    def model_bench(self, compose, deadline, graphs=True, quant=None):
        """quant: None (bf16 weights), "int8", "fp8" or "fp8_act" (fp8 weights and
        activations): the decode runs only, with those weights (docs/QUANTIZATION.md "GPU")."""
        name = (("model_dcmha" if compose else "model_mha") + ("" if graphs else "_nographs")
                if quant is None else "model_" + quant)
        out = os.path.join(self.out, name + ".json")
        cmd = [os.path.join(BIN, "dcformer-model-bench"), "--model", self.model_dir, "--backend",
               "cuda", "--dtype", "bfloat16", "--decode-batches", "1,64", "--context", "2048",
               "--decode-steps", "32", "--peak-gbps", str(PEAK_GBPS), "--json-out", out]
        if quant is not None:
            cmd += ["--weight-dtype", "int8" if quant == "int8" else "fp8"]
            if quant == "fp8_act":
                cmd += ["--activation-dtype", "fp8"]
        elif not compose:
            cmd += ["--nocompose"]
        elif graphs:
            cmd += ["--serve-requests", "64", "--serve-prompt", "512", "--serve-new", "256"]
        # Decode steps as CUDA graphs are the default; DCF_CUDA_GRAPHS=0 issues them call by
        # call (docs/CUDA_BACKEND.md, "Decode steps as graphs").
        env = dict(self.env) if graphs else dict(self.env, DCF_CUDA_GRAPHS="0")
        # The backend logs which cuBLASLt candidate Prepare kept per product and m bucket,
        # with every candidate's time (docs/CUDA_BACKEND.md, GEMMs above 16 rows).
        env["DCF_GEMM_PLAN_LOG"] = "1"
        rc, text = self.run(cmd, deadline - time.monotonic(), env)
        if rc is None:
            return "timeout", None
        if rc != 0:
            return "fail", None
        with open(out) as f:
            detail = json.load(f)
        plans = []
        for line in text.splitlines():
            at = line.find("gemm plan ")
            if at >= 0 and line[at:] not in plans:
                plans.append(line[at:])
        detail["gemm_plans"] = plans
        return "pass", detail

    # ---- the whole check ----------------------------------------------------------------
    def targets(self):
        """The GPU speed targets from the benchmark parts: decode share of the HBM roofline,
        DCMHA over MHA step time, serving throughput (reported, not pass/fail)."""
        by = {p["part"]: p for p in self.parts}
        t = {}
        dc = (by.get("model_dcmha") or {}).get("detail") or {}
        mh = (by.get("model_mha") or {}).get("detail") or {}
        ng = (by.get("model_dcmha_nographs") or {}).get("detail") or {}
        dec = {d["batch"]: d for d in dc.get("decode", [])}
        dec_mha = {d["batch"]: d for d in mh.get("decode", [])}
        if 1 in dec:
            t["decode_b1_tokens_per_s"] = dec[1]["tokens_per_s"]
            t["decode_b1_share_of_roofline"] = dec[1]["share_of_roofline"]
            t["decode_b1_target_met (>= 0.75)"] = dec[1]["share_of_roofline"] >= 0.75
        for b in (1, 64):
            if b in dec and b in dec_mha:
                ratio = dec[b]["ms_per_step"] / dec_mha[b]["ms_per_step"]
                t[f"dcmha_over_mha_step_b{b}"] = ratio
                t[f"dcmha_over_mha_b{b}_target_met (<= 1.15)"] = ratio <= 1.15
        dec_ng = {d["batch"]: d for d in ng.get("decode", [])}
        for b in (1, 64):
            if b in dec and b in dec_ng:  # reported, not pass/fail
                t[f"graphs_speedup_decode_b{b}"] = dec_ng[b]["ms_per_step"] / dec[b]["ms_per_step"]
        if "serve" in dc:
            t["serve_64x(512+256)_tokens_per_s"] = dc["serve"]["tokens_per_s"]
            t["serve_share_of_peak_bandwidth"] = dc["serve"]["share_of_peak_bandwidth"]
        # Quantized weights (reported): a batch-1 step reads about half of bf16's weight bytes,
        # so at the same share of the roofline it runs about 2x bf16's tokens/s.
        for quant in ("int8", "fp8", "fp8_act"):
            q = (by.get("model_" + quant) or {}).get("detail") or {}
            dec_q = {d["batch"]: d for d in q.get("decode", [])}
            for b in (1, 64):
                if b not in dec_q:
                    continue
                t[f"{quant}_decode_b{b}_tokens_per_s"] = dec_q[b]["tokens_per_s"]
                t[f"{quant}_decode_b{b}_share_of_roofline"] = dec_q[b]["share_of_roofline"]
                if b in dec:
                    t[f"{quant}_over_bf16_decode_b{b}"] = (dec[b]["ms_per_step"] /
                                                           dec_q[b]["ms_per_step"])
        return t

    def main(self, work_dir):
        self.summary["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.part("self_check", 10 + 2 * len(os.listdir(BIN)), self.self_check)
        gpu = self.detect_gpu()
        self.summary["gpu"] = gpu
        if not gpu:
            self.log("no GPU: no NVIDIA device is visible here (nvidia-smi and a CUDA probe "
                     "found none); the GPU parts did not run")
            self.summary["status"] = "no_gpu"
            self.write_summary()
            return 3
        self.log("GPU: " + gpu)
        self.model_dir = os.path.join(work_dir, "dcformer-2.8b-random")
        self.part("gpu_tests", 50, self.gpu_tests)
        self.part("golden", 40, self.golden)
        self.part("memcheck", 40, lambda d: self.sanitizer("memcheck", d))
        self.part("racecheck", 50, lambda d: self.sanitizer("racecheck", d))
        self.part("attention", 45, self.attention)
        self.part("attention_decode", 20, self.attention_decode)
        made = self.part("make_model", 60, self.make_model)
        if made["status"] == "pass":
            self.part("model_dcmha", 90, lambda d: self.model_bench(True, d))
            self.part("model_mha", 50, lambda d: self.model_bench(False, d))
            self.part("model_dcmha_nographs", 40, lambda d: self.model_bench(True, d, False))
            self.part("model_int8", 45, lambda d: self.model_bench(True, d, quant="int8"))
            self.part("model_fp8", 45, lambda d: self.model_bench(True, d, quant="fp8"))
            self.part("model_fp8_act", 40, lambda d: self.model_bench(True, d, quant="fp8_act"))
        shutil.rmtree(self.model_dir, ignore_errors=True)
        self.summary["targets"] = self.targets()
        self.summary["seconds"] = round(time.monotonic() - self.start, 1)
        failed = [p["part"] for p in self.parts if p["status"] != "pass"]
        self.summary["status"] = "pass" if not failed else "fail: " + ", ".join(failed)
        self.write_summary()
        self.log(f"summary: {self.summary['status']} in {self.summary['seconds']} s; "
                 f"targets {json.dumps(self.summary['targets'])}")
        return 0 if not failed else 1


def main(argv):
    if len(argv) >= 2 and argv[1] == "--self-check":
        c = Checker(argv[2] if len(argv) > 2 else None)
        entry = c.part("self_check", 60, c.self_check)
        return 0 if entry["status"] == "pass" else 1
    if len(argv) != 2 or argv[1].startswith("-"):
        print(__doc__)
        return 2
    out = os.path.abspath(argv[1])
    work = os.environ.get("DCF_GPU_CHECK_WORK_DIR") or tempfile.mkdtemp(prefix="dcformer-gpu-check-")
    return Checker(out).main(work)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
