"""The `vllm serve` flag check, against the recorded help texts of real vLLM releases.

tests/unit/fixtures/vllm_help/ holds, per release, the real `vllm serve --help=all` text, the option
strings that release's own parser registers, and whether that parser accepted a set of argument
lists (README.md there says how each was recorded).
"""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_args
from module_runner import FIXTURES

HELP_DIR = os.path.join(FIXTURES, "vllm_help")
RELEASES = sorted(
    (os.path.basename(path)[: -len(".txt")] for path in glob.glob(os.path.join(HELP_DIR, "*.txt"))),
    key=lambda v: tuple(int(x) for x in v.split(".")),
)
IMAGE = "sha256:a9d32715c8c0860700c649c56001714a48d23815d2a4109c691b1a3f4b848fe7"


def help_text(release):
    with open(os.path.join(HELP_DIR, release + ".txt"), encoding="utf-8") as handle:
        return handle.read()


def recorded_json(release, kind):
    with open(os.path.join(HELP_DIR, "%s.%s.json" % (release, kind)), encoding="utf-8") as handle:
        return json.load(handle)


def flags(release):
    return _vllm_args.parse_help_flags(help_text(release))


def refusals(release, args):
    """What the check refuses in args against a release (flags this module manages left aside)."""
    where = _vllm_args.engine_where(release, IMAGE)
    static = [p for p in _vllm_args.static_problems(args) if "is set by this module" not in p]
    return static + _vllm_args.unknown_problems(args, flags(release), where)


