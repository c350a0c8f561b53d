"""/metrics values against a known workload (parsed with prometheus_client's text parser),
and a real Prometheus server scraping the endpoint."""
import unittest

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
            get = lambda name, **labels: h.sum_series(m, name, **labels)
            self.assertEqual(get("dcformer_requests_total", outcome="length"), 3)
            self.assertEqual(get("dcformer_requests_total", outcome="invalid_argument"), 1)
            self.assertEqual(get("dcformer_requests_total", outcome="cancelled"), 0)
            # Every request came over gRPC.
            self.assertEqual(get("dcformer_requests_total", outcome="length", protocol="grpc"), 3)
            self.assertEqual(get("dcformer_generation_tokens_total", protocol="http"), 0)
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
        with h.Server() as server, \
                h.Prometheus([(f"127.0.0.1:{server.metrics_port}", {})]) as prom:
            for prompt, n in WORKLOAD[:2]:
                h.collect(server.stub().Generate(h.ids_request(prompt, n), timeout=60))
            h.wait_until(lambda: prom.value('sum(dcformer_requests_total{outcome="length"})') == 2,
                         timeout=60, what="Prometheus to scrape the request counter")
            self.assertEqual(prom.value('up{job="dcformer"}'), 1)
            self.assertEqual(prom.value("sum(dcformer_generation_tokens_total)"), 10)
            self.assertEqual(prom.value("dcformer_num_requests_running"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
