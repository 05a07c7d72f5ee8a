#!/usr/bin/env python3
"""One OpenAI-compatible replica over Hugging Face transformers' continuous
batching, for sluice-bench's real-engine scenario (-engine transformers).

It builds a Llama-shaped model from a config with random weights (nothing is
downloaded), maps every whitespace-separated word of a prompt to one token id
with a stable hash (so a shared text prefix is a shared token prefix, and the
engine's prefix cache sees it), and serves:

  POST /v1/completions   streamed (SSE, one chunk per token, then [DONE]) or not
  GET  /v1/models        the one model
  GET  /health           200 once the engine is up and warmed
  GET  /metrics          vLLM metric names (requests running/waiting, KV-cache use,
                         prefix-cache queries/hits, prompt/generation tokens, requests served)

A streamed answer's status line and headers go out as soon as the request is
validated and added to the engine, before it queues or prefills, as vLLM's and
SGLang's servers (Starlette under uvicorn) and TGI's do: a proxy's first byte
is then no load signal. `--stream-headers first_token` sends them with the
first token instead (this server's behaviour before; for comparing).

Every request generates exactly max_tokens tokens (no EOS). Only the standard
library, torch and transformers are used. `--backend fake` replaces the model
by a timer (no torch needed): it exercises the HTTP side anywhere.

  python3 bench/realengine/server.py --port 8001                      # H100 defaults
  python3 bench/realengine/server.py --port 8001 --device cpu --layers 2 --hidden 256 \
      --heads 4 --kv-heads 2 --intermediate 512 --vocab 4096 --dtype float32 --num-blocks 64 --block-size 32
"""

import argparse
import hashlib
import itertools
import json
import queue
import select
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ---- pure parts (no torch): tokens, SSE, metrics -------------------------

RESERVED_IDS = 3  # 0 <unk>/<pad>, 1 <s>, 2 </s>: never produced by a word


def word_token_id(word, vocab_size):
    """The stable token id of one word: a hash of it, outside the reserved ids."""
    h = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
    return RESERVED_IDS + h % (vocab_size - RESERVED_IDS)


def tokenize(prompt, vocab_size):
    """Prompt (a string, a list of strings, or a list of token ids) -> token ids, one per word."""
    if isinstance(prompt, list):
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [t % vocab_size for t in prompt]
        if all(isinstance(t, str) for t in prompt):
            prompt = "\n".join(prompt)
        else:
            raise ValueError("prompt must be a string, a list of strings or a list of token ids")
    if not isinstance(prompt, str):
        raise ValueError("prompt must be a string, a list of strings or a list of token ids")
    return [word_token_id(w, vocab_size) for w in prompt.split()]


_CONS, _VOWS = "bcdfghjklmnprstvwz", "aeiou"
OUTPUT_WORDS = ["".join(t) for t in itertools.product(_CONS, _VOWS, _CONS)]


def detokenize(token_id):
    """The text of one generated token: a 3-letter word and a space (4 characters)."""
    return OUTPUT_WORDS[token_id % len(OUTPUT_WORDS)] + " "


