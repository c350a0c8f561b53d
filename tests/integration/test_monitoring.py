"""The monitoring pieces of deploy/, run for real: promtool checks the Prometheus config and
unit-tests the alert rules; then a real Prometheus scrapes a real dcformer-server under load
(labelled namespace/pod as the ServiceMonitor's targets are) and runs every query of the
Grafana dashboard, its variables, prometheus-adapter's rules and the alert rules. A query that
Prometheus rejects, or that returns nothing, fails."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import unittest

import yaml

import harness as h

DEPLOY = os.path.join(h.SOURCE_DIR, "deploy")
ALERTS = os.path.join(DEPLOY, "prometheus", "alerts.yml")
DASHBOARD = os.path.join(DEPLOY, "kubernetes", "monitoring", "dcformer-dashboard.json")
ADAPTER = os.path.join(DEPLOY, "kubernetes", "prometheus-adapter", "custom-rules.yaml")
RULE_CR = os.path.join(DEPLOY, "kubernetes", "monitoring", "prometheusrule.yaml")
NAMESPACE, POD = "dcformer", "dcformer-serve-7d9f-abcde"
# What Grafana puts in for the dashboard's variables with this pod selected. The rate window
# stands for $__rate_interval: at least four 1 s scrapes.
VARIABLES = {"$namespace": NAMESPACE, "$pod": POD, "$__rate_interval": "15s"}


def promtool():
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.path.exists(path):
        raise unittest.SkipTest("promtool not installed (scripts/setup.sh)")
    return path


def dashboard_queries():
    """(panel title, expr) of every panel target."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def substitute(expr, variables):
    for name, value in variables.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable in {expr!r}"
    return expr


