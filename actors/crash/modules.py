"""Which .ko files under a directory `load_module_debuginfo` hands to crash and drgn.

Bounded and policy-checked: the walk never follows a link (a `.ko` symlink in an allowed directory may
point anywhere), stops after MAX_ENTRIES directory entries, and keeps at most MAX_FILES modules, the
same list for crash and drgn. A name crash would not read as one plain word is left out. Everything
left out is counted and said, never silently dropped.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILES = 100
MAX_ENTRIES = 20000
# crash reads its command line's words itself: a path with a blank or a shell character is not one word.
PLAIN_PATH = re.compile(r"[^\s|<>!;&$`'\"\\]+")


@dataclass
class ModuleFiles:
    files: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many
    entries_seen: int = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def notes(self) -> list[str]:
        return [f"{count} left out: {why}" for why, count in sorted(self.skipped.items())]


def is_module(name: str) -> bool:
    return name.endswith((".ko", ".ko.xz", ".ko.gz", ".ko.zst", ".ko.debug"))


def find(root: Path, *, max_files: int = MAX_FILES, max_entries: int = MAX_ENTRIES) -> ModuleFiles:
    """The module files under `root` (resolved and checked by the caller), sorted, within the bounds."""
    found = ModuleFiles()
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            found.entries_seen += 1
            if found.entries_seen > max_entries:
                found.skip(f"the walk stopped after {max_entries} entries")
                return found
            if not is_module(name):
                continue
            path = os.path.join(top, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                found.skip("unreadable")
                continue
            if stat.S_ISLNK(mode):
                found.skip("symbolic links (they may point outside the allowed directories)")
            elif not stat.S_ISREG(mode):
                found.skip("not regular files")
            elif not PLAIN_PATH.fullmatch(path):
                found.skip("names with blanks or shell characters (crash reads its command line itself)")
            elif len(found.files) >= max_files:
                found.skip(f"more than {max_files} modules")
            else:
                found.files.append(path)
    return found
