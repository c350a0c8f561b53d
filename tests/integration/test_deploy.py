"""The container images' build steps and the server flags the Kubernetes manifests pass.

No container engine exists on CI machines, so the Dockerfiles keep their steps in scripts
(deploy/docker/) and this runs them here:
- build.sh on the already-built tree (--reuse-build: it builds the two targets, a no-op when
  up to date, then lays out the image's /opt/dcformer in a temporary prefix: binaries, every
  library they load that a bare base image lacks, the model; with --cuda, as for the CUDA
  image, when the tree links the CUDA libraries); runtime-setup.sh, the runtime
  stage's step, checks that prefix; the server is then started from it with only its bundled
  libraries (LD_LIBRARY_PATH) and the HEALTHCHECK command run against it;
- build.sh's configure step for the CUDA image (DCFORMER_CUDA=ON) with the toolkit in
  /usr/local/cuda. What is not checked here: the base images themselves and apt inside them.
The Kubernetes objects are checked by test_kubernetes.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

import harness as h

DEPLOY = os.path.join(h.SOURCE_DIR, "deploy")
DOCKER = os.path.join(DEPLOY, "docker")
K8S = os.path.join(DEPLOY, "kubernetes")
BUILD_DIR = os.path.dirname(h.BIN_DIR)
NVCC = "/usr/local/cuda/bin/nvcc"
PLUGIN = "libdcformer_cuda_plugin.so"


def read(path):
    with open(path) as f:
        return f.read()


def content_lines(path):
    """The lines of a file that are neither blank nor # comments, stripped."""
    return [line.strip() for line in read(path).splitlines()
            if line.strip() and not line.strip().startswith("#")]


def flag_lines(path):
    """(name, value) of each --name=value line of an absl flagfile."""
    out = []
    for line in content_lines(path):
        m = re.fullmatch(r"--([a-z0-9_]+)=(.*)", line)
        assert m, f"{path}: not a --name=value line: {line!r}"
        out.append((m.group(1), m.group(2)))
    return out


class ImageBuildTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dcformer-image-")
        cls.prefix = os.path.join(cls.tmp, "opt-dcformer")
        # A tree built with the CUDA backend (the plugin the binaries dlopen) goes into the
        # CUDA image, whose base provides the CUDA libraries (build.sh --cuda leaves them
        # out) and whose runtime check requires the plugin (runtime-setup.sh --cuda).
        ldd = subprocess.run(["ldd", h.SERVER], capture_output=True, text=True).stdout
        cls.cuda = (os.path.exists(os.path.join(BUILD_DIR, "lib", PLUGIN)) or
                    re.search(r"\blib(cudart|cublas|cuda)\.so", ldd) is not None)
        cls.build = subprocess.run(
            ["bash", os.path.join(DOCKER, "build.sh"), "--reuse-build", "--build-dir", BUILD_DIR,
             "--prefix", cls.prefix] + (["--cuda"] if cls.cuda else []),
            capture_output=True, text=True, timeout=900)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def setUp(self):
        self.assertEqual(self.build.returncode, 0, self.build.stdout + self.build.stderr)

    def test_prefix_holds_binaries_libraries_and_model(self):
        for b in ("dcformer-server", "dcformer-cli"):
            self.assertTrue(os.access(os.path.join(self.prefix, "bin", b), os.X_OK), b)
        libs = os.listdir(os.path.join(self.prefix, "lib"))
        for lib in ("libgrpc++.so.1.51", "libprotobuf.so.32", "libgomp.so.1"):
            self.assertIn(lib, libs)
        # The release server links neither the SIMT emulator nor OpenBLAS (the CPU backend has
        # its own matmul kernels; cuda-sim, which calls OpenBLAS, is left out of it).
        self.assertFalse([lib for lib in libs if lib.startswith("libopenblas")], libs)
        self.assertFalse([lib for lib in libs if lib.startswith(("libc.so", "libstdc++"))])
        self.assertTrue(os.path.isfile(
            os.path.join(self.prefix, "models", "dcformer-kjv", "config.json")))
        self.assertTrue(os.path.isfile(
            os.path.join(self.prefix, "share", "dcformer", "runtime-setup.sh")))

    def test_server_runs_from_the_prefix_and_passes_the_healthcheck(self):
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": os.path.join(self.prefix, "lib"),
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        port = h.free_port()
        server = subprocess.Popen(
            [os.path.join(self.prefix, "bin", "dcformer-server"),
             f"--model={self.prefix}/models/dcformer-kjv", "--host=127.0.0.1", f"--port={port}",
             "--metrics-port=0", "--kv-cache-bytes=16000000"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            cli = [os.path.join(self.prefix, "bin", "dcformer-cli")]
            target = f"--target=127.0.0.1:{port}"

            def healthy():  # the image's HEALTHCHECK command
                return subprocess.run(cli + ["health", target, "--timeout=3s"], env=env,
                                      capture_output=True, timeout=30).returncode == 0

            h.wait_until(healthy, timeout=60, what="the staged server to report SERVING")
            out = subprocess.run(cli + ["generate", target, "--prompt=Hello",
                                        "--max-new-tokens=4", "--temperature=0", "--timeout=30s"],
                                 env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("FINISH_REASON_LENGTH", out.stderr)
            self.assertIn("generated_tokens=4", out.stderr)
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=30), 0)
        finally:
            if server.poll() is None:
                server.kill()
            log = server.communicate()[0]
        self.assertIn("serving", log)

    def runtime_check(self, prefix, *args):
        return subprocess.run(["bash", os.path.join(prefix, "share", "dcformer",
                                                    "runtime-setup.sh"), prefix, "--no-user"]
                              + list(args), capture_output=True, text=True, timeout=120)

    def test_runtime_check_names_a_missing_library(self):
        broken = os.path.join(self.tmp, "broken")
        shutil.copytree(self.prefix, broken, symlinks=True)
        os.unlink(os.path.join(broken, "lib", "libgrpc++.so.1.51"))
        out = self.runtime_check(broken, *(["--cuda"] if self.cuda else []))
        self.assertEqual(out.returncode, 1)
        self.assertIn("libgrpc++.so.1.51", out.stderr)

    def test_runtime_check_covers_the_cuda_plugin(self):
        """The binaries dlopen the CUDA backend, so ldd of them does not show it: the check
        looks at the plugin itself, and the CUDA image's check requires it."""
        plugin = os.path.join(self.prefix, "lib", PLUGIN)
        if not os.path.exists(plugin):
            self.skipTest("this build has no CUDA backend plugin (no CUDA toolkit)")
        out = self.runtime_check(self.prefix, "--cuda")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        # A library only the plugin needs, missing: named, with the plugin.
        broken = os.path.join(self.tmp, "broken-plugin")
        shutil.copytree(self.prefix, broken, symlinks=True)
        subprocess.run(["patchelf", "--add-needed", "libdcformer-test-missing.so.1",
                        os.path.join(broken, "lib", PLUGIN)], check=True, timeout=60)
        out = self.runtime_check(broken, "--cuda")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn(f"{PLUGIN}: libdcformer-test-missing.so.1 not found", out.stderr)
        # No plugin: the CUDA image would have no CUDA backend.
        os.unlink(os.path.join(broken, "lib", PLUGIN))
        out = self.runtime_check(broken, "--cuda")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn(f"{PLUGIN} missing", out.stderr)
        # The CPU image has none, and needs none.
        self.assertEqual(self.runtime_check(broken).returncode, 0)

    def test_cuda_configure_step(self):
        if not os.path.exists(NVCC):
            self.skipTest(f"no CUDA toolkit at {NVCC}: the CUDA image's configure step is "
                          "not checked on this machine")
        build = os.path.join(self.tmp, "build-cuda")
        out = subprocess.run(["bash", os.path.join(DOCKER, "build.sh"), "--cuda",
                              "--configure-only", "--build-dir", build],
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        cache = read(os.path.join(build, "CMakeCache.txt")).splitlines()
        self.assertIn("DCFORMER_CUDA:STRING=ON", cache)
        self.assertTrue(any(line.startswith("CMAKE_CUDA_ARCHITECTURES:") for line in cache),
                        "the CUDA language was not enabled")


class DockerfileTest(unittest.TestCase):
    """What the Dockerfiles say, since no engine builds them here."""

    def parse(self, name):
        text = read(os.path.join(DEPLOY, name))
        # Join continuation lines; drop comments.
        text = re.sub(r"\\\n\s*", " ", text)
        return [line.strip() for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def check_common(self, name, build_base, runtime_base, runtime_args):
        lines = self.parse(name)
        froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
        self.assertEqual(froms, [build_base, runtime_base], name)
        runs = [line for line in lines if line.startswith("RUN ")]
        self.assertTrue(any("/src/scripts/setup.sh" in r for r in runs), name)
        self.assertTrue(any("/src/deploy/docker/build.sh" in r for r in runs), name)
        self.assertIn(f"RUN bash /opt/dcformer/share/dcformer/runtime-setup.sh /opt/dcformer"
                      f"{runtime_args}", runs)
        self.assertIn("USER 10001", lines)
        health = next(line for line in lines if line.startswith("HEALTHCHECK"))
        self.assertIn('CMD ["dcformer-cli", "health"', health)
        self.assertTrue(any(line.startswith("ARG MODEL=models/dcformer-kjv") for line in lines))
        # The context's .dockerignore applies (DockerignoreTest): a Dockerfile-specific one
        # would take its place under BuildKit only.
        self.assertFalse(os.path.exists(os.path.join(DEPLOY, name + ".dockerignore")), name)
        return lines

    def test_cpu_dockerfile(self):
        self.check_common("Dockerfile", "debian:12", "debian:12-slim", "")

    def test_cuda_dockerfile(self):
        lines = self.check_common("Dockerfile.cuda",
                                  "nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04",
                                  "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04", " --cuda")
        version = next(line for line in lines if line.startswith("ARG CUDA_VERSION="))
        major = version.split("=")[1].split(".")[0]
        if os.path.exists(NVCC):
            nvcc = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
            self.assertIn(f"release {major}.", nvcc, "the image's CUDA major differs from CI's")
        self.assertTrue(any("build.sh --cuda" in line for line in lines))
        entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
        self.assertIn('"--backend=auto"', entry)


def dockerignore_regex(pattern):
    """The regular expression Docker (moby/patternmatcher) matches a .dockerignore pattern
    with, against a context-relative path: `**` any number of directories (none included),
    `*` and `?` within one path element, matched from the context root."""
    pattern = os.path.normpath(pattern.strip().lstrip("/"))
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/": zero or more directories
                out += "(.*/)?"
                i += 1
            else:
                out += ".*"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def dockerignore_excludes(rules, path):
    """Whether `path` (relative to the context) is left out: the last pattern that matches it
    or one of its parent directories decides; `!pattern` lets it back in."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return excluded


def dockerignore_rules(path):
    """(negated, regex) of each pattern of a .dockerignore file, in order."""
    rules = []
    for line in content_lines(path):
        negate = line.startswith("!")
        rules.append((negate, dockerignore_regex(line.lstrip("!"))))
    return rules


# What the images build: deploy/docker/build.sh's targets, and the CUDA plugin.
IMAGE_TARGETS = ("dcformer-server", "dcformer-cli", "dcformer_cuda_plugin")


def target_dir(name):
    """The CMakeFiles/<name>.dir of a target in the build tree, or None."""
    for root, dirs, _ in os.walk(BUILD_DIR):
        if f"{name}.dir" in dirs and os.path.basename(root) == "CMakeFiles":
            return os.path.join(root, f"{name}.dir")
    return None


def in_source_tree(paths):
    """The paths under the source tree but not in the build tree, relative to the source."""
    source, build = os.path.realpath(h.SOURCE_DIR), os.path.realpath(BUILD_DIR)
    out = set()
    for path in paths:
        path = os.path.realpath(os.path.join(BUILD_DIR, path))
        if path.startswith(source + "/") and not path.startswith(build + "/"):
            out.add(os.path.relpath(path, source))
    return out


def ninja_build_sources():
    """image_build_sources() of a Ninja build tree: every input of IMAGE_TARGETS, recursively
    (`ninja -t inputs`), and the files each of their objects was compiled from, headers
    included (`ninja -t deps`, the dependency log of the last build)."""
    def ninja(*args):
        out = subprocess.run(["ninja", "-C", BUILD_DIR, "-t", *args], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        return out.splitlines()
    inputs = ninja("inputs", *IMAGE_TARGETS)
    objects = [p for p in inputs if p.endswith(".o")]
    deps = [line.strip() for line in ninja("deps", *objects) if line.startswith(" ")]
    return in_source_tree(inputs + deps)


def image_build_sources():
    """The source-tree files (relative paths) the compilers read to build IMAGE_TARGETS and
    the libraries they link: from Ninja's dependency log, or from the Makefile generator's
    compiler_depend.make; None when the build tree has neither (not built)."""
    if os.path.exists(os.path.join(BUILD_DIR, "build.ninja")):
        return ninja_build_sources() or None
    dirs, queue = set(), [t for t in IMAGE_TARGETS if target_dir(t)]
    while queue:
        d = target_dir(queue.pop())
        if d is None or d in dirs:
            continue
        dirs.add(d)
        link = os.path.join(d, "link.txt")
        if os.path.exists(link):
            queue += re.findall(r"(?:^|[\s/])lib([\w.+-]+?)\.(?:a|so)\b", read(link))
    out = set()
    for d in dirs:
        depend = os.path.join(d, "compiler_depend.make")
        if os.path.exists(depend):
            out |= in_source_tree(re.findall(r"(/[^\s\\:]+)", read(depend)))
    return out or None


class DockerignoreTest(unittest.TestCase):
    """The build context of both images (the repository root) is an allowlist: it holds what
    the image build reads (it configures from the context alone, and every source file the
    compilers read for the image's targets is in it) and leaves out secrets, build trees,
    caches and whatever else lies in the checkout."""

    @classmethod
    def setUpClass(cls):
        cls.rules = dockerignore_rules(os.path.join(h.SOURCE_DIR, ".dockerignore"))
        out = subprocess.run(["git", "-C", h.SOURCE_DIR, "ls-files"], capture_output=True,
                             text=True, timeout=60)
        cls.tracked = out.stdout.split() if out.returncode == 0 else None

    def setUp(self):
        if self.tracked is None:
            self.skipTest("not a git checkout")

    def in_context(self, path):
        return not dockerignore_excludes(self.rules, path)

    def test_matcher(self):
        # Docker's rules, which the checks below rely on: a bare "*.key" matches at the
        # context root only, "**/" at any depth including the root.
        rules = [(False, dockerignore_regex("*.key"))]
        self.assertTrue(dockerignore_excludes(rules, "server.key"))
        self.assertFalse(dockerignore_excludes(rules, "tls/server.key"))
        rules = [(False, dockerignore_regex("**/*.key"))]
        self.assertTrue(dockerignore_excludes(rules, "server.key"))
        self.assertTrue(dockerignore_excludes(rules, "deploy/tls/server.key"))
        rules = [(False, dockerignore_regex("build")), (True, dockerignore_regex("build/keep"))]
        self.assertTrue(dockerignore_excludes(rules, "build/bin/dcformer-server"))
        self.assertFalse(dockerignore_excludes(rules, "build/keep"))
        # An allowlist: "*" leaves out everything (a folder by its name, so all under it),
        # "!dir" lets a folder back in, later patterns leave things in it out again.
        rules = [(False, dockerignore_regex("*")), (True, dockerignore_regex("engine")),
                 (False, dockerignore_regex("**/*.key"))]
        self.assertFalse(dockerignore_excludes(rules, "engine/new/sub/file.cc"))
        self.assertTrue(dockerignore_excludes(rules, "engine/tls.key"))
        self.assertTrue(dockerignore_excludes(rules, "docs/API.md"))
        self.assertTrue(dockerignore_excludes(rules, "README.md"))

    def test_secrets_and_clutter_stay_out(self):
        for path in ("api-keys", "deploy/api-keys", "api-keys.txt", "server.key",
                     "deploy/tls/tls.key", "tls.crt", "certs/ca.pem", "a/b/client.p12",
                     ".env", "deploy/.env.production", "kubeconfig", "kubeconfig.yaml",
                     ".kube/config", ".docker/config.json", "id_rsa", "home/id_ed25519.pub",
                     ".netrc", "secrets/token", ".git/config", ".git-credentials",
                     ".aws/credentials", "credentials.json", "gcp-sa.json",
                     ".config/gcloud/application_default_credentials.json",
                     "build/bin/dcformer-server", "build-asan/CMakeCache.txt",
                     "deploy/validate/node_modules/yaml/x.js",
                     "tests/integration/__pycache__/harness.cpython-311.pyc",
                     # README step 3 copies the model from the repository root.
                     "DCFormer-2.8B/model-00001-of-00003.safetensors",
                     # Inside the folders the build reads, at any depth.
                     "engine/.env", "server/tls.key", "server/certs/server.pem",
                     "scripts/kubeconfig.yaml", "deploy/docker/.aws/credentials",
                     "client/examples/node/node_modules/@grpc/grpc-js/package.json",
                     "client/examples/node/.npmrc", "models/dcformer-kjv/.git/config",
                     "models/train/data/corpus.txt", "bench/.git-credentials",
                     "engine/cuda/__pycache__/x.pyc", "proto/gcp-sa.json"):
            self.assertFalse(self.in_context(path), path)

    def test_the_build_configures_from_the_context_alone(self):
        """The tracked files the rules let in, copied alone into a directory, configure as
        the image's build.sh does (no tests, no CUDA needed to configure): a CMakeLists.txt,
        CMake module or source file left out makes this fail."""
        context = [p for p in self.tracked if self.in_context(p)]
        for needed in ("scripts/setup.sh", "deploy/docker/build.sh",
                       "deploy/docker/runtime-setup.sh", "deploy/docker/runtime-libs.sh",
                       "models/dcformer-kjv/config.json", "CMakeLists.txt"):
            self.assertIn(needed, context)  # the Dockerfiles' COPY and RUN, build.sh's reads
        tmp = tempfile.mkdtemp(prefix="dcformer-context-")
        self.addCleanup(shutil.rmtree, tmp)
        for p in context:
            os.makedirs(os.path.join(tmp, os.path.dirname(p)), exist_ok=True)
            shutil.copy2(os.path.join(h.SOURCE_DIR, p), os.path.join(tmp, p))
        out = subprocess.run(["cmake", "-S", tmp, "-B", os.path.join(tmp, "build-image"),
                              "-DCMAKE_BUILD_TYPE=Release", "-DDCFORMER_BUILD_TESTS=OFF",
                              "-DDCFORMER_CUDA=OFF"],
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])

    def test_every_source_the_image_targets_compile_is_in_the_context(self):
        sources = image_build_sources()
        if sources is None:
            self.skipTest("the build tree has no dependency information (not built)")
        self.assertIn("server/server_main.cc", sources)
        self.assertEqual(sorted(p for p in sources if not self.in_context(p)), [])

    def test_tracked_files_of_the_folders_the_build_reads_are_all_in(self):
        """No secret or cache pattern catches a tracked file in an allowed folder."""
        allowed = [p for p in self.tracked if self.in_context(p)]
        tops = {p.split("/")[0] for p in allowed}
        self.assertLessEqual({"CMakeLists.txt", "cmake", "engine", "server", "proto",
                              "client", "bench", "scripts", "models"}, tops)
        for p in self.tracked:
            top = p.split("/")[0]
            if top in tops - {"deploy"} or p.startswith("deploy/docker/"):
                self.assertTrue(self.in_context(p), p)
        # And nothing the build does not read.
        for p in ("docs/API.md", "tests/integration/harness.py", "README.md",
                  "deploy/kubernetes/base/deployment.yaml", ".ci/run"):
            if p in self.tracked:
                self.assertFalse(self.in_context(p), p)


class GitignoreTest(unittest.TestCase):
    """Secrets never enter a commit: .gitignore ignores what deploy/README.md says it does
    (api-keys, *.key, *.pem and other secret files) at the root and at any depth, and no
    tracked file."""

    def git(self, *args):
        return subprocess.run(["git", "-C", h.SOURCE_DIR, *args], capture_output=True,
                              text=True, timeout=60)

    def setUp(self):
        if self.git("rev-parse", "--git-dir").returncode != 0:
            self.skipTest("not a git checkout")

    def test_secrets_are_ignored_at_any_depth(self):
        for path in ("api-keys", "deploy/api-keys", "api-keys.txt", "tls.key",
                     "deploy/tls/tls.key", "server.pem", "certs/ca.pem", "tls.crt",
                     "a/client.p12", "kubeconfig", "kubeconfig.yaml", ".env",
                     "deploy/.env.production", "id_rsa", ".git-credentials",
                     "credentials.json", "gcp-sa.json"):
            # --no-index: as for a file not yet added.
            out = self.git("check-ignore", "--no-index", "-q", path)
            self.assertEqual(out.returncode, 0, f"{path} is not ignored")

    def test_no_tracked_file_is_ignored(self):
        out = self.git("ls-files", "--cached", "--ignored", "--exclude-standard")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [])


class RetryThrottle:
    """gRPC's retry throttling (gRFC A6, grpc_core::internal::ServerRetryThrottleData): a
    bucket of maxTokens that each failed call (retryable status, retried or not) drains by
    one and each successful one refills by tokenRatio; a failed call may be retried only
    while more than half the bucket is left. Kept in thousandths, as gRPC does."""

    def __init__(self, max_tokens, token_ratio):
        self.max = round(max_tokens * 1000)
        self.ratio = round(token_ratio * 1000)
        self.tokens = self.max

    def failure(self):
        """Records a failed call; whether it may be retried."""
        self.tokens = max(0, self.tokens - 1000)
        return self.tokens > self.max // 2

    def success(self):
        self.tokens = min(self.max, self.tokens + self.ratio)


class ClientServiceConfigTest(unittest.TestCase):
    """deploy/client/service-config.json's retry throttling, played through gRPC's algorithm:
    one replica's crash does not switch retries off, a service where most calls fail gets no
    retries, and deploy/README.md states the numbers."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(DEPLOY, "client", "service-config.json")) as f:
            cls.config = json.load(f)
        cls.throttling = cls.config["retryThrottling"]
        flags = dict(flag_lines(os.path.join(K8S, "overlays", "gpu", "overlay.flags")) +
                     flag_lines(os.path.join(K8S, "base", "server.flags")))
        cls.max_num_seqs = int(flags["max_num_seqs"])

    def throttle(self):
        return RetryThrottle(self.throttling["maxTokens"], self.throttling["tokenRatio"])

    def failures_tolerated(self):
        t, n = self.throttle(), 0
        while t.failure():
            n += 1
        return n

    def test_one_replica_crash_keeps_retries_on(self):
        # A GPU replica runs up to --max_num_seqs streams; its crash fails each of them (a
        # streamed call is not retried but still takes a token), and calls racing the crash
        # must still be retried.
        t = self.throttle()
        for _ in range(self.max_num_seqs):
            t.failure()
        self.assertTrue(t.failure(), "retries are off after one replica's crash")
        # The value the review found: 10 tokens stop retrying after 5 failures.
        old = RetryThrottle(10, 0.1)
        self.assertEqual([old.failure() for _ in range(6)], [True] * 4 + [False] * 2)

    def test_retries_stop_when_most_calls_fail(self):
        # Every call fails: retries stop within maxTokens / 2 failures.
        self.assertLessEqual(self.failures_tolerated(), self.throttling["maxTokens"] // 2)
        # Steady state: 3 of 5 calls fail: retries end up off; 1 in 5: they stay on.
        for failing, expect in ((3, False), (1, True)):
            t = self.throttle()
            for _ in range(1000):
                for i in range(5):
                    if i < failing:
                        t.failure()
                    else:
                        t.success()
            self.assertEqual(t.tokens > t.max // 2, expect, f"{failing} of 5 failing")

    def test_readme_states_the_numbers(self):
        with open(os.path.join(DEPLOY, "README.md")) as f:
            readme = " ".join(f.read().split())
        m = re.search(r"`retryThrottling`: (\d+) tokens, ratio ([\d.]+)\..*?keeps retrying "
                      r"through (\d+) failures in a row, more than the (\d+) streams", readme)
        self.assertIsNotNone(m, "deploy/README.md does not describe the retry throttling")
        self.assertEqual(int(m.group(1)), self.throttling["maxTokens"])
        self.assertEqual(float(m.group(2)), self.throttling["tokenRatio"])
        self.assertEqual(int(m.group(3)), self.failures_tolerated())
        self.assertEqual(int(m.group(4)), self.max_num_seqs)


class ServerFlagsTest(unittest.TestCase):
    """The flagfiles of the Kubernetes ConfigMap name flags the server knows, and the server
    starts with them."""

    @classmethod
    def setUpClass(cls):
        out = subprocess.run([h.SERVER, "--helpfull"], capture_output=True, text=True,
                             timeout=60)
        # --helpfull lists them dashed (--drain-timeout); flagfiles spell them with underscores.
        cls.known = {name.replace("-", "_") for name in
                     re.findall(r"^\s+--([a-z0-9_-]+) ", out.stdout + out.stderr, re.M)}
        assert "drain_timeout" in cls.known, "cannot read the server's flags"

    def flagfiles(self):
        return [os.path.join(K8S, "base", "server.flags"),
                os.path.join(K8S, "overlays", "cpu", "overlay.flags"),
                os.path.join(K8S, "overlays", "gpu", "overlay.flags"),
                os.path.join(K8S, "components", "tls", "tls.flags")]

    def test_every_flag_is_known(self):
        for path in self.flagfiles():
            for name, _ in flag_lines(path):
                self.assertIn(name, self.known, f"{path}: unknown flag --{name}")

    def test_server_starts_with_the_cpu_flagfiles(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        args = []
        for i, path in enumerate(self.flagfiles()[:2]):
            copy = os.path.join(tmp, f"{i}.flags")
            with open(copy, "w") as f:
                f.writelines(f"--{n}={v}\n" for n, v in flag_lines(path)
                             if n in self.known)
            args.append(f"--flagfile={copy}")
        keys = os.path.join(tmp, "keys")
        with open(keys, "w") as f:
            f.write("test-key\n")
        # The files' paths and addresses are the container's; these override them (later
        # flags win), everything else comes from the files.
        server = h.Server(args=args)
        server.args += [f"--api-key-file={keys}", f"--model={h.SHORT_MODEL}",
                        "--host=127.0.0.1", f"--port={server.port}",
                        "--metrics-host=127.0.0.1", f"--metrics-port={server.metrics_port}"]
        with server:
            self.assertEqual(server.check_health(h.SERVICE), h.SERVING)
            log = server.read_log()
        self.assertIn("(api key required)", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
