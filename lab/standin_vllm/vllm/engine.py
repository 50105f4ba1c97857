"""Ray side of the stand-in: a placement group of TP x PP one-GPU bundles, one worker per bundle."""

import os
import socket
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

NAMESPACE = "vllm-standin"


def worker_name(model, rank):
    """Named actors, so an operator (or a test) can find and kill one rank."""
    return "%s/rank%d" % (model, rank)


def spread_strategy(bundles, nodes):
    """STRICT_SPREAD puts every bundle on its own node; impossible with more bundles than nodes."""
    return "STRICT_SPREAD" if bundles <= nodes else "SPREAD"


@ray.remote(num_cpus=0, num_gpus=1)
class StandInWorker:
    """One rank. Its text names its node, so a response proves which nodes took part."""

    def __init__(self, rank, model):
        self.rank = rank
        self.model = model
        self.node = os.environ.get("VLLM_STANDIN_NODE_NAME") or socket.gethostname()
        self.ip = ray.util.get_node_ip_address()

    def info(self):
        return {"rank": self.rank, "node": self.node, "ip": self.ip, "gpu_ids": ray.get_gpu_ids()}

    def generate(self, prompt, max_tokens):
        words = ["rank %d on %s (%s)" % (self.rank, self.node, self.ip)]
        return {"text": " ".join(words), "tokens": min(max_tokens, 8), "prompt_tokens": len(prompt.split())}


class RayEngine:
    def __init__(self, model, world_size, pg_timeout):
        ray.init(
            address=os.environ.get("RAY_ADDRESS", "auto"),
            namespace=NAMESPACE,
            logging_level="warning",
            log_to_driver=False,
        )
        nodes = [n for n in ray.nodes() if n["Alive"]]
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if world_size > gpus:
            raise ValueError(
                "The number of required GPUs (%d) exceeds the total number of available GPUs (%d) "
                "in the Ray cluster (%d alive nodes)." % (world_size, gpus, len(nodes))
            )
        self.strategy = spread_strategy(world_size, len(nodes))
        self.pg = placement_group([{"GPU": 1}] * world_size, strategy=self.strategy)
        if not self.pg.wait(pg_timeout):
            remove_placement_group(self.pg)
            raise TimeoutError("placement group of %d GPU bundles (%s) not ready" % (world_size, self.strategy))
        self.workers = [
            StandInWorker.options(
                name=worker_name(model, i), scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, i)
            ).remote(i, model)
            for i in range(world_size)
        ]
        self.infos = ray.get([w.info.remote() for w in self.workers], timeout=pg_timeout)

    def alive(self, timeout=5.0):
        try:
            ray.get([w.info.remote() for w in self.workers], timeout=timeout)
        except Exception:  # any failure of a rank means the engine is dead
            return False
        return True

    def generate(self, prompt, max_tokens, timeout=30.0):
        return ray.get([w.generate.remote(prompt, max_tokens) for w in self.workers], timeout=timeout)


class LocalEngine:
    """World size 1 without Ray (the mp/uni backends)."""

    def __init__(self, model):
        self.strategy = None
        node = os.environ.get("VLLM_STANDIN_NODE_NAME") or socket.gethostname()
        self.infos = [{"rank": 0, "node": node, "ip": "127.0.0.1", "gpu_ids": []}]

    def alive(self, timeout=5.0):
        return True

    def generate(self, prompt, max_tokens, timeout=30.0):
        text = "rank 0 on %s" % self.infos[0]["node"]
        return [{"text": text, "tokens": min(max_tokens, 8), "prompt_tokens": len(prompt.split())}]


def make_engine(model, backend, world_size):
    pg_timeout = float(os.environ.get("VLLM_STANDIN_PG_TIMEOUT", "60"))
    if backend == "ray" or world_size > 1:
        return RayEngine(model, world_size, pg_timeout)
    return LocalEngine(model)


def load_delay():
    """The configurable model-load time (VLLM_STANDIN_LOAD_DELAY seconds)."""
    time.sleep(float(os.environ.get("VLLM_STANDIN_LOAD_DELAY", "0")))
