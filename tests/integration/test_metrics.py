"""/metrics values against a known workload (parsed with prometheus_client's text parser),
and a real Prometheus server scraping the endpoint."""
import unittest

import grpc

import harness as h
from harness import pb

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


class PrefixCacheTest(unittest.TestCase):
    """Prefix caching seen from a client: usage.cached_tokens, the metrics, GetModelInfo,
    the startup line, cache_salt isolation, and --noprefix-caching."""

    PROMPT = [3 + (i * 37) % 250 for i in range(40)]  # 2 full blocks of 16 + 8 tokens

    def run_three(self, server):
        stub = server.stub()
        results = []
        for salt in ("", "", "tenant-x"):
            tokens, final = h.collect(stub.Generate(
                h.ids_request(self.PROMPT, 5, cache_salt=salt), timeout=60))
            results.append((tokens, final.usage.cached_tokens))
        return results

    def test_repeated_prompt_hits_and_salts_isolate(self):
        with h.Server() as server:
            info = server.stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            self.assertTrue(info.prefix_caching)
            (t1, c1), (t2, c2), (t3, c3) = self.run_three(server)
            self.assertEqual((c1, c2, c3), (0, 32, 0))
            self.assertEqual(t1, t2)
            self.assertEqual(t1, t3)
            m = server.metrics()
            get = lambda name, **labels: m.get((name, frozenset(labels.items())))
            self.assertEqual(get("dcformer_prefix_cache_queries_total"), 3 * len(self.PROMPT))
            self.assertEqual(get("dcformer_prefix_cache_hits_total"), 32)
            self.assertGreaterEqual(get("dcformer_prefix_cache_blocks", layer_group="global"), 4)
            self.assertEqual(get("dcformer_prefix_cache_evictions_total", layer_group="global"), 0)
            self.assertEqual(get("dcformer_kv_cache_blocks_used", layer_group="global"), 0)
            self.assertIn("prefix caching on", server.read_log())

    def test_noprefix_caching_turns_it_off(self):
        with h.Server(args=["--noprefix-caching"]) as server:
            info = server.stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            self.assertFalse(info.prefix_caching)
            results = self.run_three(server)
            self.assertEqual([c for _, c in results], [0, 0, 0])
            m = server.metrics()
            get = lambda name, **labels: m.get((name, frozenset(labels.items())))
            self.assertEqual(get("dcformer_prefix_cache_queries_total"), 0)
            self.assertEqual(get("dcformer_prefix_cache_blocks", layer_group="global"), 0)
            self.assertIn("prefix caching off", server.read_log())


class SpeculationTest(unittest.TestCase):
    """A server speculating (--spec-tokens) answers what a plain one answers, and counts
    its drafts (the counters were once never registered: the first verify step crashed)."""

    # The default model's greedy continuation of this prompt falls into a loop (130 130 ...)
    # after 24 tokens: drafts of it are accepted.
    PROMPT = [3 + (i * 37) % 250 for i in range(40)]

    def generate(self, server, seed=None, usage=None, **kw):
        req = h.ids_request(self.PROMPT, 64, greedy=seed is None, **kw)
        if seed is not None:
            req.sampling.temperature = 0.9
            req.sampling.seed = seed
        tokens, final = h.collect(server.stub().Generate(req, timeout=60))
        if usage is not None:
            usage.append(final.usage)
        return tokens

    def test_spec_tokens_same_output_and_counted(self):
        seeded = dict(seed=7)
        plain_usage, usage, opted_out_usage = [], [], []
        with h.Server() as plain:
            want = [self.generate(plain, usage=plain_usage),
                    self.generate(plain, usage=plain_usage, **seeded)]
        # A step budget given, not measured: the tiny default model's measured one may leave
        # no room for drafts on a loaded machine.
        with h.Server(args=["--spec-tokens", "4", "--spec-step-tokens", "64"]) as server:
            got = [self.generate(server, usage=usage),
                   self.generate(server, usage=usage, **seeded)]
            opted_out = self.generate(server, usage=opted_out_usage, no_speculation=True)
            m = server.metrics()
            get = lambda name: m.get((name, frozenset()))
            drafted = get("dcformer_spec_drafted_tokens_total")
            accepted = get("dcformer_spec_accepted_tokens_total")
            self.assertGreater(drafted, 0)
            self.assertGreater(accepted, 0)
            self.assertLessEqual(accepted, drafted)
            self.assertGreater(get("dcformer_spec_accepted_length_count"), 0)
            # Each request's usage says what was drafted and accepted for it; the counters
            # are their sums.
            self.assertEqual(sum(u.draft_tokens for u in usage), drafted)
            self.assertEqual(sum(u.accepted_draft_tokens for u in usage), accepted)
            self.assertGreater(usage[0].accepted_draft_tokens, 0)  # the greedy loop
            for u in plain_usage + opted_out_usage:
                self.assertEqual((u.draft_tokens, u.accepted_draft_tokens), (0, 0))
            # Per token, also when a verify step emits a run at once.
            self.assertEqual(h.sum_series(m, "dcformer_inter_token_latency_seconds_count"),
                             sum(len(t) - 1 for t in got + [opted_out]))
        self.assertEqual(got, want)
        self.assertEqual(opted_out, want[0])


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
