"""The model mirror on the control planes: the blob store (`blobs.py`) of verified files by sha256, and uploads."""
