nvidia-smi --version
