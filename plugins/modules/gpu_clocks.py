#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_clocks
short_description: GPU persistence mode and locked graphics clocks, kept across reboot
description:
  - Turns persistence mode on or off and locks the graphics clock to a range
    (C(nvidia-smi -lgc MIN,MAX)) or resets it (C(nvidia-smi -rgc)), on every GPU or the ones named.
  - The driver forgets both at reboot, so the module writes a systemd oneshot unit that reapplies
    them at boot and enables it (a C(multi-user.target.wants) link). When systemd is not PID 1
    (a container), the unit is written and reported, and no C(systemctl) is run.
  - nvidia-smi cannot report a locked clock range, so the module records what it applied in
    O(state_file) together with the boot id; after a reboot the unit renews that record.
  - C(changed) is decided by reading the state back after acting, never assumed.
  - Bad input (O(min_mhz) above O(max_mhz), an unknown GPU index, a clock outside what the GPU
    supports) fails before anything is changed.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes.STATEFUL
options:
  gpus:
    description:
      - Indices of the GPUs to manage, as nvidia-smi numbers them. All GPUs when omitted.
    type: list
    elements: int
  persistence_mode:
    description:
      - Persistence mode wanted. Left as it is when omitted.
    type: bool
  clocks:
    description:
      - C(locked) locks the graphics clock to O(min_mhz)..O(max_mhz); C(reset) removes a lock this
        module applied; C(unmanaged) leaves clocks alone.
    type: str
    choices: [locked, reset, unmanaged]
    default: unmanaged
  min_mhz:
    description:
      - Lowest graphics clock in MHz. Required when O(clocks=locked).
    type: int
  max_mhz:
    description:
      - Highest graphics clock in MHz. Required when O(clocks=locked).
    type: int
  persist:
    description:
      - Keep the settings across reboot with a systemd unit at O(unit_path). The unit reapplies persistence
        mode when O(persistence_mode=true), and the clock lock in force after the run.
      - When false, or when there is nothing to reapply, the unit is removed.
    type: bool
    default: true
  unit_path:
    description:
      - Path of the systemd unit the module owns.
    type: path
    default: /etc/systemd/system/dgx-spark-gpu-clocks.service
  state_file:
    description:
      - Where the module records the clock locks it applied (nvidia-smi cannot report them).
    type: path
    default: /var/lib/dgx-spark/gpu-clocks.json
  nvidia_smi:
    description:
      - Path of the nvidia-smi executable. By default it is looked up on E(PATH).
    type: path
notes:
  - A clock lock set outside this module (a shell C(nvidia-smi -lgc)) is invisible to it.
  - Needs root on the node (C(become)).
"""

EXAMPLES = r"""
- name: Persistence on and graphics clocks locked, kept across reboot
  dgx_spark.vllm.gpu_clocks:
    persistence_mode: true
    clocks: locked
    min_mhz: 1000
    max_mhz: 1980
  become: true

- name: Remove the lock again
  dgx_spark.vllm.gpu_clocks:
    clocks: reset
  become: true
"""

RETURN = r"""
gpus:
  description: Each managed GPU as read back after acting (in check mode, as it would be).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
    uuid:
      description: GPU UUID.
      type: str
    persistence_mode:
      description: Whether persistence mode is on.
      type: bool
    locked_clocks:
      description: The graphics clock range this module locked in this boot, or null.
      type: dict
      sample: {"min_mhz": 1000, "max_mhz": 1980}
    clocks_gr:
      description: Graphics clock nvidia-smi reads now, MHz (an observation, not the lock).
      type: int
bad_param:
  description: The parameter a refused input names (C(min_mhz), C(max_mhz) or C(gpus)), for callers that name their own.
  returned: when a setting is outside what the GPUs allow
  type: str
limit:
  description: The GPU's limit that O(min_mhz) or O(max_mhz) passed (MHz), or the GPU indices there are.
  returned: when a setting is outside what the GPUs allow
  type: raw
gpu:
  description: Index of the GPU whose limit was passed.
  returned: when O(min_mhz) or O(max_mhz) is outside what a GPU allows
  type: int
commands:
  description: The nvidia-smi commands run (in check mode, the ones that would be run).
  returned: always
  type: list
  elements: str
  sample: ["nvidia-smi -i 0 -lgc 1000,1980"]
unit_path:
  description: Path of the boot unit.
  returned: always
  type: str
unit_present:
  description: Whether the boot unit exists after the run.
  returned: always
  type: bool
unit_enabled:
  description: Whether the unit is linked into C(multi-user.target.wants).
  returned: always
  type: bool