def completion_chunk(req_id, model, created, text, finish_reason=None):
    """One streamed /v1/completions chunk, in OpenAI's shape."""
    return {"id": req_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def completion_body(req_id, model, created, text, prompt_tokens, completion_tokens):
    """A non-streamed /v1/completions answer."""
    return {"id": req_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def sse_event(obj):
    """A server-sent event: 'data: <json>' or 'data: [DONE]', then a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return ("data: " + data + "\n\n").encode("utf-8")


def http_chunk(data):
    """One HTTP/1.1 chunked-transfer chunk (b'' ends the body)."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


def parse_completion_request(body, default_max_tokens):
    """Validates a /v1/completions body; returns (prompt, max_tokens, stream)."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError("body is not JSON: %s" % e)
    if not isinstance(req, dict):
        raise ValueError("body must be a JSON object")
    if "prompt" not in req:
        raise ValueError("prompt is required")
    max_tokens = req.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 65536:
        raise ValueError("max_tokens must be an integer between 1 and 65536")
    return req["prompt"], max_tokens, bool(req.get("stream", False))


def metrics_text(model, s):
    """The /metrics page, in vLLM's names, from a stats dict."""
    label = '{model_name="%s"}' % model.replace("\\", "\\\\").replace('"', '\\"')
    out = []

    def metric(name, typ, help_, value):
        out.append("# HELP %s %s\n# TYPE %s %s\n%s%s %s\n" % (name, help_, name, typ, name, label, _num(value)))

    metric("vllm:num_requests_running", "gauge", "Requests in the engine's running batch.", s["running"])
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", s["waiting"])
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache blocks in use / blocks, 0..1.", s["kv_usage"])
    metric("vllm:gpu_cache_usage_perc", "gauge", "KV-cache blocks in use / blocks, 0..1 (older name).", s["kv_usage"])
    if s.get("prefix_hits") is not None:
        metric("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", s["prefix_queries"])
        metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", s["prefix_hits"])
    metric("vllm:request_success_total", "counter", "Requests served to the end.", s["served"])
    metric("vllm:prompt_tokens_total", "counter", "Prompt tokens of the requests admitted.", s["prompt_tokens"])
    metric("vllm:generation_tokens_total", "counter", "Tokens generated.", s["generation_tokens"])
    return "".join(out)


def _num(v):
    if isinstance(v, float):
        return repr(v)
    return str(v)


# ---- engines --------------------------------------------------------------


class Stream:
    """What one request receives: lists of new token ids, then None (done) or an Exception."""

    def __init__(self):
        self.q = queue.Queue()


class FakeEngine:
    """A timer instead of a model: every step_ms all running requests get one token."""

    def __init__(self, args):
        self.step = args.fake_step_ms / 1000.0
        self.lock = threading.Lock()
        self.live = {}  # id -> [stream, remaining]
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "served": 0, "prefix_queries": 0, "prefix_hits": None}
        threading.Thread(target=self._loop, daemon=True).start()

    def add(self, rid, ids, max_tokens):
        st = Stream()
        with self.lock:
            self.live[rid] = [st, max_tokens]
            self.stats["prompt_tokens"] += len(ids)
            self.stats["prefix_queries"] += len(ids)
        return st

    def cancel(self, rid):
        with self.lock:
            self.live.pop(rid, None)

    def _loop(self):
        n = 0
        while True:
            time.sleep(self.step)
            with self.lock:
                for rid, entry in list(self.live.items()):
                    st, left = entry
                    n += 1
                    st.q.put([n % 30000 + RESERVED_IDS])
                    self.stats["generation_tokens"] += 1
                    entry[1] = left - 1
                    if entry[1] == 0:
                        st.q.put(None)
                        self.stats["served"] += 1
                        del self.live[rid]

    def snapshot(self):
        with self.lock:
            s = dict(self.stats)
            s.update(running=len(self.live), waiting=0, kv_usage=0.0)
        return s

    def stop(self):
        pass


class TransformersEngine:
    """transformers' ContinuousBatchingManager over a random-weight Llama."""

    def __init__(self, args):
        try:
            import torch
            from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
        except ImportError as e:
            sys.exit("server.py: needs torch and transformers (%s); or run with --backend fake" % e)
        self.torch = torch
        dtype = getattr(torch, args.dtype)
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_positions,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
        torch.manual_seed(args.seed)
        t0 = time.time()
        prev = torch.get_default_dtype()
        try:
            torch.set_default_dtype(dtype)  # build in the target dtype: no fp32 copy of 3B weights
        except (TypeError, ValueError):
            pass
        try:
            with torch.device(args.device):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
        model = model.to(dtype=dtype).eval()
        log("model: %d layers, hidden %d, %d/%d heads, %.2fB parameters, %s %s, built in %.1f s" % (
            args.layers, args.hidden, args.heads, args.kv_heads,
            sum(p.numel() for p in model.parameters()) / 1e9, args.device, args.dtype, time.time() - t0))
        if args.attn:
            try:
                model.set_attn_implementation(args.attn)
            except Exception as e:  # the manager picks a paged implementation itself
                log("set_attn_implementation(%r) failed (%s); leaving it to init_continuous_batching" % (args.attn, e))
        gen = GenerationConfig(max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        cb = dict(block_size=args.block_size, num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens,
                  allow_block_sharing=not args.no_prefix_caching, scheduler_type=args.scheduler)
        self.manager = self._init_manager(model, gen, cb)
        self.manager.start()
        self.lock = threading.Lock()
        self.streams = {}  # request id -> (Stream, tokens sent so far)
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "served": 0, "prefix_queries": 0}
        threading.Thread(target=self._dispatch, daemon=True).start()

    def _init_manager(self, model, gen, cb):
        if not hasattr(model, "init_continuous_batching"):
            sys.exit("server.py: this transformers has no init_continuous_batching (need transformers >= 5)")
        try:
            from transformers.generation import ContinuousBatchingConfig
        except ImportError:
            ContinuousBatchingConfig = None
        if ContinuousBatchingConfig is not None:
            try:
                return model.init_continuous_batching(generation_config=gen,
                                                      continuous_batching_config=ContinuousBatchingConfig(**cb))
            except TypeError as e:
                log("ContinuousBatchingConfig(%s) refused (%s); trying the older keyword form" % (cb, e))
        # Older 5.x: num_blocks / block_size / max_batch_tokens are read from the
        # generation config, allow_block_sharing is a keyword.
        for k in ("num_blocks", "block_size", "max_batch_tokens", "scheduler_type"):
            setattr(gen, k, cb[k])
        setattr(gen, "scheduler", cb["scheduler_type"])
        try:
            return model.init_continuous_batching(generation_config=gen, allow_block_sharing=cb["allow_block_sharing"])
        except TypeError:
            return model.init_continuous_batching(generation_config=gen)

    def add(self, rid, ids, max_tokens):
        st = Stream()
        with self.lock:
            self.streams[rid] = (st, 0)
            self.stats["prompt_tokens"] += len(ids)
            self.stats["prefix_queries"] += len(ids)
        try:
            self.manager.add_request(ids, request_id=rid, max_new_tokens=max_tokens, streaming=True, eos_token_id=-1)
        except TypeError:  # a version without eos_token_id per request
            self.manager.add_request(ids, request_id=rid, max_new_tokens=max_tokens, streaming=True)
        return st

    def cancel(self, rid):
        with self.lock:
            self.streams.pop(rid, None)
        try:
            self.manager.cancel_request(rid)
        except Exception as e:
            log("cancel_request(%s): %s" % (rid, e))

    def _dispatch(self):
        """Routes the manager's outputs to the requests' streams (one reader of its queue)."""
        while True:
            out = self.manager.get_result(timeout=0.1)
            if out is None:
                if not self._alive():
                    self._fail_all(RuntimeError("the generation loop stopped"))
                    return
                continue
            rid = out.request_id
            tokens = list(out.generated_tokens or [])
            finished = out.is_finished() if hasattr(out, "is_finished") else False
            err = getattr(out, "error", None)
            with self.lock:
                entry = self.streams.get(rid)
                if entry is None:
                    continue
                st, sent = entry
                new = tokens[sent:]
                self.streams[rid] = (st, sent + len(new))
                self.stats["generation_tokens"] += len(new)
                if finished or err:
                    del self.streams[rid]
                    if not err:
                        self.stats["served"] += 1
            if new:
                st.q.put(new)
            if err:
                st.q.put(RuntimeError(str(err)))
            elif finished:
                st.q.put(None)

    def _alive(self):
        t = getattr(self.manager, "_generation_thread", None)
        return t is None or t.is_alive()

    def _fail_all(self, e):
        with self.lock:
            streams, self.streams = self.streams, {}
        for st, _ in streams.values():
            st.q.put(e)

    def snapshot(self):
        with self.lock:
            s = dict(self.stats)
        bp = getattr(self.manager, "batch_processor", None)
        sched = getattr(bp, "scheduler", None)
        cache = getattr(bp, "cache", None)
        s["running"] = len(getattr(sched, "active_requests", {}) or {})
        waiting = len(getattr(sched, "waiting_requests", {}) or {})
        iq = getattr(self.manager, "input_queue", None)
        s["waiting"] = waiting + (iq.qsize() if iq is not None else 0)
        s["kv_usage"] = 0.0
        try:
            total = cache.num_blocks
            s["kv_usage"] = max(0.0, min(1.0, 1.0 - cache.get_num_free_blocks() / total))
        except Exception:
            pass
        # Prompt tokens the engine took from shared blocks: a private counter
        # of PagedAttentionCache (transformers 5.x); absent: no hit metrics.
        hits = getattr(cache, "_total_prefix_length", None)
        s["prefix_hits"] = hits if isinstance(hits, int) else None
        return s

    def stop(self):
        try:
            self.manager.stop(block=True, timeout=10)
        except TypeError:
            self.manager.stop(block=True)


# ---- HTTP -------------------------------------------------------------------


def log(msg):
    sys.stderr.write("[%s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class ClientGone(ConnectionResetError):
    """The client closed its connection while its request waited for a token."""


# How often a request waiting for its next token looks whether its client is still there.
CLIENT_POLL_S = 0.25

# --stream-headers: when a streamed answer's status line and headers are sent.
STREAM_HEADERS_IMMEDIATE = "immediate"  # once the request is added to the engine (vLLM, SGLang, TGI)
STREAM_HEADERS_FIRST_TOKEN = "first_token"  # with the first token


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sluice-bench-engine/1"

    def log_message(self, fmt, *a):  # quiet: one line per request is too much at load
        pass

    def _json(self, status, obj):
        body = (json.dumps(obj) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status, msg):
        self._json(status, {"error": {"type": "invalid_request_error", "message": msg}})

    def do_GET(self):
        app = self.server.app
        if self.path == "/health":
            self._json(200, {"status": "ok", "name": app.name})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": app.model, "object": "model", "owned_by": "sluice-bench"}]})
        elif self.path == "/metrics":
            body = metrics_text(app.model, app.engine.snapshot()).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._error(404, "no route " + self.path)

    def do_POST(self):
        app = self.server.app
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n > 0 else b""
        if self.path != "/v1/completions":
            self._error(404, "no route " + self.path + " (this server has /v1/completions only)")
            return
        try:
            prompt, max_tokens, stream = parse_completion_request(body, app.default_max_tokens)
            ids = tokenize(prompt, app.vocab)
        except ValueError as e:
            self._error(400, str(e))
            return
        if not ids:
            self._error(400, "empty prompt")
            return
        if len(ids) + max_tokens > app.max_positions:
            self._error(400, "prompt + max_tokens exceed %d positions" % app.max_positions)
            return
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        st = app.engine.add(rid, ids, max_tokens)
        try:
            if stream:
                self._stream(app, st, rid, created, max_tokens)
            else:
                self._complete(app, st, rid, created, len(ids))
        except (BrokenPipeError, ConnectionResetError):  # ClientGone too
            app.engine.cancel(rid)
            self.close_connection = True

    def _client_gone(self):
        """Whether the client closed its connection: readable, with nothing to read. Without this a request
        whose client gave up would be noticed only when its first token is written (vLLM aborts it at once):
        under overload the engine would still prefill what nobody waits for."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _next(self, app, st):
        deadline = time.monotonic() + app.request_timeout
        while True:
            try:
                item = st.q.get(timeout=max(0.0, min(CLIENT_POLL_S, deadline - time.monotonic())))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise
                if self._client_gone():
                    raise ClientGone()
        if isinstance(item, Exception):
            raise item
        return item

    def _start_stream(self):
        """Send a stream's status line and headers now (end_headers writes them: wfile is unbuffered)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _stream(self, app, st, rid, created, max_tokens):
        """Stream the request's tokens as SSE. With --stream-headers immediate (the default) the 200 and its
        headers go out before the first token, as vLLM's server sends them: an error after that (a failed
        generation, no token within --request-timeout) cannot become a status any more, so it cuts the stream
        (the connection is closed without the last chunk: the client sees an incomplete body), as it does
        with first_token once the first token went out. A client that leaves before its first token is still
        noticed by _next (_client_gone), headers sent or not."""
        sent, started = 0, False
        try:
            if app.stream_headers == STREAM_HEADERS_IMMEDIATE:
                self._start_stream()
                started = True
            while True:
                item = self._next(app, st)
                if not started:
                    self._start_stream()
                    started = True
                if item is None:
                    break
                for tok in item:
                    sent += 1
                    finish = "length" if sent >= max_tokens else None
                    self.wfile.write(http_chunk(sse_event(completion_chunk(rid, app.model, created, detokenize(tok), finish))))
                self.wfile.flush()
            self.wfile.write(http_chunk(sse_event("[DONE]")) + http_chunk(b""))
            self.wfile.flush()
        except (queue.Empty, RuntimeError) as e:
            app.engine.cancel(rid)
            if not started:
                self._error(500, "generation failed: %s" % (e or "timeout"))
            else:
                self.close_connection = True  # cut the stream: the client sees an incomplete body

    def _complete(self, app, st, rid, created, prompt_tokens):
        toks = []
        try:
            while True:
                item = self._next(app, st)
                if item is None:
                    break
                toks.extend(item)
        except (queue.Empty, RuntimeError) as e:
            app.engine.cancel(rid)
            self._error(500, "generation failed: %s" % (e or "timeout"))
            return
        self._json(200, completion_body(rid, app.model, created, "".join(detokenize(t) for t in toks), prompt_tokens, len(toks)))


class App:
    pass


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default="engine", help="replica name (in /health)")
    p.add_argument("--model-name", default="sluice-llama-3b-random", help="the model id served")
    p.add_argument("--backend", choices=["transformers", "fake"], default="transformers")
    p.add_argument("--fake-step-ms", type=float, default=20.0, help="fake backend: ms per token step")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--max-positions", type=int, default=8192)
    p.add_argument("--attn", default="paged|sdpa", help="attention implementation ('' leaves the manager's choice)")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=96)
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--scheduler", default="fifo")
    p.add_argument("--no-prefix-caching", action="store_true", help="allow_block_sharing off")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens when a request names none")
    p.add_argument("--request-timeout", type=float, default=600.0, help="longest wait for a request's next token (s)")
    p.add_argument("--stream-headers", choices=[STREAM_HEADERS_IMMEDIATE, STREAM_HEADERS_FIRST_TOKEN],
                   default=STREAM_HEADERS_IMMEDIATE,
                   help="when a stream's status and headers are sent: immediate (default: once the request is "
                        "added to the engine, before it queues or prefills, as vLLM does) or first_token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-warmup", action="store_true")
    a = p.parse_args(argv)
    if a.vocab <= RESERVED_IDS:
        p.error("--vocab must be larger than %d" % RESERVED_IDS)
    return a


def main(argv=None):
    args = parse_args(argv)
    app = App()
    app.name, app.model, app.vocab = args.name, args.model_name, args.vocab
    app.default_max_tokens, app.max_positions, app.request_timeout = args.max_tokens, args.max_positions, args.request_timeout
    app.stream_headers = args.stream_headers
    app.engine = FakeEngine(args) if args.backend == "fake" else TransformersEngine(args)
    if not args.no_warmup:
        t0 = time.time()
        st = app.engine.add("warmup", tokenize("warm up the engine " * 64, args.vocab), 4)
        while st.q.get(timeout=600) is not None:
            pass
        log("warm-up request done in %.1f s" % (time.time() - t0))
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.daemon_threads = True
    srv.app = app
    log("%s serving %s on http://%s:%d (%s backend, stream headers %s)"
        % (args.name, args.model_name, args.host, args.port, args.backend, args.stream_headers))
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        app.engine.stop()


def _on_sigterm(*_):
    raise KeyboardInterrupt  # serve_forever returns; the engine is stopped in main's finally


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    main()
