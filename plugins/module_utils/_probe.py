# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving probe and the restart watchdog's bookkeeping (private).

An endpoint can answer /health 200 while its completions hang (an engine core that is frozen or
wedged: the API server answers health from its own state). So the probe asks what a user asks:
/health, /v1/models, /version and one bounded completion, all inside one deadline.

The watchdog keeps the restarts it made for failed probes or dead engines (not for changed
settings) in a small JSON file on the head, so a crash loop is stopped and reported instead of
restarting a dying engine forever.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dgx_spark.vllm.plugins.module_utils._wait import StopWaiting, wait_for

# Seconds a running server's /health may stay silent before it counts as unhealthy: one slow reply
# must never restart a 119 GB load.
HEALTH_SETTLE_S = 4.0


# The options of a module that probes an endpoint (vllm_probe, stage_state's endpoint).
PROBE_ARGS = dict(
    served_model_name=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    prompt=dict(type="str", default="The capital of France is"),
    max_tokens=dict(type="int", default=16, no_log=False),
    timeout=dict(type="int", default=60),
)


def request(open_url, base_url, api_key, method, path, *, body=None, timeout=30):
    """One JSON request to the endpoint (`open_url` is ansible.module_utils.urls.open_url): (code, bytes).
    The key goes in the Authorization header only."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    data = json.dumps(body) if body is not None else None
    resp = open_url(base_url + path, method=method, data=data, headers=headers, timeout=timeout, use_proxy=False)
    return resp.getcode(), resp.read()


def probe(http, model, prompt, max_tokens, timeout, *, wait=wait_for, clock=time.monotonic):
    """Probe a serving endpoint. `http(method, path, body, timeout)` returns (code, bytes) and raises on
    transport errors (an HTTP error status as an exception with `.code`).

    Returns a dict: ok, step (the step that failed, or None), why, health, models, owned_by,
    engine_version, text, latency_s and tokens (of the completion), seconds (the whole probe)."""
    started = clock()
    out = dict(ok=False, step=None, why=None, health=None, models=None, owned_by=None, engine_version=None)
    out.update(text=None, latency_s=None, tokens=None)

    def left():
        return max(0.5, timeout - (clock() - started))

    def finish(step=None, why=None):
        out.update(ok=step is None, step=step, why=why, seconds=round(clock() - started, 2))
        return out

    def answered():
        try:
            code, _body = http("GET", "/health", None, min(5.0, left()))
        except Exception as exc:
            if getattr(exc, "code", None) is not None:
                raise StopWaiting("answered", exc.code) from exc
            return False, None
        return True, code

    res = wait(answered, min(HEALTH_SETTLE_S, timeout), interval=1.0)
    out["health"] = res.last
    if res.last is None:
        return finish("health", "/health did not answer within %ss" % min(HEALTH_SETTLE_S, timeout))
    if res.last != 200:
        return finish("health", "/health answered %s: the engine is dead or not ready" % res.last)

    try:
        _code, body = http("GET", "/v1/models", None, left())
        models = json.loads(body).get("data", [])
        listed = [m.get("id") for m in models]
    except Exception as exc:
        return finish("models", "GET /v1/models failed: %s" % _describe(exc))
    out["models"] = listed
    if model not in listed:
        return finish("models", "/v1/models lists %s, not the served name %s" % (listed, model))
    out["owned_by"] = next(m.get("owned_by") for m in models if m.get("id") == model)
    try:
        _code, body = http("GET", "/version", None, left())
        out["engine_version"] = json.loads(body).get("version")
    except Exception as exc:
        return finish("version", "GET /version failed: %s" % _describe(exc))

    failed, _named = _complete(http, model, prompt, max_tokens, deadline=left(), out=out, clock=clock)
    return finish("completion", failed[0]) if failed else finish()


def _complete(http, model, prompt, max_tokens, *, deadline, out, clock):
    """The bounded completion: fills text, latency_s and tokens of `out`. Returns (why, hung) when it failed,
    else (None, the model name the answer carries)."""
    asked = clock()
    body = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    try:
        _code, raw = http("POST", "/v1/completions", body, deadline)
        answer = json.loads(raw)
        out["text"] = answer["choices"][0]["text"]
        usage = answer.get("usage")
        out["tokens"] = usage.get("completion_tokens") if isinstance(usage, dict) else None
    except Exception as exc:
        out["latency_s"] = round(clock() - asked, 2)
        if "timed out" in str(exc).lower() or type(exc).__name__ in ("TimeoutError", "timeout"):
            return ("no completion within %.0fs although /health answered 200: the engine hangs" % deadline, True), None
        return ("the completion failed: %s" % _describe(exc), False), None
    out["latency_s"] = round(clock() - asked, 2)
    return None, answer.get("model")


def ask_once(http, model, prompt, max_tokens, timeout, *, wait=wait_for, clock=time.monotonic):
    """The warm check of a server already verified: the completion alone (an answer for `model` shows the
    engine serves it and generates). One refused or failed is probed in full (probe(), in the time left),
    which names the step; one that timed out is not asked again (a hung engine is not waited out twice).
    Same keys as probe(); health, owned_by and engine_version stay None when the completion answered."""
    started = clock()
    out = dict(ok=False, step=None, why=None, health=None, models=None, owned_by=None, engine_version=None)
    out.update(text=None, latency_s=None, tokens=None)
    failed, named = _complete(http, model, prompt, max_tokens, deadline=timeout, out=out, clock=clock)
    if failed and failed[1]:
        why = "no completion within %.0fs: the engine hangs" % timeout
        out.update(step="completion", why=why, seconds=round(clock() - started, 2))
        return out
    if failed:
        left = max(1, int(timeout - (clock() - started)))
        return probe(http, model, prompt, max_tokens, left, wait=wait, clock=clock)
    out.update(ok=True, models=[named or model], seconds=round(clock() - started, 2))
    return out


def local_host(host):
    """The address the node serving the API reaches it at: a wildcard bind through loopback."""
    wildcard = ("0.0.0.0", "::", "")  # noqa: S104
    return "127.0.0.1" if host in wildcard else host


def local_url(host, port):
    """http://HOST:PORT of the API as seen from the node serving it."""
    host = local_host(host)
    return "http://%s:%d" % ("[%s]" % host if ":" in host else host, int(port))


