#!/bin/sh
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Record, read-only, every nvidia-smi query the collection and the simulator use, into DIR.
# Never sets anything: no -pm, -lgc, -rgc, -ac, -pl, -r. Usage: record.sh DIR
set -u
dir=${1:?usage: record.sh DIR}
mkdir -p "$dir"
export LC_ALL=C
q() { # q NAME ARGS... : stdout, stderr and exit status of one query
  name=$1; shift
  nvidia-smi "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  echo "$?" >"$dir/$name.rc"
  printf '%s\n' "nvidia-smi $*" >"$dir/$name.cmd"
}
GPU_FIELDS=index,uuid,name,pci.bus_id,driver_version,persistence_mode,pstate,clocks.gr,clocks.sm,clocks.mem,clocks.max.gr,clocks.max.mem,memory.total,memory.used,compute_cap,addressing_mode
q version --version
q list -L
q table
q query -q
q query_xml -q -x
q query_clock -q -d CLOCK
q query_performance -q -d PERFORMANCE
q query_supported_clocks -q -d SUPPORTED_CLOCKS
q topo topo -m
q help --help
q help_query_gpu --help-query-gpu
q gpus --query-gpu=$GPU_FIELDS --format=csv,noheader,nounits
q gpus_header --query-gpu=$GPU_FIELDS --format=csv
q gpus_i0 -i 0 --query-gpu=$GPU_FIELDS --format=csv,noheader,nounits
q gpus_bad_index -i 7 --query-gpu=index --format=csv,noheader,nounits
q gpus_bad_field --query-gpu=index,no_such_field --format=csv,noheader,nounits
q supported_clocks --query-supported-clocks=gpu_uuid,memory,graphics --format=csv,noheader,nounits
# One field at a time, so a field this driver lacks shows up by name.
for f in $(echo "$GPU_FIELDS" | tr , ' ') clocks_event_reasons.active \
  clocks_event_reasons.applications_clocks_setting clocks.applications.graphics clocks.default_applications.graphics \
  power.draw power.limit temperature.gpu; do
  {
    printf '%s: ' "$f"
    nvidia-smi --query-gpu="$f" --format=csv,noheader,nounits 2>&1 | tr '\n' ' '
    echo
  } >>"$dir/fields.txt"
done
uname -a >"$dir/uname.txt"
