"""Run inside the `speculators` 0.9.0 venv (not the project's): every ``hs_<i>.safetensors`` of a
folder passes speculators' own offline check (`check_hidden_states`: its keys, ids equal the dataset's,
shapes, finite values) against the dataset's ids, and their corrupt-file scan finds none.
Usage: python PROBE FOLDER IDS_JSON OUT_JSON (IDS_JSON: the dataset's rows' ids, row i for hs_i)."""

import json
import sys
from pathlib import Path

from safetensors.torch import load_file
from speculators.data_generation.offline import (
    check_hidden_states,
    find_corrupt_hidden_state_indices,
    get_existing_hidden_state_indices,
)


def main(folder: str, ids_json: str, out: str) -> None:
    rows = json.loads(Path(ids_json).read_text())
    path = Path(folder)
    found = get_existing_hidden_state_indices(path)
    corrupt = find_corrupt_hidden_state_indices(path, found)
    passed, failed = 0, {}
    for i in found:
        try:
            check_hidden_states(load_file(str(path / f"hs_{i}.safetensors")), rows[i])
            passed += 1
        except ValueError as e:
            failed[i] = str(e)[:200]
    Path(out).write_text(json.dumps({"found": found, "corrupt": corrupt, "passed": passed, "failed": failed}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
