"""Each role's meta/argument_specs.yml against its defaults/main.yml and against the entry points called.

- Every variable in defaults/main.yml is an option of the `main` entry point, and the option's
  `default` is the same YAML value (templated strings compare as text; no templating here; a spec
  without a default means null).
- An option that states a `default` in any entry point has that variable in defaults/main.yml (role
  argument validation never sets a default: a default only in the spec would be documentation only).
- Every entry point a playbook or role calls with `tasks_from:` has an argument spec entry point of
  that name, and its options are options of `main` with the same definition (the same variables,
  validated the same way, whichever way the role is entered).
- Every role variable (`<role>_*`, an option of `main`) that a non-main entry point's task files name
  is validated by that entry point.
"""

import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, "roles", "*", "tasks")))
# Where a role may be entered with tasks_from: (the Molecule scenarios enter roles too).
CALLERS = [
    "playbooks/*.yml",
    "playbooks/tasks/*.yml",
    "roles/*/tasks/*.yml",
    "deploy-qwen35.yml",
    "extensions/molecule/*/*.yml",
]
INCLUDE_ROLE = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
INCLUDE_TASKS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")
COLLECTION = "dgx_spark.vllm."


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def defaults(role):
    path = os.path.join(ROOT, "roles", role, "defaults", "main.yml")
    return (load(path) or {}) if os.path.exists(path) else {}


def specs(role):
    path = os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")
    return load(path)["argument_specs"] if os.path.exists(path) else {}


def tasks_of(node):
    """Every task dict in a play or task list, blocks and rescue/always included."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_of(item)
    elif isinstance(node, dict):
        if any(key in node for key in ("hosts", "import_playbook", "ansible.builtin.import_playbook")):
            for section in ("pre_tasks", "roles", "tasks", "post_tasks", "handlers"):
                yield from tasks_of(node.get(section) or [])
            return
        yield node
        for section in ("block", "rescue", "always"):
            yield from tasks_of(node.get(section) or [])


def role_names(task, play_vars, name):
    """The roles a role include names: literal, or `dgx_spark.vllm.{{ item }}` over a known list."""
    name = name.removeprefix(COLLECTION)
    if "{{" not in name:
        return [name]
    if re.fullmatch(r"\{\{\s*item\s*\}\}", name):
        loop = task.get("loop", task.get("with_items"))
        if isinstance(loop, str):
            var = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", loop.strip())
            loop = play_vars.get(var.group(1)) if var else None
        if isinstance(loop, list) and all(isinstance(item, str) for item in loop):
            return loop
    return None


def calls():
    """(caller, role or None when it cannot be told, entry point) for every tasks_from: in the callers."""
    found = []
    for pattern in CALLERS:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            data = load(path)
            plays = data if isinstance(data, list) else []
            # A task file (playbooks/tasks, a role's tasks) read as the tasks of one play.
            is_playbook = any(isinstance(p, dict) and "hosts" in p for p in plays)
            for play in plays if is_playbook else [{"hosts": None, "tasks": plays}]:
                play_vars = play.get("vars") or {} if isinstance(play, dict) else {}
                for task in tasks_of(play):
                    for key in INCLUDE_ROLE:
                        args = task.get(key)
                        if isinstance(args, dict) and args.get("tasks_from"):
                            entry = os.path.splitext(args["tasks_from"])[0]
                            names = role_names(task, play_vars, str(args.get("name", "")))
                            rel = os.path.relpath(path, ROOT)
                            if names is None:
                                # A name we cannot resolve: every role that has this task file.
                                names = [r for r in ROLES if os.path.exists(task_file(r, entry))]
                            found.extend((rel, name, entry) for name in names)
    return found


def task_file(role, entry):
    return os.path.join(ROOT, "roles", role, "tasks", entry + ".yml")


def role_vars_named(role, entry, seen=None):
    """The `<role>_*` names an entry point's task files mention, following static include/import_tasks."""
    seen = set() if seen is None else seen
    path = task_file(role, entry)
    if path in seen or not os.path.exists(path):
        return set()
    seen.add(path)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    names = set(re.findall(r"\b%s_[a-z0-9_]+" % re.escape(role), text))
    for task in tasks_of(yaml.safe_load(text) or []):
        for key in INCLUDE_TASKS:
            target = task.get(key)
            target = target.get("file") if isinstance(target, dict) else target
            if isinstance(target, str) and "{{" not in target:
                names |= role_vars_named(role, os.path.splitext(target)[0], seen)
    return names


CALLS = calls()


def test_the_callers_are_found():
    # The deploy enters every node stage with tasks_from: stage and two roles with tasks_from: checks.
    entries = {(role, entry) for _caller, role, entry in CALLS}
    assert ("preflight", "stage") in entries
    assert ("vllm_server", "checks") in entries


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_a_main_option_with_the_same_default(role):
    main = (specs(role).get("main") or {}).get("options") or {}
    problems = []
    for name, value in defaults(role).items():
        if name not in main:
            problems.append("%s: in defaults/main.yml, not an option of the main entry point" % name)
        elif main[name].get("default") != value:
            # No default in a spec means null, as in defaults/main.yml.
            problems.append(
                "%s: the spec's default %r, defaults/main.yml %r" % (name, main[name].get("default"), value)
            )
    assert not problems, "roles/%s:\n  " % role + "\n  ".join(problems)


@pytest.mark.parametrize("role", ROLES)
def test_no_spec_default_without_a_role_default(role):
    role_defaults = defaults(role)
    problems = [
        "%s entry point, option %s: a default in the spec only (add it to defaults/main.yml or drop it)" % (entry, name)
        for entry, spec in specs(role).items()
        for name, option in (spec.get("options") or {}).items()
        if "default" in option and name not in role_defaults
    ]
    assert not problems, "roles/%s:\n  " % role + "\n  ".join(problems)


@pytest.mark.parametrize(("caller", "role", "entry"), CALLS, ids=["%s:%s" % (c[1], c[2]) for c in CALLS])
def test_every_called_entry_point_has_a_spec(caller, role, entry):
    assert os.path.exists(task_file(role, entry)), "%s calls %s with tasks_from: %s; no such file" % (
        caller,
        role,
        entry,
    )
    role_specs = specs(role)
    assert entry in role_specs, (
        "%s calls roles/%s with tasks_from: %s; meta/argument_specs.yml has no %s entry point"
        % (
            caller,
            role,
            entry,
            entry,
        )
    )
    main = role_specs["main"].get("options") or {}
    options = role_specs[entry].get("options") or {}
    for name, option in options.items():
        assert name in main, "roles/%s entry point %s: option %s is not an option of main" % (role, entry, name)
        assert option == main[name], "roles/%s entry point %s: option %s is defined otherwise than in main" % (
            role,
            entry,
            name,
        )
    missed = sorted(role_vars_named(role, entry) & set(main) - set(options))
    assert not missed, "roles/%s entry point %s: tasks/%s.yml reads %s, which it does not validate" % (
        role,
        entry,
        entry,
        ", ".join(missed),
    )
