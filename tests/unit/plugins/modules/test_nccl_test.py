"""nccl_test: skip, host and image runs, timeout and verdicts, on payload output recorded on two H200s;
the NCCL library read, on its output recorded on an H200 and in the lab's CPU runtime image."""

from __future__ import annotations

from _gpu_fakes import FakeSmi
from ansible_collections.dgx_spark.vllm.plugins.modules import nccl_test
from module_runner import fixture_text, run_module

ARGS = dict(master_addr="127.0.0.1", timeout=120)


def host_run(monkeypatch, log_name=None, *, rc=0, text=None, present=True, device_nodes=True, library="default.out"):
    smi = FakeSmi().install(monkeypatch, present=present)
    # The driver's control device: this test file stands in for one that exists.
    monkeypatch.setattr(nccl_test, "NVIDIA_CONTROL_DEVICE", __file__ if device_nodes else "/nonexistent/nvidiactl")
    seen = {}

    def other(args, **kwargs):
        if "--library" in args:
            seen["library_args"] = args
            return 0, fixture_text("nccl_library", library), ""
        seen["args"], seen["env"] = args, kwargs.get("environ_update")
        with open(args[args.index("-m") + 7], encoding="utf-8") as handle:  # payload path
            seen["payload"] = handle.read()
        return rc, text if text is not None else fixture_text("nccl_test", log_name + ".log"), ""

    smi.other = other
    return smi, seen


def test_no_gpu_is_skipped_without_running(monkeypatch):
    _smi, seen = host_run(monkeypatch, "nccl_default", present=False, library="lab_runtime.out")
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert not failed and result["skipped"] and "not installed" in result["reason"]
    assert result["results"] == [] and "args" not in seen
    # The library is read all the same: the lab's CPU build has none, and says why.
    assert seen["library_args"][-2:] == [seen["library_args"][-2], "--library"]
    assert result["library"]["line"].startswith("not available: torch 2.13.0+cpu is a CPU build")


def test_library_only(monkeypatch):
    _smi, seen = host_run(monkeypatch, "nccl_default")
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, run_test=False))
    assert not failed and result["skipped"] and "args" not in seen
    assert result["reason"] == "run_test is false: only the NCCL library was read"
    assert result["library"]["build"] == "pip" and result["library"]["version"] == "2.28.9"


def test_library_read_that_fails_is_not_available(monkeypatch):
    smi, _seen = host_run(monkeypatch, "nccl_default", present=False)

    def broken(args, **kwargs):
        return 1, "", "python3: can't open file '/x/dgx_spark_nccl_payload.py'\n"

    smi.other = broken
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert not failed and not result["library"]["available"]
    assert result["library"]["line"] == (
        "not available: the library read exited 1: python3: can't open file '/x/dgx_spark_nccl_payload.py'"
    )


def test_simulated_gpu_without_device_nodes_is_skipped(monkeypatch):
    _smi, seen = host_run(monkeypatch, "nccl_default", device_nodes=False)
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert not failed and result["skipped"]
    assert "lists 2 GPU(s) but /nonexistent/nvidiactl is missing" in result["reason"]
    assert result["results"] == [] and "args" not in seen


def test_recorded_nvlink_run_passes(monkeypatch):
    _smi, seen = host_run(monkeypatch, "nccl_default")
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, env={"NCCL_NVLS_ENABLE": 0}))
    assert not failed and not result["changed"] and not result["skipped"] and result["passed"]
    assert result["transport"]["transports"] == ["P2P"]
    assert len(result["results"]) == 8 and all(r["correct"] for r in result["results"])
    assert seen["args"][:4] == ["/usr/bin/timeout", "--kill-after=10", "120", "/usr/bin/python3"]
    assert "--nproc-per-node=2" in seen["args"]  # two GPUs listed by nvidia-smi
    assert seen["env"] == {"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO"}
    assert "def run(argv=None)" in seen["payload"]
    assert result["library"]["build"] == "pip" and result["library"]["path"].endswith("/nvidia/nccl/lib/libnccl.so.2")


def test_recorded_socket_run_fails_naming_the_cause(monkeypatch):
    host_run(monkeypatch, "nccl_socket")
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, nnodes=2, gpus_per_node=1))
    assert failed and "NET/Socket over lo" in result["msg"]
    assert result["peak_busbw_gbps"]["all_gather"] < 21.875


def test_timeout(monkeypatch):
    host_run(monkeypatch, text="", rc=124)
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert failed and "timed out after 120 s" in result["msg"] and "127.0.0.1:29511" in result["msg"]


def test_image_without_cuda_is_skipped(monkeypatch):
    line = 'NCCL_TEST_RESULT {"reason": "no CUDA device visible to PyTorch (torch 2.9.0+cpu)", "skipped": true}\n'
    host_run(monkeypatch, text=line)
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert not failed and result["skipped"] and "no CUDA device" in result["reason"]


def test_worker_reports_no_numbers(monkeypatch):
    host_run(monkeypatch, text="NCCL INFO worker side\n")
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, nnodes=2, node_rank=1))
    assert not failed and result["passed"] and result["results"] == []