systemd_running:
  description: Whether systemd is PID 1 here; when false, C(systemctl daemon-reload) was not run.
  returned: always
  type: bool
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nvidia_smi import (
    NvidiaSmi,
    NvidiaSmiError,
    read_boot_id,
    render_unit,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import read_text, write_text


class GpuClocks:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.smi = NvidiaSmi(module, self.params["nvidia_smi"])
        self.marker_path = self.params["state_file"] + ".boot"
        self.wants_link = os.path.join(
            os.path.dirname(self.params["unit_path"]),
            "multi-user.target.wants",
            os.path.basename(self.params["unit_path"]),
        )
        self.commands = []

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, commands=self.commands, **extra)

    # -- reading ---------------------------------------------------------------------------
    def records(self):
        """Clock locks recorded in this boot, by UUID ({} after a reboot or when none)."""
        text = read_text(self.params["state_file"])
        marker = (read_text(self.marker_path) or "").strip()
        if not text or not marker or marker != read_boot_id():
            return {}
        try:
            return json.loads(text).get("gpus", {})
        except ValueError:
            return {}

    def read_state(self, selected):
        try:
            gpus = {gpu["index"]: gpu for gpu in self.smi.query_gpus()}
        except NvidiaSmiError as exc:
            self.fail(str(exc))
        records = self.records()
        state = []
        for index in selected:
            gpu = gpus[index]
            state.append(
                dict(
                    index=index,
                    uuid=gpu["uuid"],
                    persistence_mode=gpu["persistence_mode"],
                    locked_clocks=records.get(gpu["uuid"]),
                    clocks_gr=gpu["clocks_gr"],
                )
            )
        return state

    # -- validating ------------------------------------------------------------------------
    def select(self):
        if not self.smi.present:
            self.fail("nvidia-smi is not installed on this node; gpu_clocks needs an NVIDIA driver")
        try:
            gpus = self.smi.query_gpus()
        except NvidiaSmiError as exc:
            self.fail(str(exc))
        if not gpus:
            self.fail("nvidia-smi lists no GPU on this node; nothing to manage")
        known = sorted(gpu["index"] for gpu in gpus)
        wanted = self.params["gpus"] if self.params["gpus"] is not None else known
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            self.fail(
                "gpus: no GPU with index %s on this node; it has %s" % (", ".join(map(str, unknown)), known),
                bad_param="gpus",
                limit=known,
            )
        if self.params["clocks"] == "locked":
            self.check_range({gpu["index"]: gpu for gpu in gpus}, sorted(set(wanted)))
        return sorted(set(wanted))

    def check_range(self, gpus, selected):
        low, high = self.params["min_mhz"], self.params["max_mhz"]
        if low <= 0:
            self.fail("min_mhz must be a positive clock in MHz, got %d" % low)
        if low > high:
            self.fail("min_mhz (%d) is greater than max_mhz (%d); give min_mhz <= max_mhz" % (low, high))
        supported = self.smi.supported_graphics_clocks()
        for index in selected:
            clocks = supported.get(gpus[index]["uuid"])
            floor = clocks[0] if clocks else None
            ceiling = clocks[-1] if clocks else gpus[index]["clocks_max_gr"]
            if floor is not None and low < floor:
                self.fail(
                    "min_mhz (%d) is below the lowest graphics clock GPU %d supports (%d MHz)" % (low, index, floor),
                    bad_param="min_mhz",
                    limit=floor,
                    gpu=index,
                )
            if ceiling is not None and high > ceiling:
                self.fail(
                    "max_mhz (%d) is above the highest graphics clock GPU %d supports (%d MHz)"
                    % (high, index, ceiling),
                    bad_param="max_mhz",
                    limit=ceiling,
                    gpu=index,
                )

    # -- planning --------------------------------------------------------------------------
    def plan(self, before):
        after = []
        for gpu in before:
            want = dict(gpu)
            if self.params["persistence_mode"] is not None:
                want["persistence_mode"] = self.params["persistence_mode"]
            if self.params["clocks"] == "locked":
                want["locked_clocks"] = dict(min_mhz=self.params["min_mhz"], max_mhz=self.params["max_mhz"])
            elif self.params["clocks"] == "reset":
                want["locked_clocks"] = None
            after.append(want)
        return after

    def unit_text(self, gpus):
        if not self.params["persist"]:
            return None
        # Persistence is reapplied only when asked for; the clock lock whenever one is in force.
        boot = [
            dict(
                uuid=gpu["uuid"],
                persistence_mode=self.params["persistence_mode"] is True,
                locked_clocks=gpu["locked_clocks"],
            )
            for gpu in gpus
        ]
        return render_unit(self.smi.path, boot, self.marker_path)

    @staticmethod
    def comparable(gpus, unit, enabled):
        # clocks_gr is an observation that moves on its own: it never decides "changed".
        return dict(
            gpus=[{k: v for k, v in gpu.items() if k != "clocks_gr"} for gpu in gpus],
            unit=unit or "",
            unit_enabled=enabled,
        )

    # -- acting ----------------------------------------------------------------------------
    def apply_gpu(self, have, want):
        try:
            if have["persistence_mode"] != want["persistence_mode"]:
                self.commands.append("nvidia-smi -i %d -pm %d" % (want["index"], int(want["persistence_mode"])))
                if not self.module.check_mode:
                    self.smi.set_persistence(want["index"], want["persistence_mode"])
            if have["locked_clocks"] != want["locked_clocks"]:
                if want["locked_clocks"]:
                    lock = want["locked_clocks"]
                    self.commands.append(
                        "nvidia-smi -i %d -lgc %d,%d" % (want["index"], lock["min_mhz"], lock["max_mhz"])
                    )
                    if not self.module.check_mode:
                        self.smi.lock_graphics_clocks(want["index"], lock["min_mhz"], lock["max_mhz"])
                else:
                    self.commands.append("nvidia-smi -i %d -rgc" % want["index"])
                    if not self.module.check_mode:
                        self.smi.reset_graphics_clocks(want["index"])
        except NvidiaSmiError as exc:
            self.fail("GPU %d: %s" % (want["index"], exc))

    def write_records(self, after):
        records = {}
        text = read_text(self.params["state_file"])
        if text:
            try:
                records = json.loads(text).get("gpus", {})
            except ValueError:
                records = {}
        for gpu in after:
            records.pop(gpu["uuid"], None)
            if gpu["locked_clocks"]:
                records[gpu["uuid"]] = gpu["locked_clocks"]
        write_text(
            self.module,
            self.params["state_file"],
            json.dumps({"gpus": records}, indent=2, sort_keys=True) + "\n",
            "0644",
        )
        write_text(self.module, self.marker_path, (read_boot_id() or "") + "\n", "0644")

    def apply_unit(self, unit):
        path = self.params["unit_path"]
        if unit is None:
            for stale in (self.wants_link, path):
                if os.path.lexists(stale):
                    os.remove(stale)
        else:
            if read_text(path) != unit:
                write_text(self.module, path, unit, "0644")
            if os.path.realpath(self.wants_link) != os.path.realpath(path) or not os.path.lexists(self.wants_link):
                if os.path.lexists(self.wants_link):
                    os.remove(self.wants_link)
                os.makedirs(os.path.dirname(self.wants_link), exist_ok=True)
                os.symlink(path, self.wants_link)
        if systemd_running():
            systemctl = self.module.get_bin_path("systemctl", required=True)
            self.module.run_command([systemctl, "daemon-reload"], check_rc=True)

    def run(self):
        selected = self.select()
        before = self.read_state(selected)
        unit_before = read_text(self.params["unit_path"])
        enabled_before = os.path.lexists(self.wants_link)
        planned = self.plan(before)
        unit_planned = self.unit_text(planned)
        for have, want in zip(before, planned):
            self.apply_gpu(have, want)
        old = self.comparable(before, unit_before, enabled_before)
        new = self.comparable(planned, unit_planned, unit_planned is not None)
        if self.module.check_mode:
            after, unit_after, enabled_after = planned, unit_planned, unit_planned is not None
        else:
            if any(a["locked_clocks"] != b["locked_clocks"] for a, b in zip(before, planned)):
                self.write_records(planned)
            if old["unit"] != new["unit"] or old["unit_enabled"] != new["unit_enabled"]:
                self.apply_unit(unit_planned)
            after = self.read_state(selected)
            unit_after = read_text(self.params["unit_path"])
            enabled_after = os.path.lexists(self.wants_link)
            new = self.comparable(after, unit_after, enabled_after)
            wanted = self.comparable(planned, unit_planned, unit_planned is not None)
            if new != wanted:
                self.fail(
                    "read back after acting differs from the plan: wanted %s, read %s"
                    % (json.dumps(wanted["gpus"]), json.dumps(new["gpus"]))
                )
        result = dict(
            changed=old != new,
            gpus=after,
            commands=self.commands,
            unit_path=self.params["unit_path"],
            unit_present=unit_after is not None,
            unit_enabled=enabled_after,
            systemd_running=systemd_running(),
        )
        if self.module._diff:
            result["diff"] = dict(before=old, after=new)
        return result


def systemd_running():
    return os.path.isdir("/run/systemd/system")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="int"),
            persistence_mode=dict(type="bool"),
            clocks=dict(type="str", choices=["locked", "reset", "unmanaged"], default="unmanaged"),
            min_mhz=dict(type="int"),
            max_mhz=dict(type="int"),
            persist=dict(type="bool", default=True),
            unit_path=dict(type="path", default="/etc/systemd/system/dgx-spark-gpu-clocks.service"),
            state_file=dict(type="path", default="/var/lib/dgx-spark/gpu-clocks.json"),
            nvidia_smi=dict(type="path"),
        ),
        required_if=[("clocks", "locked", ("min_mhz", "max_mhz"))],
        supports_check_mode=True,
    )
    module.exit_json(**GpuClocks(module).run())


if __name__ == "__main__":
    main()
