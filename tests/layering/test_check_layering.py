"""scripts/check_layering.py on small planted trees: it fails on an include that goes up or
sideways, names the file, the line and the modules, and passes the includes the layering
allows (including those of unit tests into lower modules and test support)."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("DCF_SOURCE_DIR",
                      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layering.py")


def run(tree):
    """Writes `tree` ({path: text}) to a temp dir and runs the check on it."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in tree.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True,
                              text=True, timeout=60)


def include(*headers):
    return "".join(f'#include "{h}"\n' for h in headers)


class CheckLayeringTest(unittest.TestCase):
    def test_the_repository_passes(self):
        r = subprocess.run([sys.executable, SCRIPT, "--root", ROOT], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("every include goes down", r.stdout)

    def test_allowed_includes_pass(self):
        r = run({
            "engine/kv/kv.h": include("engine/model/model_config.h", "engine/common/logging.h"),
            "engine/serving/engine.cc": include("engine/execution/backend.h",
                                                "engine/tokenizer/tokenizer.h", "local.h"),
            "engine/cuda/k.cu": include("engine/simt/cuda_compat.h"),
            "engine/backends/f.cc": include("engine/cpu/cpu_backend.h", "engine/cuda/c.h"),
            "server/s.cc": include("engine/serving/engine.h", "dcformer/v1/dcformer.pb.h"),
            "client/c.cc": include("engine/common/flag_names.h"),
            # A unit test may use its module, anything below it, and test support.
            "tests/unit/cuda/t.cc": include("engine/cuda/norm.h", "engine/cpu/cpu_ops.h",
                                            "tests/testing/golden.h"),
            "tests/unit/serving/t.cc": include("engine/cpu/cpu_backend.h",
                                               "engine/simt/simt_testing.h",
                                               "tests/unit/kv/helper.h"),
            "tests/integration/x.cc": include("server/server_main.h"),
        })
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_an_include_into_a_higher_module_fails(self):
        r = run({"engine/kv/kv_cache_manager.cc": "// x\n" + include("engine/serving/engine.h")})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/kv/kv_cache_manager.cc:2: includes engine/serving/engine.h: "
                      "kv -> serving", r.stdout)
        self.assertIn("1 include(s) break the layering", r.stdout)

    def test_sideways_includes_fail(self):
        r = run({
            "engine/cpu/a.cc": include("engine/cuda/gemm.h"),              # backend -> backend
            "engine/serving/b.cc": include("engine/cpu/cpu_backend.h"),    # a concrete backend
            "tests/testing/c.h": include("server/dcformer_server.h"),      # support -> server
            "server/d.cc": include("tests/testing/fault_injecting_backend.h"),
            "engine/simt/e.h": include("engine/cuda/device_util.cuh"),     # platform -> backend
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        for line in ("engine/cpu/a.cc:1", "engine/serving/b.cc:1", "tests/testing/c.h:1",
                     "server/d.cc:1", "engine/simt/e.h:1"):
            self.assertIn(line, r.stdout)
        self.assertIn("5 include(s) break the layering", r.stdout)

    def test_a_unit_test_may_not_reach_above_its_module(self):
        r = run({
            "tests/unit/kv/t.cc": include("engine/serving/scheduler.h"),
            "tests/unit/model/u.cc": include("engine/backends/backend_factory.h"),
            "tests/unit/weights/v.cc": include("tests/unit/serving/helper.h"),
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("tests/unit/kv/t.cc:1: includes engine/serving/scheduler.h: "
                      "tests/unit/kv -> serving", r.stdout)
        self.assertIn("3 include(s) break the layering", r.stdout)


if __name__ == "__main__":
    unittest.main()
