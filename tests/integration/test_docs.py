"""The commands that README.md, docs/API.md and bench/README.md show, run as documented
against a real dcformer-server on the default model (models/dcformer-kjv) and the real
tools (issue 24: documented examples used GPT-2 token ids that the default model rejects).

Every command of every ```sh block (and the Python block of docs/API.md) is found by
parsing the documents, not listed here, so editing an example changes what runs:
- RUN: run as written, after the substitutions below, from the repository root; it must
  exit 0. A `$ command` session must print exactly the lines that follow it (stdout, then
  stderr); a `# prints X` comment means stdout must be X.
- CHECK_ARGS (a GPU, a remote server, an hour of CPU): the program checks the command's
  flags (`--only_check_args`, exit 0), so a misspelt flag still fails.
- SKIP: not a command of this project's binaries, with the reason.
Every RULES entry must match some command (no stale exceptions).

Substitutions, so that the commands run on loopback, in CI time and without leaving files in
the repository: build/bin/ is the build's bin directory; 127.0.0.1:50051 / :9090 are the test
server's ports (clients without --target get it); placeholders (DIR, /tmp/m, /models/m, the
key and certificate files) become real ones; a bracketed option is dropped (a bracketed
boolean flag is also run once with it); the 200M-parameter model of "Offline tools" is
written at a small shape with the same flags, and the benchmarks' 261M-parameter model
(/tmp/m261, bench/README.md) is one of that small shape written here; loadgen runs at most
16 measured and 2 warm-up requests per run; matmul-bench times each case for 0.02 s; report
files go to a temporary directory. A command that takes more than 5 s is printed with its
time.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness as h
import test_security

DOCS = ["README.md", "docs/API.md", "bench/README.md"]
DEFAULT_MODEL = os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
NODE_MODULES = os.path.join(h.SOURCE_DIR, "client", "examples", "node", "node_modules")

RUN, CHECK_ARGS, SKIP = "run", "check-args", "skip"
RULES = [  # (pattern searched in the command, action, reason)
    (r"^bash scripts/(run|test)\.sh", SKIP,
     "the quick start: installs packages and builds; CI runs scripts/test.sh itself"),
    (r"dcformer-make-model --out /tmp/m28", CHECK_ARGS,
     "a 2.8B-parameter model (5.6 GB) for the GPU benchmark"),
    (r"dcformer-model-bench .*--backend cuda", CHECK_ARGS, "needs a GPU"),
    (r"--target llm\.example\.com", CHECK_ARGS, "a remote server with TLS and an API key"),
    (r"dcformer-matmul-bench --rows 2,4,8,16,32,128", CHECK_ARGS,
     "a benchmark: every product of the 261M shape at 6 row counts and 2 dtypes, at least "
     "0.2 s each, minutes under ASan"),
    (r"dcformer-matmul-bench --rows 4,8,29,128 ", CHECK_ARGS,
     "a benchmark: every product of the 261M shape at 4 row counts and 2 dtypes, at least "
     "0.2 s each (28 s)"),
    (r"dcformer-matmul-bench --rows 1,2,3,4,5,8,9,12,16,32,128", CHECK_ARGS,
     "a benchmark: every product of the 261M shape at 11 row counts and 5 dtypes, at least "
     "0.2 s each, minutes"),
    (r"dcformer-cpu-attention-bench", CHECK_ARGS,
     "sweeps sequence lengths up to 2048: minutes to an hour on 2 cores"),
    (r"dcformer-loadgen --protocol openai --http-target 127\.0\.0\.1:8000", CHECK_ARGS,
     "a server started with --http-port 8000 (integration.test_loadgen runs the protocol)"),
    (r"dcformer-loadgen .*(--shared-prefix-tokens 1024|--chat-turns 8)", CHECK_ARGS,
     "prompts past the default model's 256-token context (the 261M model's workload; "
     "integration.test_loadgen runs both workloads at a small shape)"),
    (r"(--out |--model_dir=)/tmp/m261c4k", CHECK_ARGS,
     "the 261M model with a 4096-token context (0.5 GB) and a 2048-token prefill of it: "
     "minutes on 2 cores"),
    (r"torch_generate_bench\.py|bench/compare\.sh", SKIP,
     "the PyTorch baseline (python3-torch, minutes on a 261M-parameter model); tests/baseline "
     "checks the baseline itself"),
]


def code_blocks(path):
    """(language, [(line number, text)]) of every fenced code block of `path`."""
    blocks, current, lang = [], None, None
    with open(os.path.join(h.SOURCE_DIR, path)) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            fence = re.match(r"^\s*```(\w*)", line)
            if fence and current is None:
                current, lang = [], fence.group(1)
            elif fence:
                blocks.append((lang, current))
                current = None
            elif current is not None:
                current.append((number, line))
    return blocks


def split_comment(line):
    """(command, comment) of a shell line: a `#` after a blank, outside quotes."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


