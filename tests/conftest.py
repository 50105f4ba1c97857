"""Make the collection importable as ansible_collections.dgx_spark.vllm for pytest."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLLECTIONS = os.path.join(_ROOT, "build", "collections")
_LINK = os.path.join(_COLLECTIONS, "ansible_collections", "dgx_spark", "vllm")

if not os.path.lexists(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(_ROOT, _LINK)
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
