nvidia-smi --query-supported-clocks=gpu_uuid,memory,graphics --format=csv,noheader,nounits
