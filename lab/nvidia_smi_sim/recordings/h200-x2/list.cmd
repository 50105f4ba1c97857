nvidia-smi -L