def test_every_release_from_0_17_to_0_33_is_recorded():
    assert RELEASES[0] == "0.17.0" and RELEASES[-1] == "0.33.0"
    assert {"0.17.0", "0.32.0", "0.33.0"} <= set(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_parse_finds_exactly_the_parsers_own_option_strings(release):
    # The help lists (and, for 0.33's --enable-x/--disable-x pairs, implies) what the parser registers.
    assert flags(release) == frozenset(recorded_json(release, "options"))


@pytest.mark.parametrize("release", RELEASES)
def test_the_flags_this_module_emits_and_manages_are_found(release):
    found = flags(release)
    assert _vllm_args.missing_emitted(found) == []
    for name in ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--host", "--port", "--api-key"):
        assert name in found
    # Prose, the usage line and the JSON tip's examples are not flags.
    assert not any(f.startswith("--json-arg") or "." in f for f in found)


@pytest.mark.parametrize(
    ("release", "count"),
    [("0.17.0", 307), ("0.25.0", 366), ("0.32.0", 430), ("0.33.0", 485)],
)
def test_flag_counts(release, count):
    assert len(flags(release)) == count


@pytest.mark.parametrize("release", RELEASES)
def test_every_recorded_verdict_of_the_real_parser_is_matched(release):
    """Accepted by the real parser -> accepted here; refused there -> refused here, except where the
    check is stricter on purpose: abbreviations (argparse takes a unique prefix, which a later release
    can make ambiguous) and -O.x (parsed as --optimization-level .x, which the engine's config refuses)."""
    stricter = {"--enable-prefix-cachin", "--max-model 64", "-O.mode=3"}
    for case, verdict in recorded_json(release, "accepts").items():
        ours = refusals(release, case.split(" "))
        if case in stricter:
            assert verdict == "accepted" and ours, case
        elif verdict == "accepted":
            assert ours == [], (case, ours)
        else:
            assert ours, (case, verdict)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    "args",
    [
        ["--attention-backend", "FLASH_ATTN"],
        ["-O3"],
        ["-O", "3"],
        ["-O=2"],
        ["--max-cudagraph-capture-size", "8"],
        ["--mm-processor-cache-type", "shm"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        ["--language-model-only"],
        ["--reasoning-parser", "qwen3"],
        ["--max_num_seqs=8"],
        ["--compilation-config.mode=3"],
        ["--enable-prefix-caching"],
    ],
)
def test_flags_every_release_has_are_accepted(release, args):
    assert refusals(release, args) == []


@pytest.mark.parametrize("release", RELEASES)
def test_underscores_are_read_as_dashes(release):
    assert _vllm_args.flag_names(["--max_model_len=64"]) == ["--max-model-len"]
    assert "--max-model-len" in flags(release)
    # ... which this module sets itself: refused with the option to use instead.
    problems = _vllm_args.check_extra_args(["--max_model_len", "64"], flags(release), "x")
    assert problems == [
        "vllm_server_extra_args: --max-model-len is set by this module; remove it and use the option "
        "max_model_len (vllm_server_max_model_len) instead"
    ]


def test_removed_flags_are_refused_per_release():
    assert "--swap-space" in flags("0.17.0")
    for release in ("0.25.0", "0.32.0", "0.33.0"):
        assert "--swap-space" not in flags(release)
    for release in RELEASES:
        assert "--preemption-mode" not in flags(release)
    assert refusals("0.17.0", ["--swap-space", "4"]) == []
    assert refusals("0.33.0", ["--swap-space", "4"]) == [
        "vllm_server_extra_args: --swap-space is not a flag of vllm serve in vLLM 0.33.0 "
        "(image sha256:a9d32715c8c0); remove it"
    ]


def test_enable_disable_pairs_of_0_33():
    # 0.33 lists `--enable-x, --disable-x`; the old `--no-enable-x` still works (hidden from help).
    assert refusals("0.33.0", ["--disable-prefix-caching"]) == []
    assert refusals("0.33.0", ["--no-enable-prefix-caching"]) == []
    assert refusals("0.33.0", ["--disable-log-requests"]) == []
    assert refusals("0.33.0", ["--no-disable-chunked-prefill"])
    assert refusals("0.32.0", ["--disable-prefix-caching"])
    assert refusals("0.32.0", ["--no-enable-prefix-caching"]) == []


def test_misspelling_names_the_closest_flag():
    assert refusals("0.32.0", ["--enable-prefix-cachin"]) == [
        "vllm_server_extra_args: --enable-prefix-cachin is not a flag of vllm serve in vLLM 0.32.0 "
        "(image sha256:a9d32715c8c0); did you mean --enable-prefix-caching?"
    ]
    (problem,) = _vllm_args.check_extra_args(["--max-model-lenn", "64"], flags("0.32.0"), "vLLM 0.32.0")
    assert "--max-model-lenn is not a flag" in problem
    assert "did you mean --max-model-len? It is set by this module: use the option max_model_len" in problem
    (problem,) = refusals("0.33.0", ["--reasoning_parsr", "qwen3"])
    assert "--reasoning_parsr (read as --reasoning-parsr)" in problem and "did you mean --reasoning-parser?" in problem


def test_o_forms():
    assert _vllm_args.flag_names(["-O3", "-O=2", "-Odecode"]) == ["--optimization-level"] * 3
    assert _vllm_args.flag_names(["-O", "3"]) == ["--optimization-level"]
    assert _vllm_args.flag_names(["-O", "x"]) == ["-O"]
    (problem,) = refusals("0.33.0", ["-O", "x"])
    assert "-O followed by 0, 1, 2 or 3" in problem
    (problem,) = refusals("0.33.0", ["-O.mode=3"])
    assert "write --compilation-config.mode=3" in problem


def test_the_builtin_table_is_0_33():
    assert _vllm_args.BUILTIN_TABLE_RELEASE == "0.33.0"
    assert flags("0.33.0") == _vllm_args.KNOWN_FLAGS
    table = _vllm_args.check_extra_args
    assert table(["--attention-backend", "X", "-O3", "--max-cudagraph-capture-size", "8"]) == []
    assert table(["--mm-processor-cache-type", "shm", "--language-model-only"]) == []
    for gone in ("--swap-space", "--preemption-mode"):
        (problem,) = table([gone])
        assert "is not a flag of vllm serve in the built-in table of vLLM 0.33.0" in problem


def test_static_refusals_name_the_variable_and_keep_values_out():
    problems = _vllm_args.static_problems(["--hf_token=hf_secret", "--api-key=sk-secret", "--max-num-seqs 8"])
    assert all(p.startswith("vllm_server_extra_args: ") for p in problems)
    assert "set HF_TOKEN in vllm_server_env" in problems[0]
    assert "use the option api_key (vllm_server_api_key)" in problems[1]
    assert "'--max-num-seqs ...' holds a space" in problems[2]
    assert "secret" not in json.dumps(problems)
    (problem,) = _vllm_args.static_problems(["--enforce-eager \\"])
    assert "shell line fragment" in problem
    assert "--device-memory-utilization" in _vllm_args.MANAGED_FLAGS  # 0.33's alias of the managed flag


def answer_line(**answer):
    base = {"version": "0.32.0", "help": help_text("0.32.0"), "command": ["python3", "-m", "x"], "error": ""}
    base.update(answer)
    return "INFO noise\n" + _vllm_args.ASK_MARKER + json.dumps(base) + "\n"


def test_reading_the_answer():
    answer, why = _vllm_args.read_answer(answer_line())
    assert why is None
    found, version, why = _vllm_args.flags_from_answer(answer)
    assert version == "0.32.0" and len(found) == 430 and why is None


@pytest.mark.parametrize(
    ("output", "needle"),
    [
        ("Traceback ...\nModuleNotFoundError: No module named 'vllm'\n", "printed no answer: ModuleNotFoundError"),
        ("", "printed no answer"),
        (_vllm_args.ASK_MARKER + "{not json\n", "not JSON"),
        (answer_line(help="", error="python3 -m vllm... exited 1: RuntimeError: x"), "no help text (python3 -m"),
        (answer_line(help="usage: vllm serve\n  --port PORT  Port.\n"), "not --served-model-name"),
    ],
)
def test_an_engine_that_cannot_be_asked_says_why(output, needle):
    answer, why = _vllm_args.read_answer(output)
    if answer is not None:
        _flags, _version, why = _vllm_args.flags_from_answer(answer)
    assert needle in why


def test_cache_round_trip(tmp_path):
    cache = str(tmp_path / "cache")
    found = flags("0.32.0")
    assert _vllm_args.read_cache(cache, IMAGE) is None
    assert _vllm_args.write_cache(cache, IMAGE, found, "0.32.0", ["python3"]) is None
    path = _vllm_args.cache_file(cache, IMAGE)
    assert os.path.basename(path) == IMAGE.split(":")[1] + ".json"
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert _vllm_args.read_cache(cache, IMAGE) == {"flags": found, "vllm_version": "0.32.0"}
    # Another image, a corrupt file, or a record without the emitted flags is a miss.
    assert _vllm_args.read_cache(cache, "sha256:" + "0" * 64) is None
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("{")
    assert _vllm_args.read_cache(cache, IMAGE) is None
    _vllm_args.write_cache(cache, IMAGE, ["--port"], "0.32.0")
    assert _vllm_args.read_cache(cache, IMAGE) is None


def test_cache_dir_not_writable_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _vllm_args.write_cache(str(blocker / "sub"), IMAGE, ["--port"], "0.32.0")


@pytest.mark.parametrize(
    ("case", "plan"),
    [
        # (state, running, image of the running container, image option, that image's ID on the node)
        (("started", True, "sha256:a", "img", None), ("container", "sha256:a")),
        (("started", True, "sha256:a", None, None), ("container", "sha256:a")),
        (("checked", True, "sha256:a", None, None), ("container", "sha256:a")),
        (("checked", True, "sha256:a", "img", "sha256:a"), ("container", "sha256:a")),
        (("checked", True, "sha256:a", "img", "sha256:b"), ("image", "sha256:b")),
        (("checked", False, None, "img", "sha256:b"), ("image", "sha256:b")),
        (("checked", False, None, "img", None), ("deferred", None)),
        (("checked", True, "sha256:a", "img", None), ("deferred", None)),
        (("checked", False, None, None, None), ("deferred", None)),
    ],
)
def test_where_the_engine_is_asked(case, plan):
    source, image_id, how = _vllm_args.ask_plan(*case)
    assert (source, image_id) == plan
    if source == "deferred":
        assert how.startswith("deferred (") and how.endswith("checked again before serving)")
    if case[3] and source == "deferred":
        assert how == "deferred (image not on the head yet; checked again before serving)"


def test_throwaway_container_overrides_the_entrypoint_without_network():
    kwargs = _vllm_args.throwaway_kwargs(IMAGE, "python3", 110, "n")
    assert kwargs["entrypoint"] == ["python3"]
    assert kwargs["command"] == ["-c", _vllm_args.INSTALLED_FLAGS_SCRIPT, "110"]
    assert kwargs["network_disabled"] is True and kwargs["remove"] is True


def test_the_ask_script_runs_the_cli_help(tmp_path):
    """The script itself, run by this Python against a package that answers like vLLM's CLI module."""
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("__version__ = '0.33.0'\n")
    (tmp_path / "vllm" / "entrypoints" / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        "import sys\n"
        "assert sys.argv[1:] == ['serve', '--help=all'], sys.argv\n"
        "sys.stdout.write(open(%r, encoding='utf-8').read())\n" % os.path.join(HELP_DIR, "0.33.0.txt")
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _vllm_args.INSTALLED_FLAGS_SCRIPT, "60"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answer, why = _vllm_args.read_answer(proc.stdout)
    assert why is None, proc.stdout[-500:]
    found, version, why = _vllm_args.flags_from_answer(answer)
    assert version == "0.33.0" and found == _vllm_args.KNOWN_FLAGS
    assert answer["command"][1:] == ["-m", "vllm.entrypoints.cli.main", "serve", "--help=all"]
