nvidia-smi topo -m
