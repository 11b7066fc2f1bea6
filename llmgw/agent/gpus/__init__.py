"""GPU discovery: NVML (`nvml.py`) or `nvidia-smi` (`smi.py`) read into one shape of card facts,
turned into the inventory's `Gpu` entries by one pure rule (`facts.py`); `probe.py` picks the path.

Both paths produce `MachineFacts`; only `facts.to_gpus` decides indexes, classes, MIG expansion,
health and placeability, so the same machine gives the same inventory whichever path read it.
"""
