"""Helpers for module unit tests: run a module's main() with arguments, capture its result."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


class ModuleExit(Exception):
    """main() called exit_json."""


class ModuleFail(Exception):
    """main() called fail_json."""


def fixture_text(*parts):
    with open(os.path.join(FIXTURES, *parts), encoding="utf-8") as handle:
        return handle.read()


def run_module(monkeypatch, module, args):
    """Run module.main() with args; return (failed, result dict)."""

    def _exit(self, **kwargs):
        raise ModuleExit(kwargs)

    def _fail(self, **kwargs):
        kwargs["failed"] = True
        raise ModuleFail(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail)
    with patch_module_args(args):
        try:
            module.main()
        except ModuleExit as exc:
            return False, exc.args[0]
        except ModuleFail as exc:
            return True, exc.args[0]
    pytest.fail("module returned without exit_json or fail_json")
    return None  # pragma: no cover


def dumps(value):
    return json.dumps(value, sort_keys=True)
