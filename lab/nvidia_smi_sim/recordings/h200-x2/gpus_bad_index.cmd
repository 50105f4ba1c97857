nvidia-smi -i 7 --query-gpu=index --format=csv,noheader,nounits
