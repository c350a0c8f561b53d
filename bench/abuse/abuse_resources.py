"""Resource use of dcformer-server under the abuse cases of docs/API.md, "Security": RSS (and
its peak), threads and CPU of the server process before and after each attack, and what the
attacking client saw. Prints numbers; asserts nothing (the bounds are asserted, with margin,
by tests/integration/test_abuse.py).

  PYTHONPATH=build/python /usr/bin/python3 bench/abuse/abuse_resources.py CASE... \
      [--binary build/bin/dcformer-server] [--args="--flag=value ..."]

Cases: gzip (GZ_N bombs of GZ_MIB MiB), watch, watch_multi, reflection (N streams; needs
--args=--reflection on a current server), reflection_multi, continuation (CONT_MIB MiB of
CONTINUATION frames), continuation2 (many small headers), window0 (3000 streams of a
client that never reads; HOLD seconds), text (100 prompts of 1 MiB; TEXT=a for one word),
metrics (scrapes while a partial request is open), fd (400 connections under a 200-file
limit). Environment: DCF_BIN_DIR as for the integration tests."""
import os, sys, time, socket, struct, subprocess, threading, json, tempfile, argparse
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "integration"))
import harness as h
import h2probe as hp

def proc_stats(pid):
    st = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, v = line.split(":", 1)
            st[k] = v.strip()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return {"rss_mib": int(st["VmRSS"].split()[0]) / 1024, "hwm_mib": int(st["VmHWM"].split()[0]) / 1024,
            "threads": int(st["Threads"]), "cpu_s": cpu}

def fmt(s): return f"RSS {s['rss_mib']:.0f} MiB (peak {s['hwm_mib']:.0f}), threads {s['threads']}, CPU {s['cpu_s']:.2f} s"

GEN = "/dcformer.v1.TextGeneration/Generate"

def report(name, before, after, extra=""):
    print(f"{name}: before {fmt(before)}; after {fmt(after)} {extra}", flush=True)

def case_gzip(server, n=int(os.environ.get("GZ_N", 4)), inflated=int(os.environ.get("GZ_MIB", 1024)) << 20):
    bomb = hp.gzip_bomb(inflated)
    body = hp.grpc_message(bomb, compressed=True)
    pid = server.proc.pid
    before = proc_stats(pid)
    t0 = time.monotonic()
    with hp.H2Client(server.port, timeout=300) as c:
        for _ in range(n):
            c.start_call(GEN, body, metadata=[("grpc-encoding", "gzip")])
            print("  sent one", time.monotonic() - t0, fmt(proc_stats(pid)), flush=True)
        c.pump_until(c.all_ended, 300, "gzip calls ended")
        codes = sorted({(x.status, (x.message or "")[:60]) for x in c.calls.values()})
    after = proc_stats(pid)
    report(f"gzip x{n} ({len(bomb)/1e3:.0f} KB -> {inflated>>20} MiB)", before, after, f"{codes} {time.monotonic()-t0:.1f}s")

def case_streams(server, path, body, n, end_stream, hold=float(os.environ.get("HOLD", 3))):
    pid = server.proc.pid
    before = proc_stats(pid)
    with hp.H2Client(server.port) as c:
        ok = 0
        for i in range(n):
            try:
                c.start_call(path, body, end_stream=end_stream)
                ok += 1
            except Exception as e:
                print("  start failed at", i, type(e).__name__, e); break
            if i % 500 == 0: c.pump(0.01)
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline: c.pump(0.2)
        peak = proc_stats(pid)
        ended = sum(1 for x in c.calls.values() if x.ended)
        codes = {}
        for x in c.calls.values():
            if x.ended: codes[(x.status, x.reset)] = codes.get((x.status, x.reset), 0) + 1
    time.sleep(2)
    after = proc_stats(pid)
    report(f"{path} x{n}", before, peak, f"| after close {fmt(after)} | opened {ok}, ended {ended} {codes}")