def test_no_result_on_head_fails(monkeypatch):
    host_run(monkeypatch, text="Error while finding module specification for 'torch.distributed.run'\n", rc=1)
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert failed and "exited 1 without a result: Error while finding" in result["msg"]


def test_payload_refusal(monkeypatch):
    host_run(monkeypatch, text='NCCL_TEST_RESULT {"failed": true, "reason": "sizes out of range"}\n', rc=2)
    failed, result = run_module(monkeypatch, nccl_test, ARGS)
    assert failed and "refused to run: sizes out of range" in result["msg"]


def test_bad_sizes_fail_before_anything_runs(monkeypatch):
    smi, seen = host_run(monkeypatch, "nccl_default")
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, sizes=[16 << 30]))
    assert failed and result["msg"].startswith("sizes: 17179869184 bytes is outside")
    assert smi.calls == [] and "args" not in seen


class FakeContainer:
    def __init__(self, log):
        self.log = log
        self.removed = False

    def wait(self, timeout):
        return {"StatusCode": 0}

    def logs(self, stdout, stderr):
        return self.log.encode()

    def remove(self, force):
        self.removed = True


class FakeClient:
    """The engine: the library read answers a recorded library, the test the given log."""

    def __init__(self, log, library="default.out"):
        self.container = FakeContainer(log)
        self.library = FakeContainer(fixture_text("nccl_library", library))
        self.containers = self
        self.kwargs = None
        self.library_kwargs = None
        self.refuse = None

    def run(self, image, **kwargs):
        if self.refuse and kwargs["device_requests"]:
            raise nccl_test.APIError("500 Server Error", explanation=self.refuse)
        if "--library" in kwargs["command"]:
            self.library_kwargs = kwargs
            return self.library
        self.image, self.kwargs = image, kwargs
        return self.container


def test_image_run_overrides_entrypoint(monkeypatch):
    FakeSmi().install(monkeypatch)
    monkeypatch.setattr(nccl_test, "NVIDIA_CONTROL_DEVICE", __file__)
    client = FakeClient(fixture_text("nccl_test", "nccl_default.log"))
    monkeypatch.setattr(nccl_test, "docker_client", lambda module: client)
    failed, result = run_module(
        monkeypatch, nccl_test, dict(ARGS, image="runtime:good", devices=["/dev/infiniband"], gpus_per_node=1)
    )
    assert not failed and result["passed"] and result["entrypoint"] == "python3"
    kwargs = client.kwargs
    assert client.image == "runtime:good" and kwargs["entrypoint"] == ["python3"]
    assert kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host"
    assert kwargs["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert kwargs["command"][kwargs["command"].index("-m") + 7] == "/opt/dgx-spark-nccl-test/dgx_spark_nccl_payload.py"
    assert client.container.removed and client.library.removed
    assert client.library_kwargs["command"] == ["/opt/dgx-spark-nccl-test/dgx_spark_nccl_payload.py", "--library"]
    assert client.library_kwargs["device_requests"]  # the GPUs too: as the engine will run
    # No network, RDMA devices or locked memory for the read (a lab engine refuses memlock).
    assert client.library_kwargs["network_mode"] == "none" and client.library_kwargs["ulimits"] == []
    assert client.library_kwargs["devices"] == [] and kwargs["ulimits"]
    assert result["library"]["package"] == "nvidia-nccl-cu13 2.28.9"


def test_lab_image_without_gpu_reads_the_library_only(monkeypatch):
    FakeSmi().install(monkeypatch)  # the lab's simulator: GPUs listed, no driver device nodes
    monkeypatch.setattr(nccl_test, "NVIDIA_CONTROL_DEVICE", "/nonexistent/nvidiactl")
    client = FakeClient("", library="lab_runtime.out")
    client.refuse = 'could not select device driver "" with capabilities: [[gpu]]'  # as the lab's engine would
    monkeypatch.setattr(nccl_test, "docker_client", lambda module: client)
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, image="dgx-spark/vllm-runtime:in-service"))
    assert not failed and result["skipped"] and client.kwargs is None
    assert client.library_kwargs["device_requests"] == []
    library = result["library"]
    assert not library["available"] and library["builds"] == []
    assert library["line"] == (
        "not available: torch 2.13.0+cpu is a CPU build; no libnccl.so.2 can be loaded: "
        "libnccl.so.2: cannot open shared object file: No such file or directory"
    )


def test_engine_without_gpu_runtime_is_named(monkeypatch):
    FakeSmi().install(monkeypatch)
    monkeypatch.setattr(nccl_test, "NVIDIA_CONTROL_DEVICE", __file__)
    client = FakeClient("")
    client.refuse = 'could not select device driver "" with capabilities: [[gpu]]'
    monkeypatch.setattr(nccl_test, "docker_client", lambda module: client)
    failed, result = run_module(monkeypatch, nccl_test, dict(ARGS, image="runtime:good", gpus_per_node=1))
    assert failed and result["msg"].startswith("image: the Docker engine on this node cannot give containers its GPUs")
    assert "NVIDIA Container Toolkit" in result["msg"]
