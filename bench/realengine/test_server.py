"""Tests of server.py's parts that need no torch, and of its HTTP side over the
fake backend (a timer instead of a model). Run: python3 -m unittest discover -s bench/realengine
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server  # noqa: E402


class PureParts(unittest.TestCase):
    def test_word_ids_are_stable_and_outside_reserved(self):
        a = server.word_token_id("bad", 32000)
        self.assertEqual(a, server.word_token_id("bad", 32000))
        for w in server.OUTPUT_WORDS[:500]:
            i = server.word_token_id(w, 32000)
            self.assertGreaterEqual(i, server.RESERVED_IDS)
            self.assertLess(i, 32000)
        # Fixed values: the mapping must not change between runs, machines or versions
        # (blake2b, not Python's per-process salted hash()).
        self.assertEqual(server.word_token_id("bad", 32000), 14733)
        self.assertEqual(server.word_token_id("kom", 32000), 27129)
        self.assertNotEqual(server.word_token_id("bad", 32000), server.word_token_id("bed", 32000))

    def test_shared_text_prefix_is_shared_token_prefix(self):
        prefix = "kom tal rup " * 500
        a = server.tokenize(prefix + "fip gov", 32000)
        b = server.tokenize(prefix + "zaz wek", 32000)
        self.assertEqual(len(a), 1502)
        self.assertEqual(a[:1500], b[:1500])
        self.assertNotEqual(a[1500:], b[1500:])

    def test_one_word_one_token_four_characters(self):
        text = "bad cop fig "
        self.assertEqual(len(server.tokenize(text, 32000)), len(text) // 4)
        self.assertEqual(len(server.detokenize(12345)), 4)

    def test_tokenize_forms(self):
        self.assertEqual(server.tokenize([5, 6, 32001], 32000), [5, 6, 1])
        self.assertEqual(server.tokenize(["a b", "c"], 100), server.tokenize("a b\nc", 100))
        with self.assertRaises(ValueError):
            server.tokenize({"x": 1}, 100)
        with self.assertRaises(ValueError):
            server.tokenize([1, "a"], 100)

    def test_sse_framing(self):
        chunk = server.completion_chunk("cmpl-1", "m", 7, "bad ", None)
        ev = server.sse_event(chunk)
        self.assertTrue(ev.startswith(b"data: {"))
        self.assertTrue(ev.endswith(b"}\n\n"))
        self.assertEqual(json.loads(ev[6:-2])["choices"][0], {"index": 0, "text": "bad ", "logprobs": None, "finish_reason": None})
        self.assertEqual(server.sse_event("[DONE]"), b"data: [DONE]\n\n")
        self.assertEqual(server.http_chunk(b"hello"), b"5\r\nhello\r\n")
        self.assertEqual(server.http_chunk(b""), b"0\r\n\r\n")

    def test_parse_request(self):
        self.assertEqual(server.parse_completion_request(b'{"prompt":"a","max_tokens":3,"stream":true}', 32), ("a", 3, True))
        self.assertEqual(server.parse_completion_request(b'{"prompt":"a"}', 32), ("a", 32, False))
        for bad in (b"nope", b"[]", b"{}", b'{"prompt":"a","max_tokens":0}', b'{"prompt":"a","max_tokens":true}'):
            with self.assertRaises(ValueError):
                server.parse_completion_request(bad, 32)

    def test_metrics_text(self):
        s = {"running": 3, "waiting": 2, "kv_usage": 0.5, "prefix_queries": 100, "prefix_hits": 80,
             "served": 9, "prompt_tokens": 100, "generation_tokens": 288}
        text = server.metrics_text("m", s)
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.split(" ")
                values[name.split("{")[0]] = float(value)
        self.assertEqual(values["vllm:num_requests_running"], 3)
        self.assertEqual(values["vllm:num_requests_waiting"], 2)
        self.assertEqual(values["vllm:kv_cache_usage_perc"], 0.5)
        self.assertEqual(values["vllm:prefix_cache_hits_total"], 80)
        self.assertEqual(values["vllm:prefix_cache_queries_total"], 100)
        self.assertEqual(values["vllm:request_success_total"], 9)
        self.assertEqual(values["vllm:generation_tokens_total"], 288)
        s["prefix_hits"] = None
        self.assertNotIn("prefix_cache_hits", server.metrics_text("m", s))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake_server(port, *args):
    """server.py over the fake backend on port, in a child process, once its /health answers; stop it with
    stop_server (by its PID)."""
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.join(here, "server.py"), "--backend", "fake", "--port", str(port)]
                            + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health")
            status = c.getresponse().status
            c.close()
            if status == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    stop_server(proc)
    raise RuntimeError("fake server did not come up")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class FakeBackendHTTP(unittest.TestCase):
    """The whole HTTP side, over the fake backend, in a child process stopped by its PID."""

    server_args = ()  # extra flags for server.py

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.proc = start_fake_server(cls.port, "--fake-step-ms", "2", "--name", "t0", *cls.server_args)

    @classmethod
    def tearDownClass(cls):
        stop_server(cls.proc)

    @classmethod
    def get(cls, path):
        c = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=10)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    def post(self, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def test_streamed(self):
        r, data = self.post({"prompt": "bad cop " * 10, "max_tokens": 5, "stream": True})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Content-Type"), "text/event-stream")
        events = [e for e in data.decode().split("\n\n") if e]
        self.assertEqual(events[-1], "data: [DONE]")
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        self.assertEqual(len(chunks), 5)
        self.assertTrue(all(c["object"] == "text_completion" and len(c["choices"][0]["text"]) == 4 for c in chunks))
        self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks], [None] * 4 + ["length"])

    def test_not_streamed(self):
        r, data = self.post({"prompt": "bad cop", "max_tokens": 3})
        self.assertEqual(r.status, 200)
        body = json.loads(data)
        self.assertEqual(body["usage"], {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5})
        self.assertEqual(len(body["choices"][0]["text"]), 12)

    def test_bad_request(self):
        r, data = self.post({"max_tokens": 3})
        self.assertEqual(r.status, 400)
        self.assertIn("prompt", json.loads(data)["error"]["message"])

    def test_models_metrics(self):
        status, body = self.get("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["data"][0]["id"], "sluice-llama-3b-random")
        self.post({"prompt": "bad", "max_tokens": 2, "stream": True})
        status, body = self.get("/metrics")
        self.assertEqual(status, 200)
        self.assertIn("vllm:num_requests_running{", body.decode())
        self.assertIn("vllm:request_success_total{", body.decode())


class FakeBackendHTTPFirstToken(FakeBackendHTTP):
    """The same, with the stream headers sent with the first token (the old behaviour)."""

    server_args = ("--stream-headers", "first_token")


def running_and_tokens(port):
    """vllm:num_requests_running and vllm:generation_tokens_total from the server's /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split(" ")
            values[name.split("{")[0]] = float(value)
    return values["vllm:num_requests_running"], values["vllm:generation_tokens_total"]


