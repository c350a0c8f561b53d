// dcformer-serve in a kube-prometheus jsonnet build (kube-prometheus's own way of customising
// it): add this after main.libsonnet and build as usual, e.g.
//   local kp = (import 'kube-prometheus/main.libsonnet') +
//              (import 'PATH/TO/dcformer-serve/deploy/kubernetes/kube-prometheus/dcformer.libsonnet') +
//              { values+:: { common+: { namespace: 'monitoring' } } };
// It
// - adds the namespace dcformer to values.prometheus.namespaces: kube-prometheus then gives
//   Prometheus its Role and RoleBinding prometheus-k8s there (the ServiceMonitor's targets);
// - appends the rules of ../prometheus-adapter/custom-rules.yaml to
//   values.prometheusAdapter.config.rules: the ConfigMap adapter-config keeps its
//   resourceRules (metrics.k8s.io), and every later build and apply keeps the rules;
// - adds this folder's custom metrics APIService and the HPA controller's ClusterRole and
//   binding to prometheusAdapter, under the field names addons/custom-metrics.libsonnet
//   uses, so that with that addon too each object is rendered once.
// The files are read from this checkout (importstr is relative to this file). CI evaluates it
// against a stand-in with kube-prometheus's structure (tests/integration/test_kubernetes.py).
{
  values+:: {
    prometheus+: { namespaces+: ['dcformer'] },
    prometheusAdapter+: {
      config+:: { rules+: std.parseYaml(importstr '../prometheus-adapter/custom-rules.yaml').rules },
    },
  },
  prometheusAdapter+: {
    customMetricsApiService: std.parseYaml(importstr 'custom-metrics-apiservice.yaml') + {
      spec+: { service+: {
        name: $.prometheusAdapter.service.metadata.name,
        namespace: $.values.prometheusAdapter.namespace,
      } },
    },
    customMetricsClusterRoleServerResources: std.parseYaml(importstr 'custom-metrics-clusterrole.yaml'),
    customMetricsClusterRoleBindingHPA: std.parseYaml(importstr 'custom-metrics-clusterrolebinding.yaml'),
  },
}
