"""The model mirror: model files kept by the control planes for air-gapped fleets (docs/mirror.md).
inspect.py reads and validates a file before the mirror accepts it (`inspect_file`, `inspect_dir`); blobs.py
is each control plane's store of verified files by sha256, with resumable uploads; sync.py pulls what a
member lacks from the leader.
"""
