"""Files made to run code when read (issue 48): a pickle whose object, when unpickled, creates a folder.
Tests plant one where DraftDeck reads a file and assert the folder never appears and the error names
the file."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any


class Payload:
    """Unpickled, it calls os.mkdir(marker): harmless, and visible."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (self.marker,)


def plant_torch(path: Path, marker: Path, **beside: Any) -> Path:
    """A PyTorch file (torch.save's zip) whose "payload" entry runs os.mkdir when fully unpickled."""
    import torch

    torch.save({**beside, "payload": Payload(marker)}, path)
    return path


def plant_pickle(path: Path, marker: Path) -> Path:
    path.write_bytes(pickle.dumps(Payload(marker)))
    return path
