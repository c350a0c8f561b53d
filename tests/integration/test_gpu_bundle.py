"""The GPU-check bundle (scripts/gpu-check.sh, docs/GPU_CHECK.md), assembled from this build
tree (--reuse-build: no second build; this tree's CUDA architectures may make it larger than
the 60 MiB of the real, sm_90a-only bundle) and checked to be self-contained: every binary finds
its shared libraries inside the bundle with LD_LIBRARY_PATH empty and starts (--help), and
run.sh stops cleanly at "no GPU" on a machine without one. A bundle missing a library fails
the self-check."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness as h

BUILD_DIR = os.path.dirname(h.BIN_DIR)
SCRIPT = os.path.join(h.SOURCE_DIR, "scripts", "gpu-check.sh")


def has_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU " in p.stdout


class GpuBundleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The bundle carries the CUDA backend: a build without the toolkit (DCFORMER_CUDA=OFF
        # or no nvcc) has none to pack. Said visibly, as a skip.
        if not os.path.exists(os.path.join(BUILD_DIR, "lib", "libdcformer_cuda_plugin.so")):
            raise unittest.SkipTest("this build has no CUDA backend (no toolkit or "
                                    "DCFORMER_CUDA=OFF): nothing to bundle")
        cls.tmp = tempfile.mkdtemp(prefix="gpu-bundle-test-")
        cls.bundle = os.path.join(cls.tmp, "bundle")
        p = subprocess.run(["bash", SCRIPT, "--reuse-build", "--build-dir", BUILD_DIR,
                            "--bundle", cls.bundle, "--no-run", "--max-mib", "200"],
                           capture_output=True, text=True, timeout=300, cwd=h.SOURCE_DIR)
        cls.assemble = p

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_sh(self, *args, env_extra=None):
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "", "HOME": self.tmp}
        env.update(env_extra or {})
        return subprocess.run([os.path.join(self.bundle, "run.sh"), *args], capture_output=True,
                              text=True, timeout=300, env=env)

    def test_assembles_with_the_tools_and_libraries(self):
        self.assertEqual(self.assemble.returncode, 0, self.assemble.stdout + self.assemble.stderr)
        with open(os.path.join(self.bundle, "MANIFEST.json")) as f:
            manifest = json.load(f)
        files = manifest["files"]
        for tool in ("dcformer-generate", "dcformer-make-model", "dcformer-model-bench",
                     "dcformer-attention-bench", "dcformer-decode-bench"):
            self.assertIn(f"bin/{tool}", files)
        # Debian libraries the GPU machine lacks come along; the C library does not.
        libs = [f for f in files if f.startswith("lib/")]
        self.assertTrue(any("libabsl_" in f for f in libs), libs)
        self.assertTrue(any("libopenblas.so.0" in f for f in libs), libs)
        self.assertFalse(any(os.path.basename(f).startswith("libc.so") for f in libs), libs)
        self.assertTrue(os.path.isfile(os.path.join(
            self.bundle, "data", "golden", "dcformer-f32-long-prompt", "golden.json")))

    def test_self_check_passes_with_an_empty_library_path(self):
        p = self.run_sh("--self-check")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("self_check: pass", p.stdout)

    def test_run_without_a_gpu_reports_no_gpu(self):
        if has_gpu():
            self.skipTest("this machine has a GPU: run.sh would run the whole check")
        out = os.path.join(self.tmp, "out")
        p = self.run_sh(out)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("no GPU", p.stdout)
        with open(os.path.join(out, "gpu-check.json")) as f:
            summary = json.load(f)
        self.assertEqual(summary["status"], "no_gpu")
        self.assertEqual(summary["parts"][0]["part"], "self_check")
        self.assertEqual(summary["parts"][0]["status"], "pass")
        self.assertTrue(os.path.getsize(os.path.join(out, "gpu-check.log")) > 0)

    def test_a_missing_library_fails_the_self_check(self):
        broken = os.path.join(self.tmp, "broken")
        shutil.copytree(self.bundle, broken, symlinks=True)
        os.remove(os.path.join(broken, "lib", "libzip.so.4"))
        p = subprocess.run([os.path.join(broken, "run.sh"), "--self-check"],
                           capture_output=True, text=True, timeout=300,
                           env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("libzip.so.4", p.stdout)


if __name__ == "__main__":
    unittest.main()