class Command:
    def __init__(self, where, text, comment, expected=None):
        self.where, self.text, self.comment, self.expected = where, text, comment, expected

    def __repr__(self):
        return f"{self.where}: {self.text}"


def shell_commands(path, lines):
    """The commands of one sh block: continuation lines joined, comments split off, `$`
    sessions with the output lines that follow them."""
    out, pending, start = [], "", None
    i = 0
    while i < len(lines):
        number, line = lines[i]
        i += 1
        if line.startswith("$ "):
            expected = []
            while i < len(lines) and not lines[i][1].startswith("$ "):
                expected.append(lines[i][1])
                i += 1
            text, comment = split_comment(line[2:])
            out.append(Command(f"{path}:{number}", text, comment, expected))
            continue
        if start is None:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, comment = split_comment(pending + line)
        pending, where, start = "", f"{path}:{start}", None
        if text.strip():
            out.append(Command(where, " ".join(text.split()), comment))
    return out


def documented_commands():
    commands = []
    for path in DOCS:
        for lang, lines in code_blocks(path):
            if lang == "sh":
                commands.extend(shell_commands(path, lines))
            elif lang == "python":
                commands.append(Command(f"{path}:{lines[0][0]}", "\n".join(l for _, l in lines),
                                        "", None))
    return commands


def documented_prompts():
    """The prompts-file lines bench/README.md shows (`{"text": ...}`, `{"token_ids": ...}`)."""
    with open(os.path.join(h.SOURCE_DIR, "bench", "README.md")) as f:
        text = f.read()
    prompts = []
    for snippet in re.findall(r"`(\{[^`]*\})`", text):
        try:
            obj = json.loads(snippet)
        except ValueError:
            continue
        if "text" in obj or "token_ids" in obj:
            prompts.append(obj)
    return prompts


def action_of(command):
    for pattern, action, reason in RULES:
        if re.search(pattern, command.text):
            return action, reason, pattern
    return RUN, "", None


def expand_options(text):
    """The command without its bracketed options, plus one variant per bracketed boolean
    flag (`[--json]`) with it."""
    base = " ".join(re.sub(r"\[[^\]]*\]", " ", text).split())
    variants = [base]
    for option in re.findall(r"\[(--[\w-]+)\]", text):
        variants.append(f"{base} {option}")
    return variants


class DocsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="docs-test-")
        test_security.make_pki(cls.tmp)
        with open(cls.path("keys"), "w") as f:
            f.write("docs-test-key\n")
        with open(cls.path("prompts.jsonl"), "w") as f:
            for p in documented_prompts():
                f.write(json.dumps(p) + "\n")
        # /tmp/m261 of the benchmarks' commands (bench/README.md makes it at dim 1024, 12
        # layers, F16): the same kind of model at the small shape, with room for their
        # 128-token prompts and 48 new tokens.
        subprocess.run([os.path.join(h.BIN_DIR, "dcformer-make-model"), "--out",
                        cls.path("m261"), "--context", "512", "--window", "256"],
                       check=True, capture_output=True, timeout=120)
        # The default cache (a fraction of memory), as `build/bin/dcformer-server` has it, on
        # the CPU backend, whose output README.md shows.
        cls.server = h.Server(model=DEFAULT_MODEL,
                              args=["--kv-cache-bytes=0", "--backend=cpu"]).__enter__()
        cls.ran = []

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp, name)

    def substitute(self, text, server_ports=None):
        """The command as it runs here (see the module docstring)."""
        target = self.server.target
        metrics = f"127.0.0.1:{self.server.metrics_port}"
        s = text
        s = re.sub(r"(^|[\s|(])build/bin/", lambda m: m.group(1) + h.BIN_DIR + "/", s)
        s = re.sub(r"^dcformer-cli ", h.CLI + " ", s)
        s = s.replace("PYTHONPATH=build/python", f"PYTHONPATH={h.PY_DIR}")
        s = re.sub(r"\s*&$", "", s)
        if server_ports is None:
            s = s.replace("127.0.0.1:50051", target).replace("127.0.0.1:9090", metrics)
        s = s.replace("--model DIR", f"--model {DEFAULT_MODEL}")
        s = s.replace("--model /models/m", f"--model {DEFAULT_MODEL}")
        s = s.replace("--host 0.0.0.0", "--host 127.0.0.1")
        s = s.replace("/etc/dcformer/keys", self.path("keys"))
        s = re.sub(r"(--tls-(?:cert|key)) (server\.(?:pem|key))",
                   lambda m: f"{m.group(1)} {self.path(m.group(2))}", s)
        s = s.replace("--out /tmp/m ", f"--out {self.path('m')} ").replace(
            "--model /tmp/m ", f"--model {self.path('m')} ")
        s = re.sub(r"/tmp/m261(?!\w)", self.path("m261"), s)
        s = s.replace("--dim 1024 --n-layer 12 --n-head 16 --ffn 2816",
                      "--dim 64 --n-layer 2 --n-head 4 --ffn 128")
        s = re.sub(r"--num-requests (\d+)",
                   lambda m: f"--num-requests {min(int(m.group(1)), 16)}", s)
        if "dcformer-matmul-bench" in s and "--min-seconds" not in s:
            s += " --min-seconds 0.02"  # each case timed once, not for 0.3 s
        if "dcformer-loadgen" in s and not re.search(r"--num-requests|--duration", s):
            s += " --num-requests 16"  # the default is 100
        s = re.sub(r"--warmup-requests (\d+)",
                   lambda m: f"--warmup-requests {min(int(m.group(1)), 2)}", s)
        s = re.sub(r"(--(?:json|plot)-out) (\S+)",
                   lambda m: f"{m.group(1)} {self.path(os.path.basename(m.group(2)))}", s)
        s = s.replace("--prompts-file prompts.jsonl",
                      f"--prompts-file {self.path('prompts.jsonl')}")
        if server_ports is not None:
            port, metrics_port = server_ports
            s += f" --port={port} --metrics-port={metrics_port}"
        elif "|" not in s and "--target" not in s and re.search(
                r"dcformer-cli|dcformer-loadgen|generate\.py|generate\.js", s):
            s += f" --target={target}"
        return s

    def run_shell(self, command, timeout=300):
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        return subprocess.run(["bash", "-c", command], cwd=h.SOURCE_DIR, capture_output=True,
                              text=True, timeout=timeout, env=env)

    def check_run(self, doc, text):
        if "generate.js" in text and not os.path.isdir(os.path.join(NODE_MODULES, "@grpc")):
            self.skipTest("client/examples/node/node_modules missing: run scripts/setup.sh")
        if re.search(r"(^|/)dcformer-server(\s|$)", text.split("|")[0]):
            return self.check_server(doc, text)
        p = self.run_shell(self.substitute(text))
        self.assertEqual(p.returncode, 0, f"{doc}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        if doc.expected is not None:
            self.assertEqual(p.stdout.splitlines() + p.stderr.splitlines(), doc.expected,
                             f"{doc}: the output differs from the documented one")
        printed = re.match(r"prints (.+)$", doc.comment)
        if printed:
            self.assertEqual(p.stdout.strip(), printed.group(1), doc)
        if re.match(r"SERVING", doc.comment):
            self.assertEqual(p.stdout.strip(), "SERVING", doc)
        return p

    def check_server(self, doc, text):
        """A documented server command: it must serve (health SERVING) and stop cleanly on
        SIGTERM; `--help` must list the flags."""
        if "--help" in text:
            p = self.run_shell(self.substitute(text))
            self.assertEqual(p.returncode, 0, f"{doc}\n{p.stderr}")
            self.assertIn("--kv-cache-bytes (default 0)", p.stdout, doc)
            return p
        port, metrics_port = h.free_ports(2)
        command = self.substitute(text, server_ports=(port, metrics_port))
        log = tempfile.TemporaryFile(mode="w+")
        self.addCleanup(log.close)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        proc = subprocess.Popen(shlex.split(command), cwd=h.SOURCE_DIR, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            if "--tls-cert" in command:
                with open(self.path("ca.pem"), "rb") as f:
                    channel = h.grpc.secure_channel(f"localhost:{port}",
                                                    h.grpc.ssl_channel_credentials(f.read()))
            else:
                channel = h.grpc.insecure_channel(f"127.0.0.1:{port}")
            with channel:
                watch = h.health_pb2_grpc.HealthStub(channel).Watch(
                    h.health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=120)
                serving = False
                for msg in watch:
                    if msg.status == h.SERVING:
                        serving = True
                        watch.cancel()
                        break
            self.assertTrue(serving, doc)
            self.assertIsNone(proc.poll(), doc)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.seek(0)
            output = log.read()
        self.assertEqual(code, 0, f"{doc}\n{output[-3000:]}")
        self.assertNotIn(" ERROR ", output, doc)

    def check_args(self, doc, text):
        # After the program (past any VAR=value words before it).
        program_end = re.match(r"(?:\w+=\S*\s+)*\S+", self.substitute(text)).end()
        command = self.substitute(text)
        command = command[:program_end] + " --only_check_args" + command[program_end:]
        p = self.run_shell(command, timeout=60)
        self.assertEqual(p.returncode, 0, f"{doc}: its flags do not parse\n{p.stderr}")

    def test_every_documented_command(self):
        commands = documented_commands()
        self.assertGreater(len(commands), 30)  # the parser found the documents' blocks
        used_rules = set()
        counts = {RUN: 0, CHECK_ARGS: 0, SKIP: 0}
        for doc in commands:
            if "\n" in doc.text:  # the Python block
                with self.subTest(command=doc.where):
                    script = self.path("snippet.py")
                    with open(script, "w") as f:
                        f.write(doc.text.replace("127.0.0.1:50051", self.server.target))
                    p = self.run_shell(f"PYTHONPATH={h.PY_DIR} /usr/bin/python3 {script}")
                    self.assertEqual(p.returncode, 0, f"{doc}\n{p.stderr}")
                    self.assertTrue(p.stdout.strip(), doc)
                counts[RUN] += 1
                continue
            action, reason, rule = action_of(doc)
            used_rules.add(rule)
            counts[action] += 1
            with self.subTest(command=repr(doc)):
                if action == SKIP:
                    continue
                for variant in expand_options(doc.text):
                    started = time.monotonic()
                    if action == CHECK_ARGS:
                        self.check_args(doc, variant)
                    else:
                        self.check_run(doc, variant)
                    seconds = time.monotonic() - started
                    if seconds > 5:  # what CI's time limit goes to (a slow run is named)
                        print(f"{seconds:6.1f} s  {doc.where}: {variant[:100]}", flush=True)
        print(f"documented commands: {counts[RUN]} run, {counts[CHECK_ARGS]} flags checked, "
              f"{counts[SKIP]} skipped")
        stale = [r[0] for r in RULES if r[0] not in used_rules]
        self.assertEqual(stale, [], "RULES entries that match no documented command")

    def test_documented_prompts_are_the_default_models(self):
        # The prompts file of bench/README.md: every line valid for the default model, so the
        # documented loadgen run has no failed request (it would exit 3).
        prompts = documented_prompts()
        self.assertGreaterEqual(len(prompts), 2)
        with self.server.channel() as ch:
            info = h.pb_grpc.TextGenerationStub(ch).GetModelInfo(h.pb.GetModelInfoRequest(),
                                                                 timeout=30)
        for p in prompts:
            for token in p.get("token_ids", []):
                self.assertLess(token, info.vocab_size, p)


if __name__ == "__main__":
    unittest.main(verbosity=2)
