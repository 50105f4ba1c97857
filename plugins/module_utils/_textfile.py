# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small text files a module owns whole (netplan documents, env files) (private)."""

from __future__ import annotations

import os
import stat
import tempfile


def read_text(path):
    """The file's text, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def file_mode(path):
    """The permission bits as a quoted octal string ('0600'), or None when there is no file."""
    try:
        return "%04o" % stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def write_text(module, path, text, mode):
    """Replace path with text atomically; the content never exists with looser permissions."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    handle, temp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        os.fchmod(handle, int(mode, 8))
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        module.atomic_move(temp, path)
        os.chmod(path, int(mode, 8))
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
