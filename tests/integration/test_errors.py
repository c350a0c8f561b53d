"""Invalid requests, each with its gRPC status code and a message naming the field; a model
whose weights hold NaN."""
import json
import os
import shutil
import struct
import tempfile
import unittest

import grpc

import harness as h

pb = h.pb
OK_IDS = [5, 6, 7]


def req(**kw):
    r = h.ids_request(OK_IDS, 4)
    for path, value in kw.items():
        msg = r
        parts = path.split("__")
        for p in parts[:-1]:
            msg = getattr(msg, p)
        setattr(msg, parts[-1], value)
    return r


def with_stop_strings(r, strings):
    r.stopping.stop_strings.extend(strings)
    return r


def with_stop_ids(r, ids):
    r.stopping.stop_token_ids.extend(ids)
    return r


CASES = [
    # (name, request, code, text expected in the message)
    ("no prompt", pb.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ("empty token ids", pb.GenerateRequest(token_ids=pb.TokenIds()),
     grpc.StatusCode.INVALID_ARGUMENT, "prompt_tokens"),
    ("empty text", pb.GenerateRequest(text=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ("unknown token id", h.ids_request([5, 300], 4), grpc.StatusCode.INVALID_ARGUMENT,
     "prompt_tokens[1]: token id 300"),
    ("negative token id", h.ids_request([-1], 4), grpc.StatusCode.INVALID_ARGUMENT,
     "prompt_tokens[0]"),
    ("text without tokenizer", pb.GenerateRequest(text="hello"),
     grpc.StatusCode.INVALID_ARGUMENT, "prompt.text"),
    ("negative temperature", req(sampling__temperature=-1.0), grpc.StatusCode.INVALID_ARGUMENT,
     "sampling.temperature"),
    ("nan temperature", req(sampling__temperature=float("nan")),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling.temperature"),
    ("top_p zero", req(sampling__top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p"),
    ("top_p above one", req(sampling__top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT,
     "sampling.top_p"),
    ("negative top_k", req(sampling__top_k=-3), grpc.StatusCode.INVALID_ARGUMENT,
     "sampling.top_k"),
    ("min_p above one", req(sampling__min_p=2.0), grpc.StatusCode.INVALID_ARGUMENT,
     "sampling.min_p"),
    ("zero repetition penalty", req(sampling__repetition_penalty=0.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling.repetition_penalty"),
    ("presence penalty", req(sampling__presence_penalty=3.0), grpc.StatusCode.INVALID_ARGUMENT,
     "sampling.presence_penalty"),
    ("frequency penalty", req(sampling__frequency_penalty=-2.5),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling.frequency_penalty"),
    ("zero max_new_tokens", req(stopping__max_new_tokens=0), grpc.StatusCode.INVALID_ARGUMENT,
     "stopping.max_new_tokens"),
    ("stop token outside vocab", with_stop_ids(req(), [1000]), grpc.StatusCode.INVALID_ARGUMENT,
     "stopping.stop_token_ids[0]"),
    ("stop strings without tokenizer", with_stop_strings(req(), ["x"]),
     grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_strings"),
    ("top_logprobs too large", req(output__top_logprobs=21), grpc.StatusCode.INVALID_ARGUMENT,
     "output.top_logprobs"),
    ("return_text without tokenizer", req(output__return_text=True),
     grpc.StatusCode.INVALID_ARGUMENT, "output.text"),
    ("request id too long", req(request_id="x" * 200), grpc.StatusCode.INVALID_ARGUMENT,
     "request_id: must be at most 128 bytes, got 200"),
    ("request id with a space", req(request_id="my id"), grpc.StatusCode.INVALID_ARGUMENT,
     "request_id: must be printable ASCII without spaces (byte 2)"),
    ("prompt + max_new_tokens beyond context", h.ids_request(OK_IDS, 254),
     grpc.StatusCode.OUT_OF_RANGE, "max_new_tokens"),
    ("prompt longer than the context", h.ids_request([5] * 300, 1),
     grpc.StatusCode.OUT_OF_RANGE, ""),
]


class ErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(args=["--max-receive-message-bytes=4096"]).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def test_invalid_requests(self):
        stub = self.server.stub()
        for name, request, code, needle in CASES:
            with self.subTest(case=name):
                with self.assertRaises(grpc.RpcError) as ctx:
                    h.collect(stub.Generate(request, timeout=30))
                self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
                self.assertIn(needle, ctx.exception.details())
        # Every rejection is counted under its code (when the call is done on the server, which
        # may be just after the client has its status); the server is still healthy.
        def counted():
            m = self.server.metrics()
            return sum(v for (n, labels), v in m.items() if n == "dcformer_requests_total"
                       and dict(labels)["outcome"] in ("invalid_argument", "out_of_range"))
        h.wait_until(lambda: counted() == len(CASES), what="every rejection counted")
        self.assertEqual(self.server.check_health(), h.SERVING)

    def test_unparseable_bytes_are_invalid_argument_and_counted(self):
        # Raw bytes (no serializer): what a broken or hostile client can put on the wire.
        generate = f"/{h.SERVICE}/Generate"
        tokenize = f"/{h.SERVICE}/Tokenize"
        bad = b"ok\xc3"  # "ok" and the first byte of a two-byte character
        stopping = b"\x12\x00" + b"\x12" + bytes([len(bad)]) + bad  # stop_strings: "", bad
        cases = [
            # text = "Hello \xff\xfe \xc3": invalid UTF-8 in a proto3 string
            (generate, bytes.fromhex("120a48656c6c6f20fffe20c3"), "prompt.text: is not valid UTF-8 (byte 6)"),
            # not protobuf at all
            (generate, bytes.fromhex("ffffffff0f"), "not a valid dcformer.v1.GenerateRequest"),
            # token_ids { ids: 5 }, then stopping { stop_strings: "", stop_strings: bad }
            (generate, bytes.fromhex("1a020805") + b"\x2a" + bytes([len(stopping)]) + stopping,
             "stopping.stop_strings[1]: is not valid UTF-8 (byte 2)"),
            (tokenize, bytes.fromhex("0a0648698080fffe"), "text: is not valid UTF-8 (byte 2)"),
        ]
        before = self.server.metric("dcformer_requests_total", outcome="invalid_argument")
        with self.server.channel() as ch:
            for method, body, needle in cases:
                with self.subTest(body=body.hex()):
                    with self.assertRaises(grpc.RpcError) as ctx:
                        if method == generate:
                            list(ch.unary_stream(method)(body, timeout=30))
                        else:
                            ch.unary_unary(method)(body, timeout=30)
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                    self.assertIn(needle, ctx.exception.details())
            # A client that closes its side without sending the request message at all.
            with self.assertRaises(grpc.RpcError) as ctx:
                list(ch.stream_stream(generate)(iter([]), timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("no request message", ctx.exception.details())
        # Counted when the call is done on the server, which may be just after the client
        # has its status.
        h.wait_until(lambda: self.server.metric("dcformer_requests_total",
                                                outcome="invalid_argument") == before + 4,
                     what="the rejected Generate calls counted")
        h.wait_until(lambda: self.server.metric("dcformer_unary_requests_total", method="Tokenize",
                                                outcome="invalid_argument") == 1,
                     what="the rejected Tokenize call counted")
        self.assertEqual(self.server.check_health(), h.SERVING)

    def test_oversize_message_rejected(self):
        stub = self.server.stub()
        big = h.ids_request([299] * 2500, 1)  # ~5 KB of varints > --max-receive-message-bytes
        self.assertGreater(big.ByteSize(), 4096)
        with self.assertRaises(grpc.RpcError) as ctx:
            h.collect(stub.Generate(big, timeout=30))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        tokens, _ = h.collect(stub.Generate(h.ids_request(OK_IDS, 2), timeout=30))
        self.assertEqual(len(tokens), 2)

    def test_tokenizer_rpcs_without_tokenizer(self):
        stub = self.server.stub()
        for call, request in ((stub.Tokenize, pb.TokenizeRequest(text="hi")),
                              (stub.Detokenize, pb.DetokenizeRequest(token_ids=[1]))):
            with self.assertRaises(grpc.RpcError) as ctx:
                call(request, timeout=30)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_unset_differs_from_zero(self):
        # Unset max_new_tokens takes the server default (clipped to the context), while an
        # explicit 0 is rejected (see CASES); unset temperature samples, 0 is greedy.
        stub = self.server.stub()
        r = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 250))
        r.sampling.temperature = 0
        r.stopping.ignore_eos = True
        tokens, final = h.collect(stub.Generate(r, timeout=60))
        self.assertEqual(len(tokens), 6)  # 256 - 250
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)


class QueueLimitTest(unittest.TestCase):
    def test_prompt_beyond_the_queue_token_bound_is_out_of_range_on_an_idle_server(self):
        # Issue 24: such a prompt can never be queued, so "RESOURCE_EXHAUSTED ... retry later"
        # would be a lie; OUT_OF_RANGE is docs/API.md's code for requests that cannot succeed.
        with h.Server(args=["--max-queued-prompt-tokens=8"]) as server:
            stub = server.stub()
            with self.assertRaises(grpc.RpcError) as ctx:
                h.collect(stub.Generate(h.ids_request([5] * 9, 2), timeout=30))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.OUT_OF_RANGE)
            self.assertEqual(ctx.exception.details(),
                             "prompt_tokens: 9 tokens exceed the waiting queue's limit of 8 "
                             "prompt tokens (max_queued_prompt_tokens): this prompt can never "
                             "be queued")
            tokens, _ = h.collect(stub.Generate(h.ids_request([5] * 8, 2), timeout=30))
            self.assertEqual(len(tokens), 2)
            h.wait_until(lambda: server.metric("dcformer_requests_total",
                                               outcome="out_of_range") == 1,
                         what="the rejection counted as out_of_range")


def corrupt_copy(model_dir, out_dir, tensor="layers.1.attention.wo.weight"):
    """A copy of an F32 safetensors model with every 7th entry of `tensor` set to NaN."""
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    with open(path, "r+b") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(header_len))[tensor]
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        nan = struct.pack("<f", float("nan"))
        for k in range(6, (end - begin) // 4, 7):
            f.seek(8 + header_len + begin + 4 * k)
            f.write(nan)
    return out_dir


class NonFiniteWeightsTest(unittest.TestCase):
    """NaN in one wo (as a corrupted checkpoint had): requests end INTERNAL with a message that
    says the logits are not finite, never with silent tokens, and are counted; the server
    stays up; --check-weights refuses the checkpoint at startup, naming the tensor."""

    def test_nonfinite_logits_end_the_request(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = corrupt_copy(h.SHORT_MODEL, os.path.join(tmp, "model"))
            # Without warm-up: the warm-up request would fail the same way and stop the start.
            with h.Server(model=model, args=["--nowarmup"]) as server:
                for greedy in (True, False):
                    with self.assertRaises(grpc.RpcError) as ctx:
                        h.collect(server.stub().Generate(
                            h.ids_request(OK_IDS, 4, greedy=greedy), timeout=30))
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.INTERNAL)
                    self.assertIn("not finite (NaN or infinity)", ctx.exception.details())
                h.wait_until(lambda: server.metric("dcformer_nonfinite_logits_total") == 2,
                             what="both requests counted")
                self.assertEqual(server.check_health(), h.SERVING)
            server = h.Server(model=model, args=["--check-weights"], ready=False)
            with server:
                self.assertEqual(server.proc.wait(timeout=120), 1)
                self.assertIn("tensor 'layers.1.attention.wo.weight' holds", server.read_log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
