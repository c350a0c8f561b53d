"""The Kubernetes manifests (deploy/kubernetes): `kubectl kustomize` builds the cpu and gpu
overlays, alone and with every optional component (TLS, the nvidia RuntimeClass, GPU node
affinity, scrape annotations: both as the overlays' commented lines enable them and from a
kustomization around the overlay, over an operator's own annotations and affinity, which
must survive them), and the monitoring kustomization; every object
passes the Kubernetes OpenAPI schemas, strictly (deploy/validate: unknown fields are errors);
and the objects say what deploy/README.md promises: no replica count under the autoscaler, a
namespace on every namespaced object, probes with one handler, room for slow checks and
timeouts longer than their commands', a drain within the grace period (a longer one on GPUs),
rollouts whose deadline covers the startup budget (threshold x the longer of period and
timeout), the old pod's grace period and an image pull, and that need no GPU the cluster
lacks (the README's spare-GPU variant rendered too), a
disruption budget that lets unhealthy pods go, network rules scoped by namespace, the HPA's
metrics equal to prometheus-adapter's rules (a snippet that merges into an existing adapter
configuration, not one that replaces it), limits, security context, secrets; and what
kube-prometheus lacks (deploy/kubernetes/kube-prometheus: discovery in dcformer, the custom
metrics API; its jsonnet mixin, evaluated against a stand-in with kube-prometheus's structure
when jsonnet is installed).

Run as a script (CTest does): without kubectl, or with one whose kustomize is too old for
these kustomizations, it says so and exits 77, which CTest reports as skipped."""
import copy
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
ADAPTER_RULES = os.path.join(K8S, "prometheus-adapter", "custom-rules.yaml")
MERGE_RULES = os.path.join(K8S, "prometheus-adapter", "merge-rules.py")
KUBE_PROMETHEUS_MIXIN = os.path.join(K8S, "kube-prometheus", "dcformer.libsonnet")
ALERTS = os.path.join(h.SOURCE_DIR, "deploy", "prometheus", "alerts.yml")
LOCAL_PROMETHEUS = os.path.join(h.SOURCE_DIR, "deploy", "prometheus", "prometheus.yml")
# kube-prometheus's manifests/prometheusAdapter-configMap.yaml, abridged: its labels and the
# resourceRules behind metrics.k8s.io, config.yaml as a literal block with no final newline.
KUBE_PROMETHEUS_ADAPTER_CONFIG = """apiVersion: v1
data:
  config.yaml: |-
    "resourceRules":
      "cpu":
        "containerLabel": "container"
        "containerQuery": |
          sum by (<<.GroupBy>>) (
            irate (
                container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!="",pod!=""}[120s]
            )
          )
        "resources":
          "overrides":
            "namespace":
              "resource": "namespace"
            "pod":
              "resource": "pod"
      "window": "5m"
kind: ConfigMap
metadata:
  labels:
    app.kubernetes.io/component: metrics-adapter
    app.kubernetes.io/name: prometheus-adapter
    app.kubernetes.io/part-of: kube-prometheus
  name: adapter-config
  namespace: monitoring
"""
# A stand-in for kube-prometheus's main.libsonnet with the structure dcformer.libsonnet relies
# on (components/prometheus.libsonnet: a Role and RoleBinding per entry of the hidden
# `namespaces` default, overridable from values.prometheus; components/
# prometheus-adapter.libsonnet: the hidden `config` default, rendered into the ConfigMap
# adapter-config). kube-prometheus itself is not vendored here.
KUBE_PROMETHEUS_STAND_IN = """
local prometheus(params) = {
  local p = self,
  _config:: { namespaces:: ['default', 'kube-system', params.namespace] } + params,
  roleBindingSpecificNamespaces: {
    items: [{ metadata: { name: 'prometheus-k8s', namespace: n } } for n in p._config.namespaces],
  },
};
local adapter(params) = {
  local pa = self,
  _config:: { config:: { resourceRules: { cpu: { containerQuery: 'cpu-query' } } } } + params,
  configMap: { data: { 'config.yaml': std.manifestYamlDoc(pa._config.config) } },
  service: { metadata: { name: 'prometheus-adapter', namespace: params.namespace } },
};
{
  values:: {
    common: { namespace: 'default' },
    prometheus: { namespace: $.values.common.namespace },
    prometheusAdapter: { namespace: $.values.common.namespace },
  },
  prometheus: prometheus($.values.prometheus),
  prometheusAdapter: adapter($.values.prometheusAdapter),
}
"""
NAMESPACE = "dcformer"
# docs/API.md, "Shutdown": the process exits within --drain-timeout + 2 s.
EXIT_MARGIN_S = 2
# Scheduling, attaching volumes and pulling an image, on top of a pod's startup budget,
# within a rollout's progress deadline.
ROLLOUT_MARGIN_S = 300
# The GPUs overlays/gpu/hpa-patch.yaml's maxReplicas stands for (deploy/README.md: set it to
# the GPUs you have).
GPUS = 8
# Kinds without a namespace among those the manifests could hold.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "RuntimeClass", "PriorityClass", "CustomResourceDefinition",
                  "APIService"}
