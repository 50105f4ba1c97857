nvidia-smi --help-query-gpu
