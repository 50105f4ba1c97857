"""Bandwidth arithmetic, log parsing and the verdict, on payload output recorded on two H200s."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_test as nt
from module_runner import fixture_text


def log(name):
    return fixture_text("nccl_test", name + ".log")


@pytest.mark.parametrize(
    ("op", "ranks", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_gather", 2, 0.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 8, 0.875),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_factor_nccl_tests_definitions(op, ranks, factor):
    assert nt.bus_factor(op, ranks) == pytest.approx(factor)


@pytest.mark.parametrize(("op", "ranks"), [("broadcast", 2), ("all_reduce", 0)])
def test_bus_factor_rejects(op, ranks):
    with pytest.raises(ValueError):
        nt.bus_factor(op, ranks)


def test_bandwidth_on_recorded_result():
    payload = nt.parse_payload_output(log("nccl_default"))
    rows = {(r["op"], r["bytes"]): nt.bandwidth(r, payload["world_size"]) for r in payload["results"]}
    big_reduce = rows[("all_reduce", 268435456)]
    assert big_reduce["algbw_gbps"] == pytest.approx(268435456 / big_reduce["seconds"] / 1e9, abs=1e-3)
    assert big_reduce["busbw_gbps"] == big_reduce["algbw_gbps"]  # 2(n-1)/n = 1 for two ranks
    big_gather = rows[("all_gather", 268435456)]
    assert big_gather["busbw_gbps"] == pytest.approx(big_gather["algbw_gbps"] / 2, abs=1e-3)
    assert nt.bandwidth(dict(op="all_gather", bytes=10, seconds=0), 2)["busbw_gbps"] == 0.0


def test_payload_output_absent():
    assert nt.parse_payload_output("NCCL INFO nothing here\n") is None


def test_transport_recorded_nvlink():
    found = nt.parse_transport(log("nccl_default"))
    assert found["transports"] == ["P2P"] and found["channels"] == ["P2P/CUMEM"]
    assert found["nccl_version"] == "2.28.9+cuda13.0" and found["ib_devices"] == []


def test_transport_recorded_socket():
    found = nt.parse_transport(log("nccl_socket"))
    assert found["transports"] == ["NET/Socket"] and found["socket_interfaces"] == ["lo"]
    assert found["networks"] == ["Socket"]


def test_transport_ib_twins():
    found = nt.parse_transport(log("nccl_ib_two_twins"))
    assert found["transports"] == ["NET/IB"] and found["ib_devices"] == ["roceP2p1s0f1", "rocep1s0f1"]
    assert found["nnodes"] == 2 and found["networks"] == ["IB"]


def test_verdict_recorded_nvlink_passes():
    out = nt.verdict(nt.parse_payload_output(log("nccl_default")), log("nccl_default"), 21.875, "all_gather", 1)
    assert out["passed"] and out["problems"] == []
    assert out["peak_busbw_gbps"]["all_gather"] > 200 and out["peak_busbw_gbps"]["all_reduce"] > 250
    assert out["nccl_version"] == "2.28.9" and out["world_size"] == 2


def test_verdict_recorded_socket_fails_naming_sockets():
    out = nt.verdict(nt.parse_payload_output(log("nccl_socket")), log("nccl_socket"), 21.875, "all_gather", 2)
    assert not out["passed"]
    assert "below the threshold 21.875" in out["problems"][0] and "NET/Socket over lo" in out["problems"][0]


def test_verdict_threshold_is_the_decision():
    text = log("nccl_socket")
    payload = nt.parse_payload_output(text)
    peak = nt.verdict(payload, text, 0.0, "all_gather", 2)["peak_busbw_gbps"]["all_gather"]
    assert nt.verdict(payload, text, peak, "all_gather", 2)["passed"]
    assert not nt.verdict(payload, text, peak + 0.001, "all_gather", 2)["passed"]


def test_verdict_ib_two_twins_passes_and_one_hca_names_it():
    two = nt.verdict(
        nt.parse_payload_output(log("nccl_ib_two_twins")), log("nccl_ib_two_twins"), 21.875, "all_gather", 2
    )
    assert two["passed"], two["problems"]
    one = nt.verdict(nt.parse_payload_output(log("nccl_ib_one_hca")), log("nccl_ib_one_hca"), 21.875, "all_gather", 2)
    assert not one["passed"] and "only 1 RDMA device (rocep1s0f1)" in one["problems"][0]


def test_verdict_wrong_values_fail():
    payload = nt.parse_payload_output(log("nccl_default"))
    payload["errors"] = ["all_reduce sum: 3 of 10 elements wrong"]
    out = nt.verdict(payload, log("nccl_default"), 1.0, "all_gather", 1)
    assert not out["passed"] and out["problems"][0].startswith("result values are wrong")


def test_verdict_threshold_op_not_run():
    payload = nt.parse_payload_output(log("nccl_default"))
    payload["results"] = [r for r in payload["results"] if r["op"] == "all_reduce"]
    out = nt.verdict(payload, log("nccl_default"), 1.0, "all_gather", 1)
    assert not out["passed"] and "was not run" in out["problems"][0]


@pytest.mark.parametrize(
    ("transport", "nnodes", "words"),
    [
        (dict(transports=["NET/IB"], ib_devices=["a", "b"]), 2, "MTU 9000"),
        (dict(transports=[], ib_devices=[]), 2, "NCCL_DEBUG=INFO"),
        (dict(transports=["P2P"], ib_devices=[]), 1, "single node (P2P)"),
    ],
)
def test_likely_cause(transport, nnodes, words):
    transport.setdefault("socket_interfaces", [])
    assert words in nt.likely_cause(transport, nnodes)


def params(**extra):
    base = dict(
        nnodes=2,
        node_rank=1,
        master_addr="198.18.10.1",
        master_port=29511,
        sizes=[1 << 20, 8 << 20],
        ops=["all_reduce", "all_gather"],
        warmup=5,
        iters=20,
        timeout=300,
        threshold_op="all_gather",
    )
    base.update(extra)
    return base


def test_launch_args():
    args = nt.launch_args(params(), 1, "/p/payload.py")
    assert args[:2] == ["-m", "torch.distributed.run"]
    assert "--nnodes=2" in args and "--node-rank=1" in args and "--master-addr=198.18.10.1" in args
    assert args[args.index("/p/payload.py") + 1] == "--sizes=1048576,8388608"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (dict(sizes=[17 << 30]), "sizes: 18253611008 bytes is outside"),
        (dict(sizes=[10]), "outside 1024"),
        (dict(node_rank=2), "node_rank (2) must be below nnodes (2)"),
        (dict(ops=["all_reduce"]), "threshold_op all_gather is not in ops"),
        (dict(iters=0), "iters must be positive"),
        (dict(warmup=-1), "warmup must be positive"),
    ],
)
def test_check_params(extra, words):
    assert any(words in e for e in nt.check_params(params(**extra)))


def test_check_params_defaults_clean():
    assert nt.check_params(params(sizes=list(nt.DEFAULT_SIZES))) == []
