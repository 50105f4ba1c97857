"""plan_key: one digest that moves with any node's stage settings, address or groups, and with the collection."""

from __future__ import annotations

import sys

import pytest
from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader
from ansible.template import Templar
from ansible_collections.dgx_spark.vllm.plugins.plugin_utils import _digest

STAGES = ("fabric", "model")


class Undefined(dict):
    """A host's variables where one raises as a template naming a role default not loaded yet does."""

    def __getitem__(self, name):
        if name == "fabric_env_file":
            raise AnsibleUndefinedVariable("'fabric_defaults' is undefined")
        return super().__getitem__(name)


def hosts(**over):
    base = {
        "spark-1": {"inventory_hostname": "spark-1", "ansible_host": "198.18.100.11", "fabric_mtu": 9000},
        "spark-2": {"inventory_hostname": "spark-2", "ansible_host": "198.18.100.12", "fabric_mtu": 9000},
    }
    for host, values in over.items():
        base[host.replace("_", "-")] = dict(base[host.replace("_", "-")], **values)
    return base


def key(hostvars, extra=None, stages=STAGES):
    loader = DataLoader()
    lookup = lookup_loader.get("dgx_spark.vllm.plan_key", loader=loader, templar=Templar(loader=loader))
    return lookup.run(list(stages), variables={"hostvars": hostvars}, hosts=list(hostvars), extra=extra)[0]


def test_same_settings_same_key_in_any_host_order():
    first = key(hosts())
    assert len(first) == 64 and first == key(dict(reversed(list(hosts().items()))))


@pytest.mark.parametrize(
    "over",
    [
        {"spark_2": {"fabric_mtu": 1500}},  # a stage setting of another node
        {"spark_1": {"cluster_gpus_per_node": 2}},  # a shared setting
        {"spark_1": {"deploy_stage_record_path": "/srv/stages.json"}},  # the deploy's own
        {"spark_2": {"ansible_host": "198.18.100.13"}},  # where a node is
        {"spark_1": {"group_names": ["spark", "spark_head"]}},  # what it belongs to
    ],
)
def test_any_node_setting_moves_it(over):
    assert key(hosts(**over)) != key(hosts())


def test_other_variables_and_tokens_do_not_move_it():
    base = key(hosts())
    assert key(hosts(spark_1={"model_hf_token": "hf_x", "unrelated": 1, "ansible_verbosity": 3})) == base
    # A variable with another stage's prefix counts only when that stage is in the plan.
    assert key(hosts(spark_1={"vllm_server_port": 9000})) == base
    assert key(hosts(spark_1={"vllm_server_port": 9000}), stages=[*STAGES, "vllm_server"]) != key(
        hosts(), stages=[*STAGES, "vllm_server"]
    )


def test_extra_and_the_collection_code_move_it(monkeypatch, tmp_path):
    base = key(hosts())
    assert key(hosts(), extra=["context-digest"]) != base
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "deploy.yml").write_text("- hosts: all\n")
    loader = DataLoader()
    plugin = lookup_loader.get("dgx_spark.vllm.plan_key", loader=loader, templar=Templar(loader=loader))
    monkeypatch.setattr(sys.modules[type(plugin).__module__], "COLLECTION_ROOT", str(tmp_path))
    moved = key(hosts())
    assert moved != base
    (tmp_path / "playbooks" / "deploy.yml").write_text("- hosts: spark\n")
    assert key(hosts()) != moved


def test_a_variable_that_does_not_template_counts_by_its_error():
    with_error = hosts()
    with_error["spark-1"] = Undefined(with_error["spark-1"], fabric_env_file="{{ fabric_defaults }}")
    assert key(with_error) == key(with_error) != key(hosts())


def test_no_stage_is_refused():
    with pytest.raises(AnsibleError, match="give the stage names"):
        key(hosts(), stages=[])


def test_tree_digest_moves_with_names_and_contents(tmp_path):
    assert _digest.tree_digest("") == ""
    (tmp_path / "a").write_text("1")
    first = _digest.tree_digest(str(tmp_path))
    (tmp_path / "a").write_text("2")
    second = _digest.tree_digest(str(tmp_path))
    (tmp_path / "a").rename(tmp_path / "b")
    assert len({first, second, _digest.tree_digest(str(tmp_path))}) == 3
