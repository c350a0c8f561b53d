"""A short run of the soak benchmark (bench/soak/soak.py --check): mixed requests for 20 s
against one server; after warm-up no growth of RSS, open fds or threads beyond the script's
stated bounds, the server's cancelled/deadline counts equal what the clients saw, and KV
blocks, running and waiting requests back to zero. Long runs are the benchmark's job."""
import json
import os
import subprocess
import unittest

import harness as h


class SoakTest(unittest.TestCase):
    def test_short_soak(self):
        script = os.path.join(h.SOURCE_DIR, "bench", "soak", "soak.py")
        env = dict(os.environ, DCF_PY_DIR=h.PY_DIR, OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        args = ["--duration=20", "--concurrency=4", f"--server={h.SERVER}", "--check"]
        if "address" in os.environ.get("DCF_SANITIZE", ""):
            # Under AddressSanitizer freed memory waits in its quarantine (256 MiB by default)
            # before reuse, so RSS climbs by up to that much whatever the server does; leaks
            # are LeakSanitizer's job in that run. The bound allows the quarantine on top.
            args.append(f"--rss-bound-mib={24 + 256}")
        out = subprocess.run(["/usr/bin/python3", script] + args,
                             capture_output=True, text=True, timeout=240, env=env)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:] + out.stdout[-3000:])
        report = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertGreater(report["requests"], 50)
        self.assertEqual(report["failures"], [])
        print({k: v for k, v in report.items() if k != "samples"})


if __name__ == "__main__":
    unittest.main(verbosity=2)
