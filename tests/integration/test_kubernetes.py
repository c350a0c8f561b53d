"""The Kubernetes manifests (deploy/kubernetes): `kubectl kustomize` builds the cpu and gpu
overlays (also with the TLS component), the monitoring and prometheus-adapter kustomizations;
every object passes the Kubernetes OpenAPI schemas, strictly (deploy/validate: unknown fields
are errors); and the objects say what deploy/README.md promises (probes, drain within the
grace period, limits, security context, ...).

Run as a script (CTest does): without kubectl, or with one whose kustomize is too old for
these kustomizations, it says so and exits 77, which CTest reports as skipped."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

import harness as h

K8S = os.path.join(h.SOURCE_DIR, "deploy", "kubernetes")
VALIDATOR = os.path.join(h.SOURCE_DIR, "deploy", "validate", "validate.mjs")
KUBECTL = shutil.which("kubectl")
SKIP = 77
# docs/API.md, "Shutdown": the process exits within --drain-timeout + 2 s.
EXIT_MARGIN_S = 2


def kubectl_problem():
    """Why kustomizations cannot be built here, or None."""
    if KUBECTL is None:
        return "kubectl is not installed"
    out = subprocess.run([KUBECTL, "version", "--client", "-o", "json"], capture_output=True,
                         text=True, timeout=60)
    try:
        kustomize = json.loads(out.stdout).get("kustomizeVersion", "")
    except ValueError:
        return f"cannot read kubectl's version: {out.stdout}{out.stderr}"
    m = re.match(r"v(\d+)", kustomize)
    if not m or int(m.group(1)) < 4:
        return f"kubectl's kustomize is {kustomize or 'unknown'}; these need v4 or later"
    return None


def kustomize(path):
    out = subprocess.run([KUBECTL, "kustomize", path], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {path}:\n{out.stderr}"
    return out.stdout


def validate(manifest_text):
    """(exit code, output) of the schema validator on a multi-document YAML text."""
    if not os.path.isdir(os.path.join(os.path.dirname(VALIDATOR), "node_modules")):
        raise AssertionError("deploy/validate/node_modules is missing: run scripts/setup.sh")
    out = subprocess.run(["node", VALIDATOR], input=manifest_text, capture_output=True,
                         text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def objects(manifest_text):
    return {(o["kind"], o["metadata"]["name"]): o
            for o in yaml.safe_load_all(manifest_text) if o}


def duration_s(value):
    m = re.fullmatch(r"(\d+)s", value)
    assert m, f"expected a duration in seconds, got {value!r}"
    return int(m.group(1))


def flags_of(config_map):
    """{flag: value} of the flagfiles of the dcformer-flags ConfigMap, in the order the
    Deployment reads them (later files win)."""
    out = {}
    for key in ("server.flags", "overlay.flags", "tls.flags"):
        for line in config_map["data"].get(key, "").splitlines():
            m = re.fullmatch(r"--([a-z0-9_]+)=(.*)", line.strip())
            if m:
                out[m.group(1)] = m.group(2)
    return out


class KustomizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dcformer-k8s-")
        # The gpu overlay with the TLS component, as deploy/README.md tells operators.
        tls = os.path.join(cls.tmp, "gpu-tls")
        os.mkdir(tls)
        with open(os.path.join(tls, "kustomization.yaml"), "w") as f:
            rel = lambda p: os.path.relpath(os.path.join(K8S, p), tls)  # noqa: E731
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    f"resources:\n  - {rel('overlays/gpu')}\n"
                    f"components:\n  - {rel('components/tls')}\n")
        cls.built = {name: kustomize(path) for name, path in (
            ("cpu", os.path.join(K8S, "overlays", "cpu")),
            ("gpu", os.path.join(K8S, "overlays", "gpu")),
            ("gpu-tls", tls),
            ("monitoring", os.path.join(K8S, "monitoring")),
            ("prometheus-adapter", os.path.join(K8S, "prometheus-adapter")))}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_every_object_passes_the_schemas(self):
        for name, text in self.built.items():
            with self.subTest(name):
                code, out = validate(text)
                self.assertEqual(code, 0, f"{name}:\n{out}")
                self.assertIn(" 0 invalid", out)

    def test_validator_rejects_invalid_fields(self):
        deployment = objects(self.built["cpu"])[("Deployment", "dcformer-serve")]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        container["readinessProbe"]["periodSecond"] = 5   # misspelt
        deployment["spec"]["replicas"] = "two"            # wrong type
        code, out = validate(yaml.safe_dump(deployment))
        self.assertEqual(code, 1, out)
        self.assertIn("/spec/template/spec/containers/0/readinessProbe/periodSecond: "
                      "unknown field", out)
        self.assertIn("/spec/replicas: must be integer", out)

    def check_deployment(self, objs, gpu, tls):
        d = objs[("Deployment", "dcformer-serve")]
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        flags = flags_of(next(o for (k, n), o in objs.items()
                              if k == "ConfigMap" and n.startswith("dcformer-flags-")))
        # Flags from the ConfigMap, each file mounted and read.
        self.assertEqual(c["args"][:2], ["--flagfile=/etc/dcformer/flags/server.flags",
                                         "--flagfile=/etc/dcformer/flags/overlay.flags"])
        self.assertEqual(flags["port"], "50051")
        self.assertEqual(flags["metrics_port"], "9090")
        # Probes: gRPC health (exec through dcformer-cli under TLS, which kubelet's gRPC
        # probes cannot speak); readiness checks the TextGeneration service.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if tls:
                cmd = c[probe]["exec"]["command"]
                self.assertEqual(cmd[:3], ["dcformer-cli", "health", "--tls"], probe)
            else:
                self.assertEqual(c[probe]["grpc"]["port"], 50051, probe)
        if tls:
            self.assertIn("--service=dcformer.v1.TextGeneration",
                          c["readinessProbe"]["exec"]["command"])
            self.assertEqual(flags["tls_cert"], "/etc/dcformer/tls/tls.crt")
            self.assertIn({"name": "tls", "secret": {"secretName": "dcformer-tls",
                                                     "defaultMode": 0o440}}, pod["volumes"])
        else:
            self.assertEqual(c["readinessProbe"]["grpc"]["service"],
                             "dcformer.v1.TextGeneration")
        # Drain: preStop delay + --drain-timeout + exit margin within the grace period, and
        # liveness does not kill a draining pod.
        pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
        drain = duration_s(flags["drain_timeout"])
        self.assertGreater(pod["terminationGracePeriodSeconds"],
                           pre_stop + drain + EXIT_MARGIN_S)
        live = c["livenessProbe"]
        self.assertGreater(live["periodSeconds"] * live["failureThreshold"], drain)
        # Requests and limits: the KV cache is sized from the memory limit.
        res = c["resources"]
        for key in ("cpu", "memory"):
            self.assertIn(key, res["requests"])
        self.assertIn("memory", res["limits"])
        if gpu:
            self.assertEqual(res["limits"]["nvidia.com/gpu"], 1)
            self.assertEqual(flags["backend"], "auto")
            self.assertTrue(flags["model"].startswith("/models/"))
            self.assertIn({"name": "models", "persistentVolumeClaim": {
                "claimName": "dcformer-models", "readOnly": True}}, pod["volumes"])
            self.assertIn(("PersistentVolumeClaim", "dcformer-models"), objs)
            self.assertTrue(any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]))
        else:
            self.assertNotIn("nvidia.com/gpu", res["limits"])
            self.assertEqual(flags["model"], "/opt/dcformer/models/dcformer-tiny")
        # Security: non-root, read-only root filesystem, no privilege escalation, no
        # capabilities.
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        sc = c["securityContext"]
        self.assertTrue(sc["readOnlyRootFilesystem"])
        self.assertFalse(sc["allowPrivilegeEscalation"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        # API keys from a Secret; replicas spread across nodes.
        self.assertEqual(flags["api_key_file"], "/etc/dcformer/api-keys/keys")
        self.assertIn({"name": "api-keys", "secret": {"secretName": "dcformer-api-keys",
                                                      "defaultMode": 0o440}}, pod["volumes"])
        self.assertIn("kubernetes.io/hostname",
                      [t["topologyKey"] for t in pod["topologySpreadConstraints"]])

    def test_overlays(self):
        for name, gpu, tls in (("cpu", False, False), ("gpu", True, False),
                               ("gpu-tls", True, True)):
            with self.subTest(name):
                self.check_deployment(objects(self.built[name]), gpu, tls)

    def test_services_budget_policy_autoscaler(self):
        objs = objects(self.built["gpu"])
        labels = objs[("Deployment", "dcformer-serve")]["spec"]["template"]["metadata"]["labels"]
        svc = objs[("Service", "dcformer-serve")]["spec"]
        headless = objs[("Service", "dcformer-serve-headless")]["spec"]
        self.assertEqual(headless["clusterIP"], "None")
        self.assertEqual([p["name"] for p in headless["ports"]], ["grpc"])
        self.assertEqual({p["name"] for p in svc["ports"]}, {"grpc", "metrics"})
        for s in (svc, headless):
            self.assertLessEqual(s["selector"].items(), labels.items())
        pdb = objs[("PodDisruptionBudget", "dcformer-serve")]["spec"]
        self.assertEqual(pdb["maxUnavailable"], 1)
        policy = objs[("NetworkPolicy", "dcformer-serve")]["spec"]
        rules = {r["ports"][0]["port"]: r["from"][0] for r in policy["ingress"]}
        self.assertEqual(rules["grpc"]["podSelector"]["matchLabels"], {"dcformer.io/client": "true"})
        self.assertEqual(rules["metrics"]["namespaceSelector"]["matchLabels"],
                         {"kubernetes.io/metadata.name": "monitoring"})
        # The HPA's custom metrics are the ones prometheus-adapter publishes; CPU is the
        # fallback.
        hpa = objs[("HorizontalPodAutoscaler", "dcformer-serve")]["spec"]
        pods_metrics = {m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"}
        self.assertEqual(pods_metrics, {"dcformer_num_requests_waiting",
                                        "dcformer_kv_cache_usage_perc"})
        self.assertIn("cpu", [m["resource"]["name"] for m in hpa["metrics"]
                              if m["type"] == "Resource"])
        adapter = objects(self.built["prometheus-adapter"])[("ConfigMap", "adapter-config")]
        rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
        self.assertEqual({r["name"]["as"] for r in rules}, pods_metrics)

    def test_monitoring_targets_the_service(self):
        objs = objects(self.built["monitoring"])
        app = objects(self.built["gpu"])
        sm = objs[("ServiceMonitor", "dcformer-serve")]["spec"]
        svc = app[("Service", "dcformer-serve")]
        self.assertLessEqual(sm["selector"]["matchLabels"].items(),
                             svc["metadata"]["labels"].items())
        self.assertEqual(sm["namespaceSelector"]["matchNames"], [svc["metadata"]["namespace"]])
        self.assertEqual(sm["endpoints"][0]["port"], "metrics")
        dashboard = objs[("ConfigMap", "dcformer-grafana-dashboard")]
        self.assertEqual(dashboard["metadata"]["labels"]["grafana_dashboard"], "1")
        json.loads(dashboard["data"]["dcformer-dashboard.json"])


if __name__ == "__main__":
    problem = kubectl_problem()
    if problem:
        print(f"SKIPPED: {problem}: the Kubernetes manifests are not built or validated on "
              "this machine", flush=True)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
