"""/metrics values against a known workload (parsed with prometheus_client's text parser),
and a real Prometheus server scraping the endpoint."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest
import urllib.parse
import urllib.request

import grpc

import harness as h

WORKLOAD = [([5, 6, 7], 4), ([8, 9, 10, 11, 12], 6), ([13, 14, 15, 16, 17, 18, 19], 8)]


class MetricsTest(unittest.TestCase):
    def test_metrics_match_workload(self):
        with h.Server() as server:
            stub = server.stub()
            for prompt, n in WORKLOAD:
                tokens, final = h.collect(stub.Generate(h.ids_request(prompt, n), timeout=60))
                self.assertEqual(len(tokens), n)
            with self.assertRaises(grpc.RpcError):
                h.collect(stub.Generate(h.ids_request([999], 1), timeout=60))
            m = server.metrics()
            get = lambda name, **labels: m.get((name, frozenset(labels.items())))
            self.assertEqual(get("dcformer_requests_total", outcome="length"), 3)
            self.assertEqual(get("dcformer_requests_total", outcome="invalid_argument"), 1)
            self.assertEqual(get("dcformer_requests_total", outcome="cancelled"), 0)
            self.assertEqual(get("dcformer_prompt_tokens_total"), sum(len(p) for p, _ in WORKLOAD))
            self.assertEqual(get("dcformer_generation_tokens_total"), sum(n for _, n in WORKLOAD))
            for hist in ("dcformer_time_to_first_token_seconds",
                         "dcformer_e2e_request_latency_seconds",
                         "dcformer_request_queue_time_seconds"):
                self.assertEqual(get(hist + "_count"), 3, hist)
                self.assertGreater(get(hist + "_sum"), 0, hist)
                self.assertEqual(get(hist + "_bucket", le="+Inf"), 3, hist)
            self.assertIsNotNone(get("dcformer_time_to_first_token_seconds_bucket", le="0.001"))
            self.assertEqual(get("dcformer_inter_token_latency_seconds_count"),
                             sum(n - 1 for _, n in WORKLOAD))
            steps = get("dcformer_engine_steps_total")
            self.assertGreaterEqual(steps, max(n for _, n in WORKLOAD))
            self.assertEqual(get("dcformer_batch_size_count"), steps)
            self.assertEqual(get("dcformer_engine_step_duration_seconds_count"), steps)
            self.assertEqual(get("dcformer_num_requests_running"), 0)
            self.assertEqual(get("dcformer_num_requests_waiting"), 0)
            self.assertEqual(get("dcformer_kv_cache_usage_perc"), 0)
            self.assertEqual(get("dcformer_num_preemptions_total"), 0)
            self.assertEqual(get("dcformer_serving"), 1)
            for group in ("global", "window"):
                self.assertEqual(get("dcformer_kv_cache_blocks_used", layer_group=group), 0)
                self.assertGreater(get("dcformer_kv_cache_blocks_total", layer_group=group), 0)


class PrometheusScrapeTest(unittest.TestCase):
    def test_prometheus_scrapes_counter(self):
        prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not os.path.exists(prometheus):
            self.skipTest("prometheus binary not installed")
        tmp = tempfile.mkdtemp()
        prom = None
        try:
            with h.Server() as server:
                with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                    f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                            "scrape_configs:\n  - job_name: dcformer\n    static_configs:\n"
                            f"      - targets: ['127.0.0.1:{server.metrics_port}']\n")
                web = h.free_port()
                prom = subprocess.Popen(
                    [prometheus, f"--config.file={tmp}/prometheus.yml",
                     f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{web}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for prompt, n in WORKLOAD[:2]:
                    h.collect(server.stub().Generate(h.ids_request(prompt, n), timeout=60))

                def query(expr):
                    url = (f"http://127.0.0.1:{web}/api/v1/query?"
                           + urllib.parse.urlencode({"query": expr}))
                    try:
                        with urllib.request.urlopen(url, timeout=5) as r:
                            result = json.load(r)["data"]["result"]
                    except OSError:
                        return None  # not up yet
                    return float(result[0]["value"][1]) if result else None

                h.wait_until(lambda: query('dcformer_requests_total{outcome="length"}') == 2,
                             timeout=60, what="Prometheus to scrape the request counter")
                self.assertEqual(query('up{job="dcformer"}'), 1)
                self.assertEqual(query("dcformer_generation_tokens_total"), 10)
                self.assertEqual(query("dcformer_num_requests_running"), 0)
        finally:
            if prom is not None:
                prom.terminate()
                prom.wait(timeout=30)
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(verbosity=2)
