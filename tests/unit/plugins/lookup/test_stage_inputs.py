"""stage_inputs: the digest moves with the stage's settings and its role's tasks, not with others or tokens."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader
from ansible.template import Templar, trust_as_template


@pytest.fixture
def role(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "main.yml").write_text("- ansible.builtin.debug: {msg: one}\n")
    return tmp_path


def digest(role, extra=None, **variables):
    loader = DataLoader()
    lookup = lookup_loader.get("dgx_spark.vllm.stage_inputs", loader=loader, templar=Templar(loader=loader))
    variables = dict(variables, role_path=str(role))
    kwargs = {} if extra is None else {"extra": extra}
    return lookup.run(["fabric"], variables=variables, **kwargs)[0]


def test_same_settings_same_digest(role):
    first = digest(role, fabric_mtu=9000, fabric_interfaces=[{"name": "a"}])
    assert first == digest(role, fabric_mtu=9000, fabric_interfaces=[{"name": "a"}])
    assert len(first) == 64


def test_the_stage_settings_the_tasks_and_extra_move_it(role):
    base = digest(role, fabric_mtu=9000)
    assert digest(role, fabric_mtu=1500) != base
    assert digest(role, fabric_mtu=9000, extra=["spark-2"]) != base
    (role / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: two}\n")
    assert digest(role, fabric_mtu=9000) != base


def test_the_roles_templates_and_files_move_it(role):
    # What the role writes from: a changed rule or config template must run the stage.
    (role / "templates").mkdir()
    (role / "templates" / "rules.yml.j2").write_text("groups: []\n")
    base = digest(role, fabric_mtu=9000)
    (role / "templates" / "rules.yml.j2").write_text("groups: [x]\n")
    edited = digest(role, fabric_mtu=9000)
    assert edited != base
    (role / "files" / "sub").mkdir(parents=True)
    (role / "files" / "sub" / "Dockerfile").write_text("FROM a\n")
    assert digest(role, fabric_mtu=9000) != edited


def test_the_shared_cluster_settings_move_it(role):
    base = digest(role, fabric_mtu=9000, cluster_peer_user="root")
    assert digest(role, fabric_mtu=9000, cluster_peer_user="spark") != base


def test_other_stages_and_tokens_do_not(role):
    base = digest(role, fabric_mtu=9000)
    assert digest(role, fabric_mtu=9000, model_path="/x", fabric_hf_token="hf_" + "x" * 8) == base


def test_templated_values_are_hashed_as_templated(role):
    # Inventory and role defaults are trusted templates; a literal string would not be templated.
    assert digest(role, fabric_mtu=trust_as_template("{{ 4500 * 2 }}")) == digest(role, fabric_mtu=9000)


def test_outside_a_role_is_refused(role):
    loader = DataLoader()
    lookup = lookup_loader.get("dgx_spark.vllm.stage_inputs", loader=loader, templar=Templar(loader=loader))
    with pytest.raises(AnsibleError, match="inside the stage's role"):
        lookup.run(["fabric"], variables={"fabric_mtu": 9000})
