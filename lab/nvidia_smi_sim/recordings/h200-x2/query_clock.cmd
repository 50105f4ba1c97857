nvidia-smi -q -d CLOCK
