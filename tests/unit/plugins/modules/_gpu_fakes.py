"""A stand-in for nvidia-smi behind AnsibleModule.run_command, answering from recorded output."""

from __future__ import annotations

import os

from ansible.module_utils import basic
from module_runner import FIXTURES, fixture_text

SMI = "/usr/bin/nvidia-smi"


class FakeSmi:
    """Serves recorded --query-gpu rows; -pm edits the persistence column, as the driver would."""

    def __init__(self, profile="h200-x2"):
        self.rows = [row.split(", ") for row in fixture_text("nvidia_smi", profile, "gpus.out").splitlines()]
        self.version = fixture_text("nvidia_smi", profile, "version.out")
        path = os.path.join(FIXTURES, "nvidia_smi", profile, "supported_clocks.out")
        self.supported = fixture_text("nvidia_smi", profile, "supported_clocks.out") if os.path.exists(path) else None
        self.calls = []
        self.answers = {}  # flag -> (rc, out, err), to make one command fail
        self.ignore_pm = False
        self.other = None  # callable for non-nvidia-smi commands

    def changes(self):
        return [c for c in self.calls if {"-pm", "-lgc", "-rgc"} & set(c)]

    def answer(self, args, **kwargs):
        self.calls.append(list(args))
        if args[0] != SMI:
            return self.other(args, **kwargs) if self.other else (0, "", "")
        rest = list(args[1:])
        for flag, reply in self.answers.items():
            if any(part.startswith(flag) for part in rest):
                return reply
        if rest[:1] == ["--version"]:
            return 0, self.version, ""
        index = None
        if rest[:1] == ["-i"]:
            index, rest = rest[1], rest[2:]
        rows = [r for r in self.rows if index is None or r[0] == index]
        if not rows:
            return 6, "No devices were found\n", ""
        if rest[0].startswith("--query-gpu="):
            width = len(rest[0].split("=", 1)[1].split(","))
            return 0, "".join(", ".join(r[:width]) + "\n" for r in rows), ""
        if rest[0].startswith("--query-supported-clocks="):
            return (0, self.supported, "") if self.supported is not None else (2, "Not Supported\n", "")
        if rest[0] == "-pm":
            if not self.ignore_pm:
                rows[0][5] = "Enabled" if rest[1] == "1" else "Disabled"
            return 0, "persistence mode set for GPU %s.\nAll done.\n" % rows[0][3], ""
        if rest[0] in ("-lgc", "-rgc"):
            return 0, "All done.\n", ""
        raise AssertionError("unexpected nvidia-smi call %r" % (args,))

    def install(self, monkeypatch, present=True):
        monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda module, args, **kw: self.answer(args, **kw))

        def bin_path(module, name, required=False, opt_dirs=None):
            if name == "nvidia-smi":
                return SMI if present else None
            return "/usr/bin/" + name

        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", bin_path)
        return self