def case_continuation(server, total=int(os.environ.get("CONT_MIB", 90)) << 20):
    pid = server.proc.pid
    before = proc_stats(pid)
    c = hp.H2Client(server.port)
    enc = __import__("hpack").Encoder()
    block = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", GEN), (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    # a literal header whose value never ends: name "x-flood", value length = total
    def varint(n, prefix_bits, first):
        maxp = (1 << prefix_bits) - 1
        if n < maxp: return bytes([first | n])
        out = [first | maxp]; n -= maxp
        while n >= 128: out.append((n & 127) | 128); n >>= 7
        out.append(n); return bytes(out)
    lit = b"\x00" + varint(7, 7, 0) + b"x-flood" + varint(total, 7, 0)
    c.sock.sendall(hp.raw_frame(hp.HEADERS, 0, 1, block + lit))
    chunk = b"a" * 16384
    sent = 0; closed_at = None
    t0 = time.monotonic()
    c.sock.settimeout(30)
    rx = b""; goaway = None
    try:
        while sent < total:
            c.sock.sendall(hp.raw_frame(hp.CONTINUATION, 0, 1, chunk))
            sent += len(chunk)
            if sent % (1 << 20) == 0:
                c.sock.setblocking(False)
                try:
                    d = c.sock.recv(1 << 16)
                    if d == b"": closed_at = ("eof", sent, round(time.monotonic()-t0, 1)); break
                    rx += d
                    if goaway is None and b"\x07" in rx:
                        # crude frame walk
                        i = 0
                        while i + 9 <= len(rx):
                            ln = int.from_bytes(rx[i:i+3], "big"); ty = rx[i+3]
                            if ty == 7: goaway = (sent, round(time.monotonic()-t0, 1)); break
                            i += 9 + ln
                except BlockingIOError: pass
                finally: c.sock.settimeout(30)
    except OSError as e:
        closed_at = (type(e).__name__, sent, round(time.monotonic()-t0, 1))
    print("  goaway:", goaway)
    peak = proc_stats(pid)
    c.close()
    time.sleep(2)
    after = proc_stats(pid)
    report(f"CONTINUATION flood {total>>20} MiB", before, peak, f"| closed by server after {closed_at} bytes | {time.monotonic()-t0:.1f}s | after close {fmt(after)}")

def case_continuation_headers(server, total=90 << 20):
    """many small distinct headers across CONTINUATION frames"""
    pid = server.proc.pid
    before = proc_stats(pid)
    c = hp.H2Client(server.port)
    import hpack
    enc = hpack.Encoder()
    block = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", GEN), (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    c.sock.sendall(hp.raw_frame(hp.HEADERS, 0, 1, block))
    sent = 0; closed_at = None; i = 0
    t0 = time.monotonic()
    c.sock.settimeout(30)
    try:
        while sent < total:
            payload = b"".join(b"\x00\x08x-h%06d\x40" % (j % 1000000) + b"b" * 64 for j in range(i, i + 200))
            i += 200
            c.sock.sendall(hp.raw_frame(hp.CONTINUATION, 0, 1, payload))
            sent += len(payload)
    except OSError as e:
        closed_at = sent
    peak = proc_stats(pid)
    c.close(); time.sleep(2)
    after = proc_stats(pid)
    report(f"CONTINUATION small-headers flood {total>>20} MiB", before, peak, f"| closed after {closed_at} | {time.monotonic()-t0:.1f}s | after close {fmt(after)}")

def gen_body(ids, n, request_id=""):
    req = h.ids_request(ids, n, request_id=request_id)
    return hp.grpc_message(req.SerializeToString())

def case_window0(server, n=3000):
    pid = server.proc.pid
    before = proc_stats(pid)
    t0 = time.monotonic()
    with hp.H2Client(server.port, initial_window=0, read_data=False) as c:
        for i in range(n):
            c.start_call(GEN, gen_body([5, 6, 7], 16))
            if i % 200 == 0: c.pump(0.01)
        # wait for the engine to finish them all
        h.wait_until(lambda: server.metric("dcformer_num_requests_running") == 0 and server.metric("dcformer_num_requests_waiting") == 0, timeout=300)
        end = time.monotonic() + float(os.environ.get("HOLD", 5))
        while time.monotonic() < end: c.pump(0.2)
        peak = proc_stats(pid)
        ended = sum(1 for x in c.calls.values() if x.ended)
        codes = {}
        for x in c.calls.values():
            if x.ended: codes[(x.status, x.reset)] = codes.get((x.status, x.reset), 0) + 1
    time.sleep(2)
    after = proc_stats(pid)
    report(f"window-0 client x{n}", before, peak, f"| after close {fmt(after)} | ended {ended} {codes} {time.monotonic()-t0:.1f}s")