def summary(base_url, model, found):
    """What a deploy's summary shows of a server that passed its probe."""
    return dict(
        endpoint=base_url + "/v1",
        model=model,
        # None after the warm check (ask_once): the deploy takes the engine from the stage record.
        engine=None
        if found["owned_by"] is None and found["engine_version"] is None
        else "%s %s" % (found["owned_by"] or "unknown engine", found["engine_version"] or "(no version)"),
        completion=found["text"],
    )


def probe_url(open_url, base_url, params, *, once=False):
    """The serving probe of the endpoint at `base_url` (http://HOST:PORT), over Ansible's open_url;
    `params` holds the options of PROBE_ARGS. `once`: the warm check (ask_once)."""

    def http(method, path, body, limit):
        return request(open_url, base_url, params["api_key"], method, path, body=body, timeout=limit)

    how = ask_once if once else probe
    return how(http, params["served_model_name"], params["prompt"], params["max_tokens"], params["timeout"])


def _describe(exc):
    code = getattr(exc, "code", None)
    return "HTTP %s" % code if code is not None else "%s: %s" % (type(exc).__name__, exc)


# --- the watchdog's restart history ------------------------------------------------------------
def read_history(path):
    """The restarts on record (a list of {"at": epoch seconds, "why": text}); [] when none."""
    try:
        with open(path, encoding="utf-8") as handle:
            entries = json.load(handle).get("restarts", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("at"), (int, float))]


def write_history(path, entries, keep=50):
    """Write the history atomically (the newest `keep` entries); an error text, or None."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"restarts": entries[-keep:]}, handle, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        return str(exc)
    return None


def restart_decision(history, now, max_restarts, window, backoff):
    """What the watchdog does about a failed engine: ("restart", seconds to wait first, recent entries)
    or ("crash_loop", 0, recent entries) when max_restarts restarts already happened in the last
    `window` seconds. The wait doubles with each recent restart, counted from the newest one."""
    recent = [e for e in history if now - e["at"] < window]
    if len(recent) >= max_restarts:
        return "crash_loop", 0, recent
    if not recent:
        return "restart", 0, recent
    due = recent[-1]["at"] + backoff * 2 ** (len(recent) - 1)
    return "restart", max(0, round(due - now, 1)), recent


def crash_loop_message(recent, window, max_restarts, path):
    at = ", ".join(time.strftime("%H:%M:%S", time.gmtime(e["at"])) + " UTC (%s)" % e.get("why", "?") for e in recent)
    return (
        "crash loop: the engine was restarted %d time(s) in the last %ds (%s), which reaches "
        "vllm_server_max_restarts (%d) in vllm_server_restart_window; not restarting it again. "
        "Read the log lines below and fix the cause; then a deploy with changed settings restarts it, as "
        "does one after the window has passed or after removing %s on the head"
        % (len(recent), window, at, max_restarts, path)
    )