class PromtoolTest(unittest.TestCase):
    def test_prometheus_config_is_valid(self):
        out = subprocess.run([promtool(), "check", "config",
                              os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("12 rules found", out.stdout + out.stderr)

    def test_alert_rules_unit_tests(self):
        out = subprocess.run([promtool(), "test", "rules",
                              os.path.join(DEPLOY, "prometheus", "alerts_test.yml")],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_every_alert_has_a_unit_test(self):
        """Each alert has a case where it fires and one where it stays silent (a healthy
        pattern, or its own pattern before the `for` duration)."""
        with open(ALERTS) as f:
            alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
        with open(os.path.join(DEPLOY, "prometheus", "alerts_test.yml")) as f:
            cases = [t for case in yaml.safe_load(f)["tests"] for t in case["alert_rule_test"]]
        self.assertEqual(alerts, {t["alertname"] for t in cases if t["exp_alerts"]})
        self.assertEqual(alerts, {t["alertname"] for t in cases if not t["exp_alerts"]})

    def test_prometheus_operator_rules_equal_the_rules_file(self):
        with open(ALERTS) as f:
            groups = yaml.safe_load(f)["groups"]
        with open(RULE_CR) as f:
            rule = yaml.safe_load(f)
        self.assertEqual(rule["kind"], "PrometheusRule")
        self.assertEqual(rule["spec"]["groups"], groups)


class LoadingStateTest(unittest.TestCase):
    """DcformerReplicaNotServing and DcformerReplicaNotLoaded tell a loading replica from a
    loaded one that does not serve by dcformer_engine_loop_alive: a real server reports 0
    while its model loads (held there by a config.json FIFO), 1 once loaded."""

    def test_engine_loop_gauge_tells_loading_from_loaded(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        fifo = os.path.join(tmp, "config.json")
        os.mkfifo(fifo)
        os.symlink(os.path.join(h.SHORT_MODEL, "model.safetensors"),
                   os.path.join(tmp, "model.safetensors"))
        with h.Server(model=tmp, ready=False) as server:
            def scrape():
                try:
                    return server.metrics()
                except OSError:
                    return None  # the metrics endpoint is not up yet
            loading = h.wait_until(scrape, timeout=60, what="the metrics endpoint")
            self.assertEqual(loading[("dcformer_serving", frozenset())], 0)
            self.assertEqual(loading[("dcformer_engine_loop_alive", frozenset())], 0)
            with open(os.path.join(h.SHORT_MODEL, "config.json")) as src, open(fifo, "w") as dst:
                dst.write(src.read())
            server.wait_serving()
            self.assertEqual(server.metric("dcformer_serving"), 1)
            self.assertEqual(server.metric("dcformer_engine_loop_alive"), 1)


class QueriesTest(unittest.TestCase):
    """Everything the dashboard, the adapter and the alerts ask Prometheus, against a server
    under load."""

    @classmethod
    def setUpClass(cls):
        promtool()  # skips without Prometheus's tools
        cls.server = h.Server().__enter__()
        try:
            cls.prom = h.Prometheus([(f"127.0.0.1:{cls.server.metrics_port}",
                                      {"namespace": NAMESPACE, "pod": POD})],
                                    job="dcformer-serve", rule_files=[ALERTS]).__enter__()
        except BaseException:
            cls.server.__exit__(None, None, None)
            raise
        # Load for the whole class: finished requests of several outcomes (length, eos,
        # cancelled by deadline, invalid) so that rates and histograms have data.
        cls.stop = threading.Event()
        cls.loader = threading.Thread(target=cls.load, daemon=True)
        cls.loader.start()

    @classmethod
    def load(cls):
        import grpc
        with cls.server.channel() as ch:
            stub = h.pb_grpc.TextGenerationStub(ch)
            i = 0
            while not cls.stop.is_set():
                i += 1
                try:
                    if i % 10 == 0:
                        h.collect(stub.Generate(h.ids_request([999999], 2), timeout=30))
                    else:
                        h.collect(stub.Generate(h.ids_request([5, 6, 7, i % 200], 8 + i % 8),
                                                timeout=30))
                except grpc.RpcError:
                    pass  # the invalid request is meant to fail

    @classmethod
    def tearDownClass(cls):
        cls.stop.set()
        cls.loader.join(timeout=60)
        cls.prom.__exit__(None, None, None)
        cls.server.__exit__(None, None, None)

    def wait_for_results(self, queries):
        """Polls until every (name, expr) returns a non-empty result; fails naming the ones
        that stay empty. A rejected query fails at once."""
        empty = {}

        def all_answer():
            empty.clear()
            for name, expr in queries:
                if not self.prom.query(expr):
                    empty[name] = expr
            return not empty

        try:
            h.wait_until(all_answer, timeout=90, what="every query to return data")
        except AssertionError:
            self.fail("queries that returned nothing:\n" +
                      "\n".join(f"  {n}: {e}" for n, e in empty.items()))

    def test_dashboard_queries(self):
        queries = [(title, substitute(expr, VARIABLES)) for title, expr in dashboard_queries()]
        self.assertGreaterEqual(len(queries), 12)
        self.wait_for_results(queries)
        # The queries are written for the "All" selection too.
        every = dict(VARIABLES, **{"$namespace": ".*", "$pod": ".*"})
        self.wait_for_results([(title, substitute(expr, every))
                               for title, expr in dashboard_queries()])

    def test_dashboard_variables(self):
        with open(DASHBOARD) as f:
            variables = {v["name"]: v for v in json.load(f)["templating"]["list"]}
        expected = {"namespace": NAMESPACE, "pod": POD}
        for name, value in expected.items():
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["definition"])
            self.assertIsNotNone(m, variables[name]["definition"])
            selector = substitute(m.group(1), {"$namespace": NAMESPACE})
            h.wait_until(lambda: value in self.prom.api(
                f"label/{m.group(2)}/values", **{"match[]": selector}).get("data", []),
                timeout=60, what=f"variable {name} to list {value}")

    def test_adapter_rules(self):
        with open(ADAPTER) as f:
            rules = yaml.safe_load(f)["rules"]
        self.assertEqual(len(rules), 2)
        for rule in rules:
            with self.subTest(rule["name"]["as"]):
                # The series it discovers, with the labels it maps to pod and namespace.
                def discover():
                    found = self.prom.api("series", **{"match[]": rule["seriesQuery"]})
                    self.assertEqual(found["status"], "success", found)
                    return found["data"]

                series = h.wait_until(discover, timeout=60,
                                      what=f"series for {rule['seriesQuery']}")[0]
                self.assertTrue(re.fullmatch(rule["name"]["matches"], series["__name__"]))
                for label, target in rule["resources"]["overrides"].items():
                    self.assertIn(label, series)
                    self.assertIn(target["resource"], ("namespace", "pod"))
                # The query it sends for the HPA, as the adapter renders it.
                query = (rule["metricsQuery"]
                         .replace("<<.Series>>", series["__name__"])
                         .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{POD}"')
                         .replace("<<.GroupBy>>", "pod"))
                result = self.prom.query(query)
                self.assertEqual([r["metric"] for r in result], [{"pod": POD}], query)

    def test_alert_rules_evaluate(self):
        with open(ALERTS) as f:
            names = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}

        def evaluated():
            groups = self.prom.api("rules")["data"]["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            done = set(rules) == names and all(
                not r["lastEvaluation"].startswith("0001") for r in rules.values())
            return rules if done else None

        rules = h.wait_until(evaluated, timeout=60, what="Prometheus to evaluate the alerts")
        for name, rule in rules.items():
            self.assertEqual(rule["health"], "ok", f"{name}: {rule.get('lastError')}")
        # A healthy server under light load raises none of them, once Prometheus has scraped
        # it (before its first scrape DcformerNoTargets is rightly pending).
        states = {}

        def quiet():
            states.update({n: r["state"] for n, r in (evaluated() or {}).items()})
            return all(state == "inactive" for state in states.values())

        try:
            h.wait_until(quiet, timeout=30, what="every alert to be inactive")
        except AssertionError:
            self.fail(f"alerts not inactive: {states}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
