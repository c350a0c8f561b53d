"""The deployment files are valid: promtool accepts the Prometheus config, and the
Kubernetes manifests probe gRPC health and carry the scrape annotations."""
import os
import shutil
import subprocess
import unittest

import harness as h

DEPLOY = os.path.join(h.SOURCE_DIR, "deploy")


class DeployTest(unittest.TestCase):
    def test_prometheus_config_is_valid(self):
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        if not os.path.exists(promtool):
            self.skipTest("promtool not installed")
        out = subprocess.run([promtool, "check", "config",
                              os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_kubernetes_manifests(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("python3-yaml not installed")
        with open(os.path.join(DEPLOY, "kubernetes", "deployment.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        pod = deployment["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(annotations["prometheus.io/port"], "9090")
        container = pod["spec"]["containers"][0]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(container[probe]["grpc"]["port"], 50051, probe)
        self.assertEqual(container["readinessProbe"]["grpc"]["service"],
                         "dcformer.v1.TextGeneration")
        drain = next(a for a in container["args"] if a.startswith("--drain-timeout="))
        self.assertGreater(pod["spec"]["terminationGracePeriodSeconds"],
                           int(drain.split("=")[1].rstrip("s")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
