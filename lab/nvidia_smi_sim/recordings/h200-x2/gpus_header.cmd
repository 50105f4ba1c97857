nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,persistence_mode,pstate,clocks.gr,clocks.sm,clocks.mem,clocks.max.gr,clocks.max.mem,memory.total,memory.used,compute_cap --format=csv
