"""A raw HTTP/2 client for the abuse tests: what grpcio will not do on purpose (a zero
flow-control window that is never reopened, a request compressed by hand, a header block that
never ends), on top of python3-h2's framing and HPACK.

Synchronisation: `pump_until` reads frames until a condition on what arrived holds or a
deadline passes; nothing sleeps for a fixed time."""
import socket
import struct
import time
import zlib

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

# HTTP/2 frame types and flags (RFC 9113).
HEADERS, CONTINUATION = 0x1, 0x9
END_STREAM, END_HEADERS = 0x1, 0x4


def grpc_message(payload, compressed=False):
    """A length-prefixed gRPC message (the body of one request)."""
    return struct.pack(">BI", 1 if compressed else 0, len(payload)) + payload


def gzip_bomb(inflated_bytes):
    """gzip of `inflated_bytes` zero bytes: about 1/1000 of that on the wire."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    out = []
    left = inflated_bytes
    while left > 0:
        n = min(left, len(chunk))
        out.append(c.compress(chunk[:n]))
        left -= n
    out.append(c.flush())
    return b"".join(out)


def raw_frame(frame_type, flags, stream_id, payload):
    return (struct.pack(">I", len(payload))[1:] + bytes([frame_type, flags]) +
            struct.pack(">I", stream_id & 0x7FFFFFFF) + payload)


class Call:
    """What the client saw of one stream."""

    def __init__(self):
        self.headers = None  # response headers (a trailers-only response has grpc-status here)
        self.trailers = None
        self.data = 0  # DATA bytes received
        self.body = bytearray()  # ...and the bytes themselves
        self.reset = None  # RST_STREAM error code

    def messages(self):
        """The complete gRPC messages received so far (payloads, uncompressed)."""
        out, i = [], 0
        while i + 5 <= len(self.body):
            n = struct.unpack(">I", bytes(self.body[i + 1:i + 5]))[0]
            if i + 5 + n > len(self.body):
                break
            out.append(bytes(self.body[i + 5:i + 5 + n]))
            i += 5 + n
        return out

    @property
    def status(self):
        """grpc-status as an int, or None while the call has not ended with one."""
        for block in (self.trailers, self.headers):
            if block and "grpc-status" in block:
                return int(block["grpc-status"])
        return None

    @property
    def message(self):
        for block in (self.trailers, self.headers):
            if block and "grpc-status" in block:
                return block.get("grpc-message", "")
        return None

    @property
    def ended(self):
        return self.status is not None or self.reset is not None


class H2Client:
    """One HTTP/2 connection to a gRPC server.

    initial_window: SETTINGS_INITIAL_WINDOW_SIZE this client advertises (0: the server may
    send no DATA until the client opens the window, which `read_data=False` never does)."""

    def __init__(self, port, host="127.0.0.1", initial_window=None, read_data=True,
                 timeout=30, source=None):
        # source: the client's own address, e.g. "127.0.0.2" (any 127/8 address is loopback):
        # a second client address for the per-address bounds.
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if initial_window is not None:
            self.conn.update_settings(
                {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window})
        self.timeout = timeout
        self.read_data = read_data
        self.calls = {}
        self.closed = False  # the server closed the connection (or sent GOAWAY)
        self.flush()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)

    def start_call(self, path, body, metadata=(), end_stream=True):
        """Opens a stream for `path` and sends `body` (gRPC-framed bytes). Returns its id."""
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
                   (":authority", "localhost"), ("content-type", "application/grpc"),
                   ("te", "trailers")] + list(metadata)
        self.conn.send_headers(sid, headers)
        self.calls[sid] = Call()
        self.send_body(sid, body, end_stream)
        return sid

    def send_body(self, sid, body, end_stream=True, timeout=60):
        """Sends `body` on stream `sid` as the server's flow-control windows allow."""
        deadline = time.monotonic() + timeout
        offset = 0
        while offset < len(body):
            if self.calls[sid].ended or self.closed:
                return  # refused before its body was in
            try:
                window = min(self.conn.local_flow_control_window(sid),
                             self.conn.max_outbound_frame_size)
            except h2.exceptions.StreamClosedError:
                return
            if window <= 0:
                if time.monotonic() > deadline:
                    raise AssertionError("the server never opened its window")
                self.pump(0.5)
                continue
            n = min(window, len(body) - offset)
            try:
                self.conn.send_data(sid, body[offset:offset + n])
            except h2.exceptions.StreamClosedError:
                return
            offset += n
            self.flush()
            self.pump(0)  # take in a refusal early
        if end_stream:
            try:
                self.conn.end_stream(sid)
            except h2.exceptions.StreamClosedError:
                return
            self.flush()

    def pump(self, timeout):
        """Reads and handles what arrives within `timeout` seconds (returns on the first read)."""
        if self.closed:
            return
        self.sock.settimeout(timeout if timeout > 0 else 0.0)
        try:
            data = self.sock.recv(1 << 16)
        except (socket.timeout, BlockingIOError):
            return
        except OSError:
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return
        for e in events:
            call = self.calls.get(getattr(e, "stream_id", None))
            if isinstance(e, h2.events.ResponseReceived) and call:
                call.headers = dict(e.headers)
            elif isinstance(e, h2.events.TrailersReceived) and call:
                call.trailers = dict(e.headers)
            elif isinstance(e, h2.events.DataReceived) and call:
                call.data += len(e.data)
                call.body += e.data
                if self.read_data:
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, h2.events.StreamReset) and call:
                call.reset = e.error_code
            elif isinstance(e, h2.events.ConnectionTerminated):
                self.closed = True
        try:
            self.flush()
        except OSError:
            self.closed = True

    def reset(self, sid):
        """Cancels stream `sid` the way a client's cancel does (RST_STREAM CANCEL)."""
        try:
            self.conn.reset_stream(sid, error_code=h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.StreamClosedError:
            return
        self.flush()

    def send_while_allowed(self, sid, body):
        """Sends as much of `body` on stream `sid` as the flow-control windows allow now,
        without waiting for more. Returns how many bytes went out."""
        sent = 0
        while sent < len(body) and not self.calls[sid].ended and not self.closed:
            try:
                window = min(self.conn.local_flow_control_window(sid),
                             self.conn.max_outbound_frame_size)
            except (h2.exceptions.StreamClosedError, KeyError):
                break
            if window <= 0:
                break
            n = min(window, len(body) - sent)
            try:
                self.conn.send_data(sid, body[sent:sent + n])
            except h2.exceptions.StreamClosedError:
                break
            sent += n
        try:
            self.flush()
        except OSError:
            self.closed = True
        return sent

    def pump_until(self, predicate, timeout, what="condition"):
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}")
            if self.closed:
                raise AssertionError(f"connection closed while waiting for {what}")
            self.pump(min(left, 0.5))

    def all_ended(self):
        return all(c.ended for c in self.calls.values())