class StreamHeadersBeforeTheFirstToken(unittest.TestCase):
    """By default a stream's status line and headers come as soon as the request is in the engine, before its
    first token, as vLLM's server sends them; with --stream-headers first_token they come with that token.
    The fake backend's step is 60 s here (no warm-up): no token can come during the test."""

    def start(self, *args):
        self.port = free_port()
        self.proc = start_fake_server(self.port, "--fake-step-ms", "60000", "--name", "t2", "--no-warmup", *args)
        self.addCleanup(stop_server, self.proc)

    def send(self, timeout):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        self.addCleanup(c.close)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "bad cop", "max_tokens": 4, "stream": True}),
                  headers={"Content-Type": "application/json"})
        return c

    def test_default_headers_come_before_the_first_token(self):
        self.start()
        c = self.send(timeout=10)
        r = c.getresponse()  # within the 10 s timeout, while the first token is 60 s away
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Content-Type"), "text/event-stream")
        self.assertEqual(r.getheader("Transfer-Encoding"), "chunked")
        self.assertEqual(running_and_tokens(self.port), (1, 0))  # in the engine, no token yet
        # A client that leaves after the headers, before its first token, is still noticed.
        c.close()
        deadline = time.time() + 30
        while running_and_tokens(self.port)[0] != 0:
            self.assertLess(time.time(), deadline, "the request of a client that left still runs")
            time.sleep(0.05)

    def test_first_token_headers_wait_for_the_first_token(self):
        self.start("--stream-headers", "first_token")
        c = self.send(timeout=1)
        deadline = time.time() + 20
        while running_and_tokens(self.port)[0] != 1:
            self.assertLess(time.time(), deadline, "the request never started")
            time.sleep(0.05)
        with self.assertRaises(socket.timeout):  # TimeoutError from Python 3.10
            c.getresponse()


class ClientGoneBeforeItsFirstToken(unittest.TestCase):
    """A request whose client leaves while it waits for its first token is cancelled then, as vLLM does, not
    when that token comes (under overload a queued request the client gave up on would still be prefilled).
    The fake backend's step is 60 s here: only the client's leaving can end the request before it."""

    def setUp(self):
        self.port = free_port()
        self.proc = start_fake_server(self.port, "--fake-step-ms", "60000", "--name", "t1", "--no-warmup")

    def tearDown(self):
        stop_server(self.proc)

    def running(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
        for line in body.splitlines():
            if line.startswith("vllm:num_requests_running{"):
                return float(line.split(" ")[1])
        raise AssertionError("no vllm:num_requests_running in /metrics")

    def leave_before_the_first_token(self, stream):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "bad cop", "max_tokens": 4, "stream": stream}),
                  headers={"Content-Type": "application/json"})
        deadline = time.time() + 20
        while self.running() != 1:
            self.assertLess(time.time(), deadline, "the request never started")
            time.sleep(0.05)
        c.close()  # the client gives up before the first token (60 s away)
        deadline = time.time() + 30
        while self.running() != 0:
            self.assertLess(time.time(), deadline, "the request of a client that left still runs")
            time.sleep(0.05)

    def test_streamed(self):
        self.leave_before_the_first_token(True)

    def test_not_streamed(self):
        self.leave_before_the_first_token(False)

if __name__ == "__main__":
    unittest.main()
