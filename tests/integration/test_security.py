"""API keys (Bearer metadata) and TLS / mTLS accept and reject cases; validation of the TLS
files and reloads of the TLS files and the API keys (a bad reload keeps the last good ones)."""
import datetime
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

import harness as h

PROMPT = [5, 6, 7]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d):
    """A CA, a server cert for localhost/127.0.0.1, a client cert, and an unrelated CA."""
    make_server_cert(d, "ca", "server", cas=("ca", "other-ca"))
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key",
            "-out", "client.csr", "-subj", "/CN=client", cwd=d)
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "client.pem", "-extfile", "client.ext", cwd=d)


def make_server_cert(d, ca, name, cas=()):
    """Self-signed CAs `cas`, then `name`.pem/.key for localhost/127.0.0.1 signed by `ca`."""
    for c in cas:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", f"{c}.key", "-out", f"{c}.pem", "-subj", f"/CN={c}", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", "server.ext",
            cwd=d)


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def serves_on_new_connection(server, credentials):
    """Whether a health check over a fresh connection (so that it sees the certificate in
    force now) succeeds; a failure must be the handshake's UNAVAILABLE."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    try:
        with grpc.secure_channel(server.target, credentials, options=options) as ch:
            h.health_pb2_grpc.HealthStub(ch).Check(h.health_pb2.HealthCheckRequest(), timeout=5)
        return True
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False


class ApiKeyTest(unittest.TestCase):
    def test_api_key(self):
        tmp = tempfile.mkdtemp()
        try:
            key_file = os.path.join(tmp, "keys")
            with open(key_file, "w") as f:
                f.write("# rotated keys\nold-key-123\nsecret-key-456\n")
            with h.Server(args=[f"--api-key-file={key_file}"]) as server:
                stub = server.stub()
                cases = [([], grpc.StatusCode.UNAUTHENTICATED),
                         ([("authorization", "Bearer wrong")], grpc.StatusCode.UNAUTHENTICATED),
                         ([("authorization", "secret-key-456")], grpc.StatusCode.UNAUTHENTICATED),
                         ([("authorization", "Bearer secret-key-456")], None),
                         ([("authorization", "Bearer old-key-123")], None)]
                for metadata, code in cases:
                    with self.subTest(metadata=metadata):
                        call = lambda: h.collect(stub.Generate(h.ids_request(PROMPT, 2),
                                                               metadata=metadata, timeout=30))
                        if code is None:
                            self.assertEqual(len(call()[0]), 2)
                        else:
                            with self.assertRaises(grpc.RpcError) as ctx:
                                call()
                            self.assertEqual(ctx.exception.code(), code)
                with self.assertRaises(grpc.RpcError) as ctx:
                    stub.GetModelInfo(h.pb.GetModelInfoRequest(), timeout=30)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                # Health stays open for probes.
                self.assertEqual(server.check_health(), h.SERVING)
                # The CLI reads the key from a file.
                out = subprocess.run([h.CLI, "info", f"--target={server.target}",
                                      f"--api-key-file={key_file}"],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                out = subprocess.run([h.CLI, "info", f"--target={server.target}"],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 1)
                self.assertIn("UNAUTHENTICATED", out.stderr)
                self.assertEqual(server.metric("dcformer_requests_total",
                                               outcome="unauthenticated"), 3)
                log = server.read_log()
            self.assertNotIn("secret-key-456", log)
            self.assertNotIn("old-key-123", log)
        finally:
            shutil.rmtree(tmp)


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.mkdtemp()
        make_pki(cls.pki)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.pki)

    def generate(self, server, credentials):
        with grpc.secure_channel(server.target, credentials) as ch:
            return h.collect(h.pb_grpc.TextGenerationStub(ch).Generate(
                h.ids_request(PROMPT, 2), timeout=10))

    def test_tls(self):
        d = self.pki
        args = [f"--tls-cert={d}/server.pem", f"--tls-key={d}/server.key"]
        with h.Server(args=args, tls_ca=f"{d}/ca.pem") as server:
            tokens, _ = self.generate(server, grpc.ssl_channel_credentials(read(d, "ca.pem")))
            self.assertEqual(len(tokens), 2)
            with self.subTest(client="untrusted CA"):
                with self.assertRaises(grpc.RpcError) as ctx:
                    self.generate(server, grpc.ssl_channel_credentials(read(d, "other-ca.pem")))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.subTest(client="plaintext"):
                with grpc.insecure_channel(server.target) as ch:
                    with self.assertRaises(grpc.RpcError) as ctx:
                        h.collect(h.pb_grpc.TextGenerationStub(ch).Generate(
                            h.ids_request(PROMPT, 2), timeout=10))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.subTest(client="dcformer-cli"):
                out = subprocess.run([h.CLI, "generate", f"--target=localhost:{server.port}",
                                      f"--tls-ca={d}/ca.pem", "--prompt-ids=5,6",
                                      "--max-new-tokens=2"],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)

    def test_mutual_tls(self):
        d = self.pki
        args = [f"--tls-cert={d}/server.pem", f"--tls-key={d}/server.key",
                f"--tls-client-ca={d}/ca.pem"]
        with h.Server(args=args, tls_ca=f"{d}/ca.pem", ready=False) as server:
            with_cert = grpc.ssl_channel_credentials(read(d, "ca.pem"), read(d, "client.key"),
                                                     read(d, "client.pem"))
            with grpc.secure_channel(server.target, with_cert) as ch:
                health = h.health_pb2_grpc.HealthStub(ch)
                watch = health.Watch(h.health_pb2.HealthCheckRequest(), wait_for_ready=True,
                                     timeout=60)
                for msg in watch:
                    if msg.status == h.SERVING:
                        break
                watch.cancel()
            tokens, _ = self.generate(server, with_cert)
            self.assertEqual(len(tokens), 2)
            with self.subTest(client="no client certificate"):
                with self.assertRaises(grpc.RpcError) as ctx:
                    self.generate(server, grpc.ssl_channel_credentials(read(d, "ca.pem")))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.subTest(client="dcformer-cli with client cert"):
                out = subprocess.run([h.CLI, "health", f"--target=localhost:{server.port}",
                                      f"--tls-ca={d}/ca.pem", f"--tls-cert={d}/client.pem",
                                      f"--tls-key={d}/client.key"],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual((out.returncode, out.stdout.strip()), (0, "SERVING"),
                                 out.stderr)


class TlsReloadTest(unittest.TestCase):
    def test_rotated_certificate_is_served_without_restart(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        make_server_cert(d, "ca", "server", cas=("ca", "new-ca"))
        make_server_cert(d, "new-ca", "rotated")
        live_cert, live_key = os.path.join(d, "live.pem"), os.path.join(d, "live.key")
        shutil.copy(os.path.join(d, "server.pem"), live_cert)
        shutil.copy(os.path.join(d, "server.key"), live_key)
        old_trust = grpc.ssl_channel_credentials(read(d, "ca.pem"))
        new_trust = grpc.ssl_channel_credentials(read(d, "new-ca.pem"))

        serves = serves_on_new_connection

        args = [f"--tls-cert={live_cert}", f"--tls-key={live_key}", "--tls-reload-interval=1s"]
        with h.Server(args=args, tls_ca=os.path.join(d, "ca.pem")) as server:
            pid = server.proc.pid
            self.assertTrue(serves(server, old_trust))
            self.assertFalse(serves(server, new_trust))
            # An open connection made before the rotation.
            before = grpc.secure_channel(server.target, old_trust,
                                         options=[("grpc.use_local_subchannel_pool", 1)])
            self.addCleanup(before.close)
            stub = h.pb_grpc.TextGenerationStub(before)
            self.assertEqual(len(h.collect(stub.Generate(h.ids_request(PROMPT, 2),
                                                         timeout=10))[0]), 2)
            # Rotate as a Secret update does: new files swapped in by rename.
            for name, live in (("rotated.key", live_key), ("rotated.pem", live_cert)):
                shutil.copy(os.path.join(d, name), live + ".tmp")
                os.replace(live + ".tmp", live)
            h.wait_until(lambda: serves(server, new_trust), timeout=30,
                         what="the rotated certificate served")
            self.assertFalse(serves(server, old_trust))
            self.assertEqual(server.proc.pid, pid)  # same process: no restart
            self.assertIsNone(server.proc.poll())
            # Existing connections keep working.
            self.assertEqual(len(h.collect(stub.Generate(h.ids_request(PROMPT, 2),
                                                         timeout=10))[0]), 2)

    def test_unreadable_tls_files_fail_startup(self):
        out = subprocess.run([h.SERVER, "--tls-cert=/nonexistent.pem", "--tls-key=/nonexistent.key",
                              f"--port={h.free_port()}", "--metrics-port=0"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn("--tls-cert", out.stderr)


def write(path, data):
    """Replaces `path` as a Secret update does: a new file renamed over the old one."""
    with open(path + ".tmp", "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def make_expired_cert(d, name):
    """`name`.pem/.key: a self-signed certificate for 127.0.0.1 that expired yesterday."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=3))
            .not_valid_after(now - datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    with open(os.path.join(d, f"{name}.pem"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(os.path.join(d, f"{name}.key"), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


class TlsValidationTest(unittest.TestCase):
    """Bad TLS material is refused at startup, and a bad reload keeps the last good pair."""

    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.mkdtemp()
        make_server_cert(cls.pki, "ca", "server", cas=("ca",))
        make_server_cert(cls.pki, "ca", "other")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.pki)

    def start(self, cert, key):
        return subprocess.run([h.SERVER, f"--tls-cert={cert}", f"--tls-key={key}",
                               f"--model={h.SHORT_MODEL}", f"--port={h.free_port()}",
                               "--metrics-port=0"], capture_output=True, text=True, timeout=60)

    def test_a_key_of_another_certificate_fails_startup(self):
        d = self.pki
        out = self.start(f"{d}/server.pem", f"{d}/other.key")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("--tls-key: the private key is not the key of the --tls-cert certificate",
                      out.stderr)
        self.assertNotIn("listening", out.stderr)
        garbage = os.path.join(d, "garbage.pem")
        with open(garbage, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
        out = self.start(garbage, f"{d}/server.key")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("--tls-cert: no usable PEM certificate", out.stderr)

    def test_an_expired_certificate_is_warned_about(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        make_expired_cert(d, "expired")
        with h.Server(args=[f"--tls-cert={d}/expired.pem", f"--tls-key={d}/expired.key"],
                      ready=False) as server:
            h.wait_until(lambda: "listening" in server.read_log(), what="the server listening")
            self.assertIn("expired at", server.read_log())

    def test_bad_reloads_keep_the_last_good_pair(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        make_server_cert(d, "ca", "server", cas=("ca",))
        make_server_cert(d, "ca", "rotated")
        make_server_cert(d, "ca", "other")
        live_cert, live_key = os.path.join(d, "live.pem"), os.path.join(d, "live.key")
        shutil.copy(os.path.join(d, "server.pem"), live_cert)
        shutil.copy(os.path.join(d, "server.key"), live_key)
        trust = grpc.ssl_channel_credentials(read(d, "ca.pem"))

        handshake_ok = lambda server: serves_on_new_connection(server, trust)

        args = [f"--tls-cert={live_cert}", f"--tls-key={live_key}", "--tls-reload-interval=1s"]
        with h.Server(args=args, tls_ca=os.path.join(d, "ca.pem")) as server:
            self.assertTrue(handshake_ok(server))
            failures = lambda: server.metric("dcformer_credential_reload_failures_total",
                                             file="tls")
            for bad in ("garbage", "mismatched", "deleted"):
                with self.subTest(reload=bad):
                    before = failures()
                    if bad == "garbage":
                        write(live_key, "garbage\n")
                    elif bad == "mismatched":
                        write(live_key, read(d, "other.key"))
                    else:
                        os.unlink(live_key)
                    h.wait_until(lambda: failures() >= before + 2, timeout=30,
                                 what="two failed reloads counted")
                    # Both the server's and gRPC's reloads have run since: the old pair serves.
                    self.assertTrue(handshake_ok(server))
            self.assertIn("tls not reloaded, the last good certificate 'CN = server' kept in force",
                          server.read_log())
            # A good rotation still goes through.
            write(live_key, read(d, "rotated.key"))
            write(live_cert, read(d, "rotated.pem"))
            h.wait_until(lambda: server.metric("dcformer_credential_reloads_total",
                                               file="tls") >= 1, timeout=30,
                         what="the rotation reloaded")
            h.wait_until(lambda: handshake_ok(server), timeout=30, what="the rotated pair served")
            self.assertIn("CN = rotated", server.read_log())


class ApiKeyReloadTest(unittest.TestCase):
    """Issue 23 item 10: keys rotate by editing --api-key-file, under load, without a restart."""

    def test_rotating_a_key_under_load(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        key_file = os.path.join(tmp, "keys")
        write(key_file, "old-key\n")
        with h.Server(args=[f"--api-key-file={key_file}", "--api-key-reload-interval=1s"]) \
                as server:
            stub = server.stub()
            pid = server.proc.pid

            def generate(key):
                try:
                    h.collect(stub.Generate(h.ids_request(PROMPT, 4), timeout=30,
                                            metadata=[("authorization", f"Bearer {key}")]))
                    return None
                except grpc.RpcError as e:
                    return e.code()

            # Load: clients that always use the key in force, until told to switch.
            current = {"key": "old-key"}
            errors, calls = [], [0]
            stop = threading.Event()

            def client():
                while not stop.is_set():
                    key = current["key"]
                    code = generate(key)
                    calls[0] += 1
                    if code is not None and key == current["key"]:
                        errors.append((key, code))

            workers = [threading.Thread(target=client) for _ in range(4)]
            for w in workers:
                w.start()
            try:
                write(key_file, "# rotation: both\nold-key\nnew-key\n")
                h.wait_until(lambda: generate("new-key") is None, timeout=30,
                             what="the new key accepted")
                self.assertIsNone(generate("old-key"))
                current["key"] = "new-key"
                write(key_file, "new-key\n")
                h.wait_until(lambda: generate("old-key") == grpc.StatusCode.UNAUTHENTICATED,
                             timeout=30, what="the old key refused")
                # A file that holds no key, then none at all: the last good key stays.
                before = server.metric("dcformer_credential_reload_failures_total",
                                       file="api_keys")
                write(key_file, "# emptied by mistake\n")
                h.wait_until(lambda: server.metric("dcformer_credential_reload_failures_total",
                                                   file="api_keys") >= before + 1,
                             timeout=30, what="the failed reload counted")
                os.unlink(key_file)
                h.wait_until(lambda: server.metric("dcformer_credential_reload_failures_total",
                                                   file="api_keys") >= before + 2,
                             timeout=30, what="the failed reload counted")
                self.assertIsNone(generate("new-key"))
                self.assertEqual(generate("old-key"), grpc.StatusCode.UNAUTHENTICATED)
            finally:
                stop.set()
                for w in workers:
                    w.join()
            self.assertEqual(errors, [])
            self.assertGreater(calls[0], 8)
            self.assertEqual(server.proc.pid, pid)
            self.assertIsNone(server.proc.poll())
            log = server.read_log()
            self.assertIn("api keys reloaded: 2 key(s)", log)
            self.assertIn("api_keys not reloaded, the last good 1 key(s) kept in force", log)
            self.assertNotIn("new-key", log)

    def test_a_bad_line_does_not_keep_a_revoked_key(self):
        """Review probe-1 finding 10: a file with one bad line was refused whole, so the key it
        revoked stayed valid. Now the valid lines apply; the bad one is named by number only."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        key_file = os.path.join(tmp, "keys")
        write(key_file, "old-key\nnew-key\n")
        with h.Server(args=[f"--api-key-file={key_file}", "--api-key-reload-interval=1s"]) \
                as server:
            stub = server.stub()

            def generate(key):
                try:
                    h.collect(stub.Generate(h.ids_request(PROMPT, 2), timeout=30,
                                            metadata=[("authorization", f"Bearer {key}")]))
                    return None
                except grpc.RpcError as e:
                    return e.code()

            self.assertIsNone(generate("old-key"))
            before = server.metric("dcformer_credential_reload_failures_total", file="api_keys")
            reloads = server.metric("dcformer_credential_reloads_total", file="api_keys")
            # Revoke old-key; a BOM and a key pasted with a space come with the edit.
            write(key_file, "\ufeff# old-key revoked\nnew-key\nsecret pasted-with-space\n".encode())
            h.wait_until(lambda: generate("old-key") == grpc.StatusCode.UNAUTHENTICATED,
                         timeout=30, what="the revoked key refused")
            self.assertIsNone(generate("new-key"))
            h.wait_until(lambda: server.metric("dcformer_credential_reload_failures_total",
                                               file="api_keys") >= before + 1,
                         timeout=30, what="the bad line counted as a failed reload")
            # The keys in force changed: a reload as well (once; later reads change nothing).
            reloaded = lambda: server.metric("dcformer_credential_reloads_total", file="api_keys")
            h.wait_until(lambda: reloaded() >= reloads + 1, timeout=30,
                         what="the reload that changed the keys counted")
            time.sleep(2)  # two more reads of the unchanged file
            self.assertEqual(reloaded(), reloads + 1)
            log = server.read_log()
            self.assertIn("line 3 is not a key", log)
            self.assertNotIn("pasted-with-space", log)
            self.assertNotIn("new-key", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