def case_text(server, n=100):
    import grpc
    pid = server.proc.pid
    stub = server.stub()
    text = "a" * ((1 << 20) - 100) if os.environ.get("TEXT") == "a" else ("And God said, Let there be light. " * 40000)[: (1 << 20) - 64]
    # concurrent stream TTFT
    def ttft():
        t = time.monotonic()
        it = stub.Generate(h.ids_request([5, 6, 7], 4), timeout=60)
        next(it); d = time.monotonic() - t
        for _ in it: pass
        return d
    base = min(ttft() for _ in range(3))
    before = proc_stats(pid)
    results = {}
    import concurrent.futures
    def one(_):
        req = h.pb.GenerateRequest(text=text); req.stopping.max_new_tokens = 4
        try:
            h.collect(stub.Generate(req, timeout=120)); return "ok"
        except grpc.RpcError as e: return e.code().name
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futs = [pool.submit(one, i) for i in range(n)]
        time.sleep(0.3)
        during = ttft()
        for f in futs: results[f.result()] = results.get(f.result(), 0) + 1
    after = proc_stats(pid)
    report(f"text prompts 1 MiB x{n}", before, after, f"| codes {results} | concurrent TTFT {base*1e3:.1f} -> {during*1e3:.1f} ms | server CPU {after['cpu_s']-before['cpu_s']:.2f} s")

def case_metrics_partial(server):
    import urllib.request
    s = socket.create_connection(("127.0.0.1", server.metrics_port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
    lat = []
    for i in range(5):
        t = time.monotonic()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=40).read()
            lat.append(round(time.monotonic() - t, 2))
        except Exception as e:
            lat.append(type(e).__name__)
    s.close()
    print("metrics scrape latencies with one partial request open:", lat, flush=True)

def case_fd(binary):
    import resource
    port, mport = h.free_ports(2)
    log = open(FD_LOG, "w")
    p = subprocess.Popen([binary, f"--model={h.SHORT_MODEL}", f"--port={port}", f"--metrics-port={mport}", "--kv-cache-bytes=16000000"] + EXTRA,
                         stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)),
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    srv = h.Server.__new__(h.Server); srv.port = port; srv.metrics_port = mport; srv.proc = p; srv.tls_ca = None
    srv.log = log
    srv.read_log = lambda: open(FD_LOG).read()
    srv.wait_serving()
    socks = []
    for i in range(400):
        try: socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError as e: print("connect failed", i, e); break
    time.sleep(2)
    for s in socks: s.close()
    time.sleep(2)
    import grpc
    try:
        code = srv.check_health(); print("health after:", code)
    except grpc.RpcError as e: print("health after: RPC error", e.code())
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end and p.poll() is None:
        try: print("  serving metric", srv.metric("dcformer_serving"))
        except Exception as e: print("  metrics", e)
        time.sleep(5)
    print("exit code:", p.poll())
    p.kill(); p.wait()

EXTRA = []
FD_LOG = os.path.join(tempfile.gettempdir(), "abuse_resources_fd.log")


def case_multi(server, path, body, conns, per, end_stream, hold=5):
    pid = server.proc.pid
    before = proc_stats(pid)
    clients = []
    for k in range(conns):
        c = hp.H2Client(server.port)
        for i in range(per):
            c.start_call(path, body, end_stream=end_stream)
        c.pump(0.01)
        clients.append(c)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        for c in clients: c.pump(0.05)
    peak = proc_stats(pid)
    codes = {}
    for c in clients:
        for x in c.calls.values():
            key = (x.status, x.reset) if x.ended else "open"
            codes[key] = codes.get(key, 0) + 1
    for c in clients: c.close()
    time.sleep(2)
    after = proc_stats(pid)
    report(f"{path} {conns} connections x {per}", before, peak, f"| after close {fmt(after)} | {codes}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=h.SERVER)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--args", default="")
    a = ap.parse_args()
    args = [x for x in a.args.split(" ") if x]
    EXTRA[:] = args
    for case in a.cases:
        if case == "fd":
            case_fd(a.binary); continue
        model = h.SHORT_MODEL if case != "text" else os.path.join(h.SOURCE_DIR, "models", "dcformer-kjv")
        with h.Server(binary=a.binary, args=args, model=model) as server:
            if case == "gzip": case_gzip(server)
            elif case == "reflection": case_streams(server, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", hp.grpc_message(b"\x3a\x00"), int(os.environ.get("N", 20000)), False)
            elif case == "watch": case_streams(server, "/grpc.health.v1.Health/Watch", hp.grpc_message(b""), 10000, True)
            elif case == "continuation": case_continuation(server)
            elif case == "continuation2": case_continuation_headers(server)
            elif case == "window0": case_window0(server)
            elif case == "reflection_multi": case_multi(server, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", hp.grpc_message(b"\x3a\x00"), 20, 250, False)
            elif case == "watch_multi": case_multi(server, "/grpc.health.v1.Health/Watch", hp.grpc_message(b""), 40, 250, True)
            elif case == "text": case_text(server)
            elif case == "metrics": case_metrics_partial(server)
            print("  server alive:", server.proc.poll() is None, flush=True)

