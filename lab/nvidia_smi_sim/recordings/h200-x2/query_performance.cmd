nvidia-smi -q -d PERFORMANCE
