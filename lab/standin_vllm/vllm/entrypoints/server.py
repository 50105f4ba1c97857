"""OpenAI-compatible HTTP endpoints of the stand-in (standard library server)."""

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm.engine import load_delay, make_engine
from vllm.model_executor.models.registry import ModelRegistry
from vllm.plugins import load_general_plugins
from vllm.version import BANNER

OWNED_BY = "vllm-lab-standin"


def read_model_config(model):
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ValueError("%s: no config.json (the lab stand-in serves local model directories only)" % model)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class State:
    def __init__(self, args, engine, arch):
        self.args = args
        self.engine = engine
        self.arch = arch
        self.names = args.served_model_name or [args.model_tag]
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY")
        self.dead = False
        self.lock = threading.Lock()
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "running": 0}

    def healthy(self):
        if not self.dead and not self.engine.alive():
            self.dead = True  # an engine that lost a rank stays dead, as vLLM's does
        return not self.dead


def _handler(state):
    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-lab-standin"

        def log_message(self, fmt, *args):
            sys.stderr.write("INFO:     %s - %s\n" % (self.address_string(), fmt % args))

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self):
            if not state.api_key:
                return True
            return self.headers.get("Authorization", "") == "Bearer " + state.api_key

        def do_GET(self):
            if self.path == "/health":
                return self._send(200 if state.healthy() else 503, b"", "text/plain")
            if self.path == "/metrics":
                return self._send(200, self._metrics().encode(), "text/plain; version=0.0.4")
            if self.path == "/version":
                return self._send(200, {"version": BANNER})
            if not self._authorized():
                return self._send(401, {"error": "Unauthorized"})
            if self.path == "/v1/models":
                data = [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": OWNED_BY,
                        "root": state.args.model_tag,
                        "max_model_len": state.args.max_model_len,
                    }
                    for name in state.names
                ]
                return self._send(200, {"object": "list", "data": data})
            return self._send(404, {"error": "Not Found"})

        def do_POST(self):
            if not self._authorized():
                return self._send(401, {"error": "Unauthorized"})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"error": "Not Found"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            except ValueError:
                return self._send(400, {"error": "invalid JSON"})
            if body.get("model") not in state.names:
                return self._send(404, {"error": "The model `%s` does not exist." % body.get("model")})
            chat = self.path.endswith("chat/completions")
            messages = body.get("messages", [])
            prompt = " ".join(m.get("content", "") for m in messages) if chat else body.get("prompt", "")
            with state.lock:
                state.counters["running"] += 1
            try:
                parts = state.engine.generate(str(prompt), int(body.get("max_tokens") or 16))
            except Exception as exc:  # a failed rank is an engine death
                state.dead = True
                return self._send(500, {"error": "EngineDeadError: %s" % exc})
            finally:
                with state.lock:
                    state.counters["running"] -= 1
            text = "[lab stand-in] " + "; ".join(p["text"] for p in parts)
            usage = {"prompt_tokens": parts[0]["prompt_tokens"], "completion_tokens": sum(p["tokens"] for p in parts)}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            with state.lock:
                state.counters["requests"] += 1
                state.counters["prompt_tokens"] += usage["prompt_tokens"]
                state.counters["generation_tokens"] += usage["completion_tokens"]
            choice = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return self._send(
                200,
                {
                    "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [choice],
                    "usage": usage,
                },
            )

        def _metrics(self):
            name = state.names[0]
            c = state.counters
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                'vllm:num_requests_running{model_name="%s"} %d' % (name, c["running"]),
                "# TYPE vllm:request_success_total counter",
                'vllm:request_success_total{model_name="%s"} %d' % (name, c["requests"]),
                "# TYPE vllm:prompt_tokens_total counter",
                'vllm:prompt_tokens_total{model_name="%s"} %d' % (name, c["prompt_tokens"]),
                "# TYPE vllm:generation_tokens_total counter",
                'vllm:generation_tokens_total{model_name="%s"} %d' % (name, c["generation_tokens"]),
                "# HELP vllm:lab_standin_workers Workers (ranks) of the lab stand-in engine.",
                "# TYPE vllm:lab_standin_workers gauge",
                'vllm:lab_standin_workers{model_name="%s"} %d' % (name, len(state.engine.infos)),
            ]
            return "\n".join(lines) + "\n"

    return Handler


def serve(args):
    print(BANNER, flush=True)
    print("INFO: non-default args: %s" % {k: v for k, v in vars(args).items() if v not in (None, False)}, flush=True)
    load_general_plugins()
    config = read_model_config(args.model_tag)
    arch, cls = ModelRegistry.resolve_model_cls(config.get("architectures") or [])
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    engine = make_engine((args.served_model_name or [args.model_tag])[0], args.distributed_executor_backend, world)
    for info in engine.infos:
        print("INFO: worker rank %(rank)d on node %(node)s (%(ip)s)" % info, flush=True)
    print("INFO: placement group strategy: %s; model class %s" % (engine.strategy, cls), flush=True)
    load_delay()
    state = State(args, engine, arch)
    httpd = ThreadingHTTPServer((args.host or "0.0.0.0", args.port), _handler(state))  # noqa: S104 - vLLM's default
    print("INFO: Starting vLLM API server on http://%s:%d" % (args.host or "0.0.0.0", args.port), flush=True)  # noqa: S104
    print("INFO:     Application startup complete.", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.serve_forever()
    return 0