PROBE_HANDLERS = ("exec", "grpc", "httpGet", "tcpSocket")


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


def enable_optional_components(tree):
    """Uncomments the optional `components:` block of each overlay's kustomization.yaml in a
    copy of deploy/kubernetes, as deploy/README.md tells operators to; returns how many
    components each overlay got."""
    counts = {}
    for overlay in ("cpu", "gpu"):
        path = os.path.join(tree, "overlays", overlay, "kustomization.yaml")
        with open(path) as f:
            text = f.read()
        text, n = re.subn(r"^# components:$", "components:", text, flags=re.M)
        assert n == 1, f"{path}: no commented components: block"
        text, counts[overlay] = re.subn(r"^#   - (\.\./\.\./components/\S+)", r"  - \1", text,
                                        flags=re.M)
        with open(path, "w") as f:
            f.write(text)
    return counts


# What an operator adds in an overlay's deployment-patch.yaml: a mesh annotation, a pod
# anti-affinity and a preferred node affinity. Components must merge with these, not replace
# the maps they sit in.
USER_ANNOTATIONS = {"sidecar.istio.io/inject": "true"}
USER_ANTI_AFFINITY = {"preferredDuringSchedulingIgnoredDuringExecution": [{
    "weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "dcformer-serve"}}}}]}
USER_PREFERRED_NODES = [{"weight": 50, "preference": {"matchExpressions": [
    {"key": "node.example.com/pool", "operator": "In", "values": ["inference"]}]}}]


def add_user_customisations(tree):
    for overlay in ("cpu", "gpu"):
        path = os.path.join(tree, "overlays", overlay, "deployment-patch.yaml")
        with open(path) as f:
            patch = yaml.safe_load(f)
        template = patch["spec"]["template"]
        template.setdefault("metadata", {})["annotations"] = dict(USER_ANNOTATIONS)
        template["spec"]["affinity"] = {
            "podAntiAffinity": USER_ANTI_AFFINITY,
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                             USER_PREFERRED_NODES}}
        with open(path, "w") as f:
            yaml.safe_dump(patch, f, sort_keys=False)


def startup_budget_s(probe):
    """The longest a startup probe lets a pod load: failureThreshold checks, each starting a
    period after the previous one or when it timed out, whichever is later."""
    return (probe.get("initialDelaySeconds", 0) + probe["failureThreshold"] *
            max(probe["periodSeconds"], probe.get("timeoutSeconds", 1)))


def rollout_deadline_needed_s(deployment):
    """What a rollout step can take before its new pod is Ready: the old pod's grace period
    (at maxReplicas the new pod gets its GPU only when an old one has ended), scheduling and
    the image pull, and the startup budget."""
    pod = deployment["spec"]["template"]["spec"]
    return (pod["terminationGracePeriodSeconds"] + ROLLOUT_MARGIN_S +
            startup_budget_s(pod["containers"][0]["startupProbe"]))


def gpus_needed(deployment, hpa):
    """GPUs a rollout at maxReplicas needs: one per replica, plus the surge pods that no
    stopped old pod makes room for."""
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    return hpa["spec"]["maxReplicas"] + max(0, rolling["maxSurge"] - rolling["maxUnavailable"])


def flags_of(config_map):
    """{flag: value} of the flagfiles of the dcformer-flags ConfigMap, in the order the
    Deployment reads them (later files win)."""
    out = {}
    for key in ("server.flags", "overlay.flags", "tls.flags", "http.flags"):
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
        # Every optional component, enabled in the overlays themselves, over an operator's own
        # customisations in the overlays' patches (which the components must keep).
        every = os.path.join(cls.tmp, "kubernetes")
        shutil.copytree(K8S, every, ignore=shutil.ignore_patterns("node_modules"))
        cls.components = enable_optional_components(every)
        add_user_customisations(every)
        # The same customisations with the components enabled in a kustomization around the
        # overlay (as for TLS above): the components then patch the overlay's output.
        custom = os.path.join(cls.tmp, "custom")
        shutil.copytree(K8S, custom, ignore=shutil.ignore_patterns("node_modules"))
        add_user_customisations(custom)
        wrapped = {}
        for overlay, components in (("cpu", ["scrape-annotations"]),
                                    ("gpu", ["scrape-annotations", "gpu-node-affinity"])):
            wrapped[overlay] = os.path.join(cls.tmp, f"{overlay}-wrapped")
            os.mkdir(wrapped[overlay])
            with open(os.path.join(wrapped[overlay], "kustomization.yaml"), "w") as f:
                f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                        f"resources:\n  - ../custom/overlays/{overlay}\ncomponents:\n" +
                        "".join(f"  - ../custom/components/{c}\n" for c in components))
        # deploy/README.md's alternative for a GPU kept free for rollouts: maxUnavailable: 0
        # in overlays/gpu/deployment-patch.yaml and maxReplicas the GPUs minus one.
        spare = os.path.join(cls.tmp, "spare-gpu")
        shutil.copytree(K8S, spare, ignore=shutil.ignore_patterns("node_modules"))
        for name, edit in (("deployment-patch.yaml", lambda o: o["spec"]["strategy"][
                "rollingUpdate"].update(maxUnavailable=0)),
                           ("hpa-patch.yaml", lambda o: o["spec"].update(
                               maxReplicas=o["spec"]["maxReplicas"] - 1))):
            path = os.path.join(spare, "overlays", "gpu", name)
            with open(path) as f:
                obj = yaml.safe_load(f)
            edit(obj)
            with open(path, "w") as f:
                yaml.safe_dump(obj, f, sort_keys=False)
        cls.built = {name: kustomize(path) for name, path in (
            ("cpu", os.path.join(K8S, "overlays", "cpu")),
            ("gpu", os.path.join(K8S, "overlays", "gpu")),
            ("gpu-tls", tls),
            ("cpu-every-component", os.path.join(every, "overlays", "cpu")),
            ("gpu-every-component", os.path.join(every, "overlays", "gpu")),
            ("gpu-spare-gpu", os.path.join(spare, "overlays", "gpu")),
            ("cpu-wrapped", wrapped["cpu"]),
            ("gpu-wrapped", wrapped["gpu"]),
            ("monitoring", os.path.join(K8S, "monitoring")),
            ("kube-prometheus", os.path.join(K8S, "kube-prometheus")))}
        cls.apps = {name: objects(text) for name, text in cls.built.items()
                    if name not in ("monitoring", "kube-prometheus")}

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
            p = c[probe]
            # Exactly one handler: a patch that adds one must remove the other.
            self.assertEqual([h for h in PROBE_HANDLERS if h in p], ["exec" if tls else "grpc"],
                             probe)
            if tls:
                cmd = p["exec"]["command"]
                self.assertEqual(cmd[:3], ["dcformer-cli", "health", "--tls"], probe)
                # The probe outlives its command's own timeout.
                own = next(a for a in cmd if a.startswith("--timeout="))
                self.assertGreater(p.get("timeoutSeconds", 1),
                                   duration_s(own.split("=", 1)[1]), probe)
            else:
                self.assertEqual(p["grpc"]["port"], 50051, probe)
                # Not the 1 s default: a busy replica may answer late.
                self.assertGreaterEqual(p.get("timeoutSeconds", 1), 2, probe)
        if tls:
            self.assertIn("--service=dcformer.v1.TextGeneration",
                          c["readinessProbe"]["exec"]["command"])
            self.assertEqual(flags["tls_cert"], "/etc/dcformer/tls/tls.crt")
            self.assertIn({"name": "tls", "secret": {"secretName": "dcformer-tls",
                                                     "defaultMode": 0o440}}, pod["volumes"])
        else:
            self.assertEqual(c["readinessProbe"]["grpc"]["service"],
                             "dcformer.v1.TextGeneration")
        # One slow check does not take a replica out of the endpoints.
        self.assertGreaterEqual(c["readinessProbe"].get("failureThreshold", 3), 3)
        # Drain: preStop delay + --drain-timeout + exit margin within the grace period. (The
        # kubelet stops liveness and startup probes of a pod being deleted, so they need not
        # outlast the drain.)
        pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
        drain = duration_s(flags["drain_timeout"])
        self.assertGreater(pod["terminationGracePeriodSeconds"],
                           pre_stop + drain + EXIT_MARGIN_S)
        # Rollouts: the progress deadline covers the startup budget, the old pod's grace
        # period and an image pull (the default, 600 s, does not). The startup probe's
        # period is no shorter than its timeout, so its budget is threshold x period, as the
        # manifests' comments say.
        start = c["startupProbe"]
        self.assertLessEqual(start.get("timeoutSeconds", 1), start["periodSeconds"])
        budget = startup_budget_s(start)
        self.assertGreaterEqual(d["spec"]["progressDeadlineSeconds"],
                                rollout_deadline_needed_s(d))
        rolling = d["spec"]["strategy"]["rollingUpdate"]
        self.assertEqual(rolling["maxSurge"], 1)
        # Requests and limits: the KV cache is sized from the memory limit.
        res = c["resources"]
        for key in ("cpu", "memory"):
            self.assertIn(key, res["requests"])
        self.assertIn("memory", res["limits"])
        if gpu:
            self.assertEqual(res["limits"]["nvidia.com/gpu"], 1)
            # cuda, not auto: a pod without a usable GPU fails instead of running on the CPU.
            self.assertEqual(flags["backend"], "cuda")
            self.assertTrue(flags["model"].startswith("/models/"))
            self.assertIn({"name": "models", "persistentVolumeClaim": {
                "claimName": "dcformer-models", "readOnly": True}}, pod["volumes"])
            self.assertIn(("PersistentVolumeClaim", "dcformer-models"), objs)
            self.assertTrue(any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]))
            # Long generations: a drain of minutes, not the base's 30 s.
            self.assertGreaterEqual(drain, 300)
            self.assertGreaterEqual(budget, 900)  # 15 minutes to load a large model
            # A rollout at maxReplicas needs no GPU the cluster lacks: as shipped, it frees
            # one (stops an old pod) for its surge pod; with maxUnavailable: 0, maxReplicas
            # must leave a spare one (deploy/README.md, "Upgrade").
            hpa = objs[("HorizontalPodAutoscaler", "dcformer-serve")]
            self.assertLessEqual(gpus_needed(d, hpa), GPUS)
        else:
            self.assertNotIn("nvidia.com/gpu", res["limits"])
            self.assertEqual(flags["model"], "/opt/dcformer/models/dcformer-kjv")
            self.assertEqual(flags["backend"], "cpu")
            # Zero downtime at full capacity: a new pod is Ready before an old one stops.
            self.assertEqual(rolling["maxUnavailable"], 0)
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
        return pod

    def test_overlays(self):
        for name, gpu, tls in (("cpu", False, False), ("gpu", True, False),
                               ("gpu-tls", True, True), ("cpu-every-component", False, True),
                               ("gpu-every-component", True, True),
                               ("gpu-spare-gpu", True, False)):
            with self.subTest(name):
                pod = self.check_deployment(self.apps[name], gpu, tls)
                annotations = self.apps[name][("Deployment", "dcformer-serve")]["spec"][
                    "template"]["metadata"].get("annotations", {})
                if name.endswith("every-component"):
                    self.assertEqual(annotations["prometheus.io/scrape"], "true")
                    self.assertEqual(annotations["prometheus.io/port"], "9090")
                else:
                    # The ServiceMonitor scrapes; annotations would scrape every pod twice.
                    self.assertFalse([a for a in annotations if a.startswith("prometheus.io/")])
                    self.assertNotIn("runtimeClassName", pod)
                    self.assertNotIn("affinity", pod)

    def test_optional_gpu_components(self):
        self.assertEqual(self.components, {"cpu": 3, "gpu": 5})
        pod = self.apps["gpu-every-component"][("Deployment", "dcformer-serve")]["spec"][
            "template"]["spec"]
        self.assertEqual(pod["runtimeClassName"], "nvidia")
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        # Compute capability 8.0 and up (what sm_80 code and PTX run on) and a driver of the
        # R580 branch or newer (what the CUDA 13 runtime needs).
        self.assertEqual(terms, [{"matchExpressions": [
            {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["7"]},
            {"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt",
             "values": ["579"]}]}])

    def test_inference_gateway_component(self):
        """components/inference-gateway: an InferencePool (inference.networking.k8s.io/v1,
        checked against its vendored CRD schema by the validator) selecting the server's pods
        on the port the server's --http-port opens, an endpoint picker reached where the pool
        says and pointed at metric names the server exports, and network rules that let the
        gateway and the picker in."""
        for build in ("cpu-every-component", "gpu-every-component"):
            with self.subTest(build):
                objs = self.apps[build]
                pool = objs[("InferencePool", "dcformer-serve")]
                self.assertEqual(pool["apiVersion"], "inference.networking.k8s.io/v1")
                self.assertEqual(pool["metadata"]["namespace"], "dcformer")
                server = objs[("Deployment", "dcformer-serve")]
                pod = server["spec"]["template"]
                for k, v in pool["spec"]["selector"]["matchLabels"].items():
                    self.assertEqual(pod["metadata"]["labels"].get(k), v, k)
                container = pod["spec"]["containers"][0]
                ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                (target,) = pool["spec"]["targetPorts"]
                self.assertEqual(target["number"], ports["http"])
                flag_maps = [o for (kind, name), o in objs.items()
                             if kind == "ConfigMap" and name.startswith("dcformer-flags")]
                (flags_map,) = flag_maps
                self.assertIn("--flagfile=/etc/dcformer/flags/http.flags", container["args"])
                self.assertEqual(int(flags_of(flags_map)["http_port"]), ports["http"])
                self.assertEqual(flags_of(flags_map)["http_host"], "0.0.0.0")
                # The picker: its Service is the pool's endpointPickerRef, its pool flags name
                # the pool, and its metric flags name what the server exports.
                ref = pool["spec"]["endpointPickerRef"]
                service = objs[("Service", ref["name"])]
                self.assertIn(ref["port"]["number"], [p["port"] for p in service["spec"]["ports"]])
                epp = objs[("Deployment", "dcformer-epp")]
                self.assertEqual(service["spec"]["selector"],
                                 epp["spec"]["template"]["metadata"]["labels"])
                args = dict(a[2:].split("=", 1) for a in
                            epp["spec"]["template"]["spec"]["containers"][0]["args"])
                self.assertEqual((args["pool-name"], args["pool-namespace"]),
                                 (pool["metadata"]["name"], "dcformer"))
                self.assertEqual(int(args["model-server-metrics-port"]), ports["metrics"])
                with open(os.path.join(h.SOURCE_DIR, "server", "metrics.cc")) as f:
                    exported = set(re.findall(r'"(dcformer_[a-z_]+)"', f.read()))
                for flag in ("total-queued-requests-metric", "total-running-requests-metric",
                             "kv-cache-usage-percentage-metric", "cache-info-metric"):
                    self.assertIn(args[flag], exported, flag)
                self.assertEqual(args["lora-info-metric"], "")
                volumes = {v["name"]: v for v in epp["spec"]["template"]["spec"]["volumes"]}
                config_name = volumes["config"]["configMap"]["name"]
                config = yaml.safe_load(objs[("ConfigMap", config_name)]["data"]["epp-config.yaml"])
                self.assertTrue(args["config-file"].endswith("/epp-config.yaml"))
                self.assertEqual(config["kind"], "EndpointPickerConfig")
                refs = [p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]]
                self.assertEqual(set(refs), {p["type"] for p in config["plugins"]} -
                                 {"single-profile-handler"})
                # The gateway reaches the HTTP port, the picker the metrics port.
                policy = objs[("NetworkPolicy", "dcformer-serve-gateway")]
                allowed = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
                self.assertIn("http", allowed)
                self.assertEqual(allowed["metrics"][0]["podSelector"]["matchLabels"],
                                 epp["spec"]["template"]["metadata"]["labels"])
        # The CRD schema catches what the API server would refuse.
        pool = copy.deepcopy(self.apps["cpu-every-component"][("InferencePool", "dcformer-serve")])
        pool["spec"]["endpointPickerRef"]["failureMode"] = "Closed"
        pool["spec"]["targetPort"] = 8000
        del pool["spec"]["selector"]
        code, out = validate(yaml.safe_dump(pool))
        self.assertEqual(code, 1, out)
        for needle in ("failureMode: must be one of", "/spec/targetPort: unknown field",
                       "/spec/selector: required"):
            self.assertIn(needle, out)

    def test_components_keep_the_operators_customisations(self):
        """The components add their keys to the pod's annotations and affinity: a mesh
        annotation, a pod anti-affinity and a preferred node affinity from the overlay's own
        patch survive them, whether the overlay lists the components or a kustomization
        around it does (then they patch the overlay's output)."""
        for name in ("cpu-every-component", "gpu-every-component", "cpu-wrapped",
                     "gpu-wrapped"):
            with self.subTest(name):
                template = self.apps[name][("Deployment", "dcformer-serve")]["spec"]["template"]
                annotations = template["metadata"]["annotations"]
                self.assertLessEqual(USER_ANNOTATIONS.items(), annotations.items())
                self.assertEqual(annotations["prometheus.io/scrape"], "true")
                affinity = template["spec"]["affinity"]
                self.assertEqual(affinity["podAntiAffinity"], USER_ANTI_AFFINITY)
                self.assertEqual(affinity["nodeAffinity"][
                    "preferredDuringSchedulingIgnoredDuringExecution"], USER_PREFERRED_NODES)
                if name.startswith("gpu"):
                    self.assertIn("requiredDuringSchedulingIgnoredDuringExecution",
                                  affinity["nodeAffinity"])

    def test_rollout_checks_catch_what_does_not_fit(self):
        """The deadline and GPU checks above fail on the manifests' known traps."""
        objs = self.apps["gpu"]
        d = objs[("Deployment", "dcformer-serve")]
        hpa = objs[("HorizontalPodAutoscaler", "dcformer-serve")]
        deadline = d["spec"]["progressDeadlineSeconds"]
        self.assertLessEqual(rollout_deadline_needed_s(d), deadline)
        # A 15-minute drain (--drain_timeout=900s, grace 930 s) without a longer deadline:
        # each rollout step then needs 930 + 300 + 900 s, more than 30 minutes.
        longer = copy.deepcopy(d)
        longer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 930
        self.assertGreater(rollout_deadline_needed_s(longer), deadline)
        # Checks that time out after their period: the budget is threshold x timeout.
        slow = copy.deepcopy(d)
        probe = slow["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        probe["timeoutSeconds"] = 2 * probe["periodSeconds"]
        self.assertEqual(startup_budget_s(probe),
                         probe["failureThreshold"] * probe["timeoutSeconds"])
        self.assertGreater(rollout_deadline_needed_s(slow), deadline)
        # maxUnavailable: 0 without lowering maxReplicas: the surge pod waits for a GPU that
        # does not exist.
        no_room = copy.deepcopy(d)
        no_room["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = 0
        self.assertGreater(gpus_needed(no_room, hpa), GPUS)
        spare = self.apps["gpu-spare-gpu"]
        self.assertEqual(gpus_needed(spare[("Deployment", "dcformer-serve")],
                                     spare[("HorizontalPodAutoscaler", "dcformer-serve")]), GPUS)

    def test_no_replica_count_under_the_autoscaler(self):
        # `kubectl apply -k` would reset the live count to it on every change.
        with open(os.path.join(K8S, "base", "deployment.yaml")) as f:
            self.assertNotIn("replicas", yaml.safe_load(f)["spec"])
        for name, objs in self.apps.items():
            with self.subTest(name):
                hpas = [o for (k, _), o in objs.items() if k == "HorizontalPodAutoscaler"]
                self.assertTrue(hpas)
                for hpa in hpas:
                    target = hpa["spec"]["scaleTargetRef"]
                    d = objs[(target["kind"], target["name"])]
                    self.assertNotIn("replicas", d["spec"])
                    self.assertGreaterEqual(hpa["spec"]["minReplicas"], 2)

    def test_every_namespaced_object_has_the_namespace(self):
        for name, text in self.built.items():
            with self.subTest(name):
                for (kind, obj_name), o in objects(text).items():
                    if kind in CLUSTER_SCOPED:
                        continue
                    self.assertEqual(o["metadata"].get("namespace"), NAMESPACE,
                                     f"{name}: {kind}/{obj_name}")
        for name in ("cpu", "gpu"):
            self.assertIn(("Namespace", NAMESPACE), self.apps[name])
        self.assertEqual(self.apps["gpu"][("PersistentVolumeClaim", "dcformer-models")][
            "metadata"]["namespace"], NAMESPACE)

    def test_services_budget_policy_autoscaler(self):
        objs = self.apps["gpu"]
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
        # A crash-looping pod does not hold up node drains.
        self.assertEqual(pdb["unhealthyPodEvictionPolicy"], "AlwaysAllow")
        policy = objs[("NetworkPolicy", "dcformer-serve")]["spec"]
        rules = {r["ports"][0]["port"]: r["from"] for r in policy["ingress"]}
        self.assertEqual(set(rules), {"grpc", "metrics"})
        # gRPC: client pods, and only in namespaces labelled for it (a pod can label itself,
        # not its namespace).
        self.assertEqual(rules["grpc"], [{
            "namespaceSelector": {"matchLabels": {"dcformer.io/clients": "true"}},
            "podSelector": {"matchLabels": {"dcformer.io/client": "true"}}}])
        # Metrics: the monitoring namespace or one labelled for it, nothing unscoped.
        self.assertEqual(rules["metrics"], [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
            {"namespaceSelector": {"matchLabels": {"dcformer.io/metrics": "true"}}}])
        # The HPA's custom metrics are the ones prometheus-adapter publishes; CPU is the
        # fallback.
        hpa = objs[("HorizontalPodAutoscaler", "dcformer-serve")]["spec"]
        pods_metrics = {m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"}
        self.assertEqual(pods_metrics, {"dcformer_num_requests_waiting",
                                        "dcformer_kv_cache_usage_perc"})
        self.assertIn("cpu", [m["resource"]["name"] for m in hpa["metrics"]
                              if m["type"] == "Resource"])
        with open(ADAPTER_RULES) as f:
            rules = yaml.safe_load(f)["rules"]
        self.assertEqual({r["name"]["as"] for r in rules}, pods_metrics)

    def test_adapter_rules_merge_into_an_existing_configuration(self):
        adapter = os.path.join(K8S, "prometheus-adapter")
        # Nothing here replaces the adapter's ConfigMap, whose resourceRules serve
        # metrics.k8s.io (kubectl top, CPU/memory HPAs) in kube-prometheus.
        self.assertEqual(sorted(os.listdir(adapter)), ["custom-rules.yaml", "merge-rules.py"])
        with open(ADAPTER_RULES) as f:
            rules = yaml.safe_load(f)
        self.assertEqual(list(rules), ["rules"])
        rules = rules["rules"]
        # merge-rules.py on kube-prometheus's manifest, in place, as deploy/README.md says.
        path = os.path.join(self.tmp, "prometheusAdapter-configMap.yaml")
        with open(path, "w") as f:
            f.write(KUBE_PROMETHEUS_ADAPTER_CONFIG)

        def merge():
            out = subprocess.run([sys.executable, MERGE_RULES, path], capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(path) as f:
                return f.read()

        before = yaml.safe_load(KUBE_PROMETHEUS_ADAPTER_CONFIG)
        merged_text = merge()
        merged = yaml.safe_load(merged_text)
        # The object keeps its name, namespace and labels (kubectl apply of a `create
        # configmap` output would drop them).
        self.assertEqual(merged["metadata"], before["metadata"])
        config = yaml.safe_load(merged["data"]["config.yaml"])
        self.assertEqual(config["resourceRules"],
                         yaml.safe_load(before["data"]["config.yaml"])["resourceRules"])
        self.assertEqual(config["rules"], rules)
        # Again: nothing changes (no rule twice).
        self.assertEqual(merge(), merged_text)
        # Rules of other metrics stay; an older version of ours is replaced.
        config["rules"] = [dict(rules[0], metricsQuery="old"),
                           {"seriesQuery": "other", "name": {"as": "other_metric"}}]
        merged["data"]["config.yaml"] = yaml.safe_dump(config)
        with open(path, "w") as f:
            yaml.safe_dump(merged, f)
        config = yaml.safe_load(yaml.safe_load(merge())["data"]["config.yaml"])
        self.assertEqual([r["name"]["as"] for r in config["rules"]],
                         ["other_metric"] + [r["name"]["as"] for r in rules])
        self.assertEqual(config["rules"][1:], rules)
        # The live object, through stdin and stdout.
        out = subprocess.run([sys.executable, MERGE_RULES, "-"], capture_output=True, text=True,
                             input=KUBE_PROMETHEUS_ADAPTER_CONFIG, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(yaml.safe_load(out.stdout), yaml.safe_load(merged_text))

    def test_kube_prometheus_gets_discovery_and_the_custom_metrics_api(self):
        """What kube-prometheus lacks: its Prometheus (ServiceAccount monitoring/prometheus-k8s)
        may discover the ServiceMonitor's targets in dcformer, and prometheus-adapter serves
        the custom metrics API the HPA reads, which the HPA controller may read."""
        objs = objects(self.built["kube-prometheus"])
        sm = objects(self.built["monitoring"])[("ServiceMonitor", "dcformer-serve")]
        role = objs[("Role", "prometheus-k8s")]
        self.assertEqual(role["metadata"]["namespace"],
                         sm["spec"]["namespaceSelector"]["matchNames"][0])
        granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"] if {"list", "watch"} <= set(rule["verbs"])}
        self.assertLessEqual({("", "services"), ("", "endpoints"), ("", "pods"),
                              ("discovery.k8s.io", "endpointslices")}, granted)
        binding = objs[("RoleBinding", "prometheus-k8s")]
        self.assertEqual(binding["metadata"]["namespace"], role["metadata"]["namespace"])
        self.assertEqual(binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io",
                                              "kind": "Role", "name": "prometheus-k8s"})
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount",
                                                "name": "prometheus-k8s",
                                                "namespace": "monitoring"}])
        api = objs[("APIService", "v1beta1.custom.metrics.k8s.io")]["spec"]
        self.assertEqual((api["group"], api["version"]), ("custom.metrics.k8s.io", "v1beta1"))
        self.assertEqual(api["service"], {"name": "prometheus-adapter", "namespace": "monitoring"})
        hpa_binding = objs[("ClusterRoleBinding", "hpa-controller-custom-metrics")]
        self.assertEqual(hpa_binding["subjects"], [{"kind": "ServiceAccount",
                                                    "name": "horizontal-pod-autoscaler",
                                                    "namespace": "kube-system"}])
        cluster_role = objs[("ClusterRole", hpa_binding["roleRef"]["name"])]
        self.assertTrue(any(r["apiGroups"] == ["custom.metrics.k8s.io"] and "get" in r["verbs"]
                            for r in cluster_role["rules"]))

    def test_kube_prometheus_jsonnet_mixin(self):
        """dcformer.libsonnet, added to a kube-prometheus build (here a stand-in with its
        structure), puts dcformer in Prometheus's namespaces, appends the rules to the
        adapter's configuration (its resourceRules kept) and adds the kustomization's
        objects, pointed at the adapter's namespace."""
        jsonnet = shutil.which("jsonnet")
        if jsonnet is None:
            self.skipTest("jsonnet is not installed (scripts/setup.sh)")
        stand_in = os.path.join(self.tmp, "kube-prometheus-stand-in.libsonnet")
        with open(stand_in, "w") as f:
            f.write(KUBE_PROMETHEUS_STAND_IN)
        program = os.path.join(self.tmp, "build.jsonnet")
        with open(program, "w") as f:
            f.write(f"""
local kp = (import {json.dumps(stand_in)}) + (import {json.dumps(KUBE_PROMETHEUS_MIXIN)}) +
           {{ values+:: {{ common+: {{ namespace: 'observability' }} }} }};
{{
  namespaces: [i.metadata.namespace for i in kp.prometheus.roleBindingSpecificNamespaces.items],
  config: kp.prometheusAdapter.configMap.data['config.yaml'],
  adapter: {{ [k]: kp.prometheusAdapter[k] for k in std.objectFields(kp.prometheusAdapter) }},
}}""")
        out = subprocess.run([jsonnet, program], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        kp = json.loads(out.stdout)
        self.assertEqual(kp["namespaces"], ["default", "kube-system", "observability", NAMESPACE])
        config = yaml.safe_load(kp["config"])
        self.assertEqual(config["resourceRules"], {"cpu": {"containerQuery": "cpu-query"}})
        with open(ADAPTER_RULES) as f:
            self.assertEqual(config["rules"], yaml.safe_load(f)["rules"])
        # The kustomization's cluster-wide objects, the APIService aimed at this adapter.
        want = objects(self.built["kube-prometheus"])
        got = {(o["kind"], o["metadata"]["name"]): o for o in kp["adapter"].values()
               if "kind" in o}
        api = want[("APIService", "v1beta1.custom.metrics.k8s.io")]
        api["spec"]["service"]["namespace"] = "observability"
        for key in (("APIService", "v1beta1.custom.metrics.k8s.io"),
                    ("ClusterRole", "custom-metrics-server-resources"),
                    ("ClusterRoleBinding", "hpa-controller-custom-metrics")):
            self.assertEqual(got[key], want[key], key)

    def test_alerts_know_the_scrape_job(self):
        """DcformerNoTargets looks for the job the ServiceMonitor's targets get: with no
        jobLabel, the Prometheus Operator names the job after the Service (dcformer-serve);
        prometheus.yml, for a server outside Kubernetes, uses the same name."""
        sm = objects(self.built["monitoring"])[("ServiceMonitor", "dcformer-serve")]["spec"]
        self.assertNotIn("jobLabel", sm)
        services = [n for (k, n), o in self.apps["gpu"].items() if k == "Service" and
                    sm["selector"]["matchLabels"].items() <= o["metadata"]["labels"].items()]
        self.assertEqual(services, ["dcformer-serve"])
        with open(ALERTS) as f:
            rules = {r["alert"]: r for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
        job = re.search(r'absent\(up\{job="([^"]+)"\}\)', rules["DcformerNoTargets"]["expr"])
        self.assertEqual(job.group(1), services[0])
        with open(LOCAL_PROMETHEUS) as f:
            self.assertIn(services[0], [c["job_name"] for c in yaml.safe_load(f)["scrape_configs"]])

    def test_monitoring_targets_the_service(self):
        objs = objects(self.built["monitoring"])
        app = self.apps["gpu"]
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
